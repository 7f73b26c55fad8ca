"""Request bodies over a function's limit, answered 413 at the door without holding the server.

`BodyLimit` wraps a function's WSGI app: a body announced larger than the limit (Content-Length), or a chunked one
that runs past it, is answered 413 before the app sees it. functions-framework serves under gunicorn's threaded
worker, which after a response drains the unread body on a server thread (up to 5 s) to keep the connection, then
closes a connection it does not keep gracefully on its event-loop thread (lingering up to 2 s, reading what the
client still sends), one after another: a few clients holding over-limit uploads open stalled every other request.
`release_refused_connections` has the worker keep no refused connection (no drain) and close connections off its
event loop.
"""

from __future__ import annotations

import io
import json
import threading
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from xdiag.text_numbers import whole_number

LINGERING_CLOSES = 64
"""Connections closed gracefully at once, off the event loop; more wait their turn (their sockets stay open a little
longer, nobody else waits)."""


def _refuse(start_response: Callable, max_bytes: int) -> list[bytes]:
    body = json.dumps({"error": {"code": 413, "status": "INVALID_ARGUMENT",
                                 "message": f"the request body is larger than {max_bytes} bytes"}}).encode()
    start_response("413 Request Entity Too Large", [("Content-Type", "application/json"),
                                                    ("Content-Length", str(len(body))), ("Connection", "close")])
    return [body]


_refused_sockets: weakref.WeakSet = weakref.WeakSet()  # connections answered 413: the server must not keep them


class BodyLimit:
    """WSGI middleware: bodies over `max_bytes` are refused 413 (and the connection closed) before `app` runs; a
    chunked body within the limit reaches `app` read, with its length."""

    def __init__(self, app: Callable, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        length = environ.get("CONTENT_LENGTH") or ""
        if length.strip():
            declared = whole_number(length.strip())
            if declared is None or declared > self.max_bytes:
                return self._refuse(environ, start_response)
        elif "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            body = environ["wsgi.input"].read(self.max_bytes + 1)
            if len(body) > self.max_bytes:
                return self._refuse(environ, start_response)
            environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
            environ.pop("HTTP_TRANSFER_ENCODING", None)
            environ["wsgi.input_terminated"] = True
        return self.app(environ, start_response)

    def _refuse(self, environ: dict[str, Any], start_response: Callable) -> list[bytes]:
        if environ.get("gunicorn.socket") is not None:
            _refused_sockets.add(environ["gunicorn.socket"])
        return _refuse(start_response, self.max_bytes)


_patched = threading.Lock()


def release_refused_connections() -> None:
    """gunicorn's threaded worker from now on keeps no connection answered 413 (it would drain the body first, on a
    server thread) and closes connections gracefully off its event-loop thread, on a small pool of their own. Does
    nothing where the server is not gunicorn's threaded worker (tests/test_local_stack.py notices a gunicorn without
    these hooks: clients holding uploads open stall the function again)."""
    try:
        from gunicorn.workers import gthread
    except ImportError:
        return
    if not (hasattr(gthread, "TConn") and hasattr(gthread.ThreadWorker, "_keepalive_after")):
        return
    with _patched:
        if getattr(gthread.TConn.close, "off_the_loop", False):
            return
        close, keepalive_after = gthread.TConn.close, gthread.ThreadWorker._keepalive_after
        closing = ThreadPoolExecutor(LINGERING_CLOSES, thread_name_prefix="close")

        def close_off_the_loop(self, graceful: bool = False) -> None:
            if graceful:
                closing.submit(close, self, True)
            else:
                close(self, graceful)

        def keep_unless_refused(self, conn, keepalive):
            if conn.sock in _refused_sockets:
                _refused_sockets.discard(conn.sock)
                return False
            return keepalive_after(self, conn, keepalive)

        close_off_the_loop.off_the_loop = True
        gthread.TConn.close = close_off_the_loop
        gthread.ThreadWorker._keepalive_after = keep_unless_refused
