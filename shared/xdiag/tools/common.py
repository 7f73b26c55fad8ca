"""Small helpers the tool modules share."""

from __future__ import annotations

import numpy as np

from xdiag.profile.space import Session
from xdiag.profile.trace_json import KINETO, trace_format

HOST_PLANE_SOURCE = "xdiag host-plane analysis (XLA:CPU ops on the CPU client threads, step annotations)"
TORCH_CPU_SOURCE = ("xdiag host-plane analysis (PyTorch CPU ops and the backend's collectives on each rank's threads, "
                    "step annotations)")
DEVICE_PLANE_SOURCE = "xdiag device-plane analysis"
XPROF_SOURCE = "XProf converters (xprof {version})"


def ms(ps: float | np.ndarray) -> float:
    return round(float(ps) / 1e9, 4)


def percent(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 2) if whole else 0.0


def xprof_source() -> str:
    try:
        from importlib.metadata import version

        return XPROF_SOURCE.format(version=version("xprof"))
    except Exception:  # pragma: no cover - xprof is a pinned dependency
        return XPROF_SOURCE.format(version="?")


def host_plane_source(session: Session) -> str:
    """Where a CPU profile's numbers come from: XLA:CPU ops, or a CPU-only PyTorch run's ops (a Kineto trace)."""
    return TORCH_CPU_SOURCE if trace_format(session) == KINETO else HOST_PLANE_SOURCE
