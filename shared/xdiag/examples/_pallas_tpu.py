"""What the workloads built on JAX's own Pallas TPU kernels share: they run on a TPU only."""

from __future__ import annotations

from xdiag.examples import WorkloadSkipped
from xdiag.examples._common import platform


def require_tpu(kernel: str) -> None:
    """Raise WorkloadSkipped off a TPU: ``kernel`` is a Mosaic kernel (jax.experimental.pallas.ops.tpu)."""
    if platform() != "tpu":
        raise WorkloadSkipped(f"{kernel} is a Mosaic TPU kernel (jax.experimental.pallas.ops.tpu); "
                              f"this backend is {platform()}")
