"""XProf's own views of a many-host session, built for a named subset of its hosts where they cannot be built for
all of them.

XProf's converters read the xplane files themselves, every host's together, so a session summarised host by host
(xdiag.tools.host_summary) still gives them its files. Where the files together are over the session limit, the
views are built for the hosts that matter (the straggler, the slowest host, the first: host_summary's choice) that
fit under it (xdiag.tools.host_summary.hosts_within), and every view's answer names the hosts it covers
(`hosts_covered`, `hosts_in_session`) instead of the session failing; where even one of them is over the limit, each
view says so (NotAvailable).
"""

from __future__ import annotations

from typing import Any

from xdiag.errors import NotAvailable

COVERAGE_KEYS = ("hosts_covered", "hosts_in_session")


def view_methods() -> frozenset[str]:
    """The views the tools ask XProf's converters for (the broad calls, and peak_allocations with its module)."""
    from xdiag.analysis.xprof.stored import BROAD_CALLS

    return frozenset({method for method, _ in BROAD_CALLS} | {"peak_allocations"})


class HostSubsetViews:
    """Views (an XprofViews, or views recorded of one) of some of a session's hosts: each view's answer names
    them. Everything else is the wrapped views' own."""

    def __init__(self, views: Any, covered: list[str], in_session: int):
        self._views, self.hosts_covered, self.hosts_in_session = views, list(covered), in_session
        self._methods = view_methods()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._views, name)
        if name not in self._methods:
            return attribute

        def view(*args: Any, **kwargs: Any) -> dict:
            return {**attribute(*args, **kwargs), "hosts_covered": self.hosts_covered,
                    "hosts_in_session": self.hosts_in_session}

        return view


class NoHostViews:
    """In place of views no host of the session can have: each view says why (NotAvailable)."""

    def __init__(self, reason: str):
        self.reason = reason
        self._methods = view_methods()

    def __getattr__(self, name: str) -> Any:
        if name not in self._methods:
            raise AttributeError(name)

        def view(*args: Any, **kwargs: Any) -> dict:
            raise NotAvailable(self.reason)

        return view

    def prefetch(self) -> int:
        return 0

    def close(self) -> None:
        return None
