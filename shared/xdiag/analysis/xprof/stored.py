"""XProf's views of a session, computed once and kept as JSON, answered in every process that loads the session.

In the cloud every tool run may land on another function instance, and each instance used to make its own private
copy of the profile and convert op_stats and memory_profile again for the views its tools ask for: on the 85 MiB
bench profile the local stack's three run_tool instances spent 9-13 s of CPU per warm analysis (bench/README.md,
"Measured design choices"). Now register, which reads the session during the quiet period and stores it prepared
(`xdiag.pipeline.deps.SessionLoader.prepare`), also records the views the broad tools ask for (`record`) next to it;
a tool instance that loads the prepared session answers them from that record (`StoredViews`), and converts only
for a view the record does not hold (a follow-up's other arguments), in the same XprofViews as before.

A view is recorded as its dict, or as the reason it is not available (NotAvailable) or why XProf cannot read the
files (ProfileError), raised again as such. A conversion refused for memory (`ConversionTooLarge`) is not recorded:
whether it fits is the loading instance's to decide, with its own memory.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from xdiag.analysis.xprof.common import DEFAULT_TOP_N
from xdiag.analysis.xprof.conversions import ConversionTooLarge
from xdiag.analysis.xprof.views import ViewMethods, XprofViews, view_key
from xdiag.errors import NotAvailable, ProfileError, XdiagError

FORMAT = 1
"""The record's layout version; a record of another is not used (the views are converted again)."""
BROAD_CALLS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("overview", {}),
    ("step_trace", {}),
    ("kpi_metrics", {}),
    ("device_information", {}),
    ("utilization", {}),
    ("smart_suggestions", {}),
    ("roofline", {}),
    ("hlo_op_profile", {"top_n": DEFAULT_TOP_N}),
    ("memory_profile", {}),
    ("kernel_stats", {"top_n": DEFAULT_TOP_N}),
)
"""The views the broad tools ask for with their default arguments (peak_allocations' module is the session's)."""
_ERRORS: dict[str, type[XdiagError]] = {"NotAvailable": NotAvailable, "ProfileError": ProfileError}


def record(views: XprofViews, calls: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Each call's view from `views` (computed there, or taken from its memo), as a JSON-serialisable record."""
    answers: dict[str, dict[str, Any]] = {}
    for method, arguments in calls:
        key = view_key(method, **arguments)
        try:
            answers[key] = {"view": getattr(views, method)(**arguments)}
        except ConversionTooLarge:
            continue  # the loading process decides with its own memory
        except XdiagError as error:
            kind = type(error).__name__
            answers[key] = {"error": kind if kind in _ERRORS else "NotAvailable", "reason": str(error)}
    return {"format": FORMAT, "views": answers}


class StoredViews(ViewMethods):
    """XprofViews' views from a record (`record`), the others from an XprofViews of the files `files` gives, made on
    first need (so a process that never needs one never fetches the files)."""

    def __init__(self, stored: dict[str, Any], files: Callable[[], Sequence[Path]]):
        recorded = stored.get("views", {}) if stored.get("format") == FORMAT else {}
        self._answers: dict[str, dict[str, Any]] = dict(recorded)
        self._files = files
        self._converted: XprofViews | None = None
        self._lock = threading.Lock()

    @property
    def converted(self) -> XprofViews | None:
        """The XprofViews made for a view the record did not hold; None while every view came from the record."""
        return self._converted

    def holds(self, method: str, **arguments: Any) -> bool:
        """Whether the record answers this view (else it is converted when asked)."""
        return view_key(method, **arguments) in self._answers

    def _answer(self, method: str, **arguments: Any) -> dict:
        answer = self._answers.get(view_key(method, **arguments))
        if answer is None:
            with self._lock:
                if self._converted is None:
                    self._converted = XprofViews(list(self._files()))
            return getattr(self._converted, method)(**arguments)
        if "error" in answer:
            raise _ERRORS.get(answer["error"], NotAvailable)(answer["reason"])
        return copy.deepcopy(answer["view"])

    def prefetch(self) -> int:
        """Nothing to start: the recorded views need no conversion (the others convert when asked)."""
        return 0

    def close(self) -> None:
        with self._lock:
            if self._converted is not None:
                self._converted.close()
