"""get_memory_profile: how much memory does the workload use over time, and how close to the limit?"""

from __future__ import annotations

from xdiag.analysis.memory_use import memory_use
from xdiag.profile.space import Session
from xdiag.tools.common import xprof_source
from xdiag.tools.registry import ToolOutput, tool


@tool(
    "get_memory_profile",
    "Memory use over the profile: peak and average bytes in use, the memory capacity where the profile records "
    "it, headroom and out-of-memory risk (LOW/MEDIUM/HIGH).",
)
def get_memory_profile(session: Session) -> ToolOutput:
    """summary: peak_memory_gib, average_in_use_gib, capacity_gib (the device's memory where the profile records
    it, else the allocator's), capacity_source, allocator_limit_gib (where the allocator may use less than the
    device has: XLA's GPU client takes 75% by default), headroom_percent and oom_risk (both against the limit
    that runs out first). From XProf's memory profile on TPU/GPU; from allocator events on host threads otherwise (allocator_events: how many)."""
    summary, detail, from_xprof = memory_use(session)
    return ToolOutput(dict(summary), detail, xprof_source() if from_xprof else "allocator events")
