"""Helpers shared by the workload modules (jax is imported here)."""

from __future__ import annotations

from typing import Any, Callable

import jax


def platform() -> str:
    """Platform of the default backend: 'cpu', 'gpu' or 'tpu'."""
    return jax.default_backend()


def on_accelerator() -> bool:
    """True on a GPU/TPU backend, where sizes are scaled up so each step
    still takes a measurable amount of device time."""
    return platform() != "cpu"


def pick(cpu: Any, accel: Any) -> Any:
    """Return ``cpu`` on the CPU backend and ``accel`` on GPU/TPU."""
    return accel if on_accelerator() else cpu


def run_steps(setup: Callable[[], Any], step: Callable[[Any, int], Any], steps: int) -> None:
    """Unprofiled driver used by each module's ``run``."""
    state = setup()
    for i in range(steps):
        state = step(state, i)
    jax.block_until_ready(state)
