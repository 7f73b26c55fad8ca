"""The Profiler port over XProf's clients of the gRPC ProfilerService: the capture client
(`xprof.convert._pywrap_profiler_plugin.trace`) and the continuous-profiling API (`xprof.api.continuous_profiling_snapshot`).

The C library is loaded on first use. Its calls release the GIL (ctypes), so targets are captured in parallel
from threads. A target that does not answer raises RuntimeError with the gRPC status text, e.g.
`UNAVAILABLE: No trace event was collected because there were no responses from clients …`.
"""

from __future__ import annotations

from pathlib import Path


def _plugin():
    from xprof.convert import _pywrap_profiler_plugin

    return _pywrap_profiler_plugin


def _continuous():
    from xprof.api import continuous_profiling_snapshot

    return continuous_profiling_snapshot


class XprofProfiler:
    def trace(self, address: str, logdir: Path, duration_ms: int, attempts: int, options: dict[str, int]) -> None:
        _plugin().trace(address, str(logdir), "", True, duration_ms, attempts, dict(options))

    def start_continuous(self, address: str, options: dict[str, int]) -> None:
        _continuous().start_continuous_profiling(address, dict(options))

    def stop_continuous(self, address: str) -> None:
        _continuous().stop_continuous_profiling(address)

    def snapshot(self, address: str, logdir: Path) -> None:
        _continuous().get_snapshot(address, str(logdir))
