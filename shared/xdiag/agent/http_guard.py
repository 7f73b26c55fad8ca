"""`xdiag mcp --http`'s connections and MCP sessions bounded in time and count.

A connection that holds no request (none yet, or the next one's headers not all in) is closed after
`HEADER_TIMEOUT_S`, and past `idle_cap()` such connections the oldest go first: uvicorn bounds an idle connection only
after a response (`timeout_keep_alive`), and 1,100 that never sent a whole request head (the process's 1,024 open
files) once stopped the server answering at all.

A session with no request in flight ends after `SESSION_IDLE_S`, and past `MAX_SESSIONS` opening one more ends the
least recently used of them (`bound_sessions`): the SDK's own bound answers 503 to every new session until one expires
(30 minutes), so 10,000 `initialize` calls from any local process locked the real client out that long. Every process
on the loopback is one client to the server (none tells them apart, a shared token neither): the bound is the
server's. A client whose session ended is answered 404 and opens another, as MCP has it. An open request (a call in
progress, a client's event stream) is never closed here.
"""

from __future__ import annotations

import resource
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0
"""How long a connection may hold no request: a client sends its request head at once."""
MAX_IDLE_CONNECTIONS = 256
"""The most connections without a request kept open (a client keeps a few; its pool at most 100)."""
MAX_SESSIONS = 64
"""The most MCP sessions kept (an agent opens one, a few agents a few)."""
SESSION_IDLE_S = 600.0
"""How long a session may go without a request before it ends (an agent that comes back later opens another)."""


def bound_sessions(manager, cap: int = MAX_SESSIONS) -> None:
    """The SDK's session manager (`StreamableHTTPSessionManager`, mcp 2.3, made with `max_sessions=None`) keeps at most
    `cap` sessions: opening one more ends the least recently used one with no request in flight; where every one has a
    request in flight, the SDK answers 503 as at its own bound."""
    admit = manager._admit_session

    def admit_within_cap(requestor):
        sessions = manager._server_instances
        if len(sessions) >= cap:
            idle = [(transport.idle_scope.deadline, session_id) for session_id, transport in sessions.items()
                    if transport.idle_scope is not None and not transport._requests_in_flight
                    and transport.idle_scope.deadline != float("inf")]  # its last request's end + SESSION_IDLE_S
            if idle:
                _, session_id = min(idle)
                transport = sessions.pop(session_id)  # answers 404 from now on
                manager._session_owners.pop(session_id, None)
                transport.idle_scope.cancel()  # its server task ends and terminates it, as at its idle timeout
        return admit(requestor) if len(sessions) < cap else None

    manager._admit_session = admit_within_cap


def idle_cap() -> int:
    """MAX_IDLE_CONNECTIONS, or a quarter of the open files the process may hold where that is fewer: idle sockets
    never take the files a call needs (its worker's pipes, the profile)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_IDLE_CONNECTIONS
    return max(8, min(MAX_IDLE_CONNECTIONS, soft // 4))


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with a request-head timeout and a bound on connections that hold no request."""

    header_timeout_s = HEADER_TIMEOUT_S
    cap = MAX_IDLE_CONNECTIONS

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._waiting_since = time.monotonic()
        self._timer = None
        self._arm()
        self._close_oldest_waiting()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._waiting_since = time.monotonic()
        if not self.transport.is_closing():
            self._arm()  # the next request's head is bounded as the first one's (a byte a minute is no request)

    def waiting(self) -> bool:
        """No request in progress: none yet, or the last one answered and the next one's head not all in."""
        return (self.cycle is None or self.cycle.response_complete) and self.conn.their_state is h11.IDLE

    def _arm(self) -> None:
        self._disarm()
        self._timer = self.loop.call_later(self.header_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        timer, self._timer = getattr(self, "_timer", None), None
        if timer is not None:
            timer.cancel()

    def _timed_out(self) -> None:
        self._timer = None
        if self.waiting() and not self.transport.is_closing():
            self.transport.close()

    def _close_oldest_waiting(self) -> None:
        waiting = [c for c in self.connections
                   if isinstance(c, GuardedH11) and c.waiting() and not c.transport.is_closing()]
        for connection in sorted(waiting, key=lambda c: c._waiting_since)[:max(0, len(waiting) - self.cap)]:
            connection.transport.close()
