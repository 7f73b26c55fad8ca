"""Inside the workload: make this process a profiler target of xdiag, and (optionally) report its step times.

    import xdiag.sdk.workload
    attached = xdiag.sdk.workload.attach(control_plane=XDIAG_URL, port=9999)      # after machinelearning_run(...)
    for batch in data:
        with attached.step():                                                   # optional: feeds the monitor
            train_step(batch)

`attach` starts the JAX profiler server on `port` if none is running, then (in a background thread) registers
this host as a profiler target (`name` → `host:port`) of the run: the run the ML Diagnostics SDK created in this
process, or `run=`, or `XDIAG_RUN_ID`. A run named by `run=` that the control plane does not know is created.
Step times are queued in memory (bounded) and sent every `report_interval_s` by the same thread.

It never crashes or slows the workload: nothing here raises into the caller, `step()` only appends to a
queue, and every network call runs in the background with a short timeout. When xdiag is unreachable it logs
once, backs off (1 s doubling to 60 s) and keeps the newest points; it says so again when xdiag answers.

The control plane's URL and token come from the arguments or `XDIAG_CONTROL_PLANE_URL` and
`XDIAG_CONTROL_PLANE_TOKEN` (a URL of the form http://xdiag:TOKEN@HOST:PORT carries the token).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("xdiag.sdk.workload")

MAX_QUEUED_POINTS = 10_000
MAX_BATCH = 1000
MAX_BACKOFF_S = 60.0


def _sdk_run_id() -> str | None:
    """The run the ML Diagnostics SDK created in this process, if it did."""
    if "google_cloud_mldiagnostics" not in sys.modules:
        return None
    try:
        from google_cloud_mldiagnostics.core import global_manager

        return global_manager.get_current_run_id() or None
    except Exception:  # the SDK's internals are not ours: never let them break the workload
        return None


def _default_name() -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).strip("-.") or "host"
    jax = sys.modules.get("jax")
    try:
        if jax is not None and jax.process_count() > 1:
            name = f"{name}-{jax.process_index()}"
    except Exception:
        pass
    return name[:128]


def _default_host() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _start_profiler_server(port: int) -> str:
    """Starts JAX's profiler server on `port` unless one runs; returns what happened."""
    try:
        import jax.profiler
    except ImportError:
        return "jax is not installed: start your framework's profiler server on the port yourself"
    try:
        jax.profiler.start_server(port)
        return f"profiler server started on port {port}"
    except Exception as exc:  # e.g. "Only one profiler server can be active at a time"
        return f"profiler server not started ({exc}); assuming one already serves port {port}"


class Attachment:
    """The workload's link to xdiag. `step()` times a step; `record_step(ms)` reports one measured elsewhere."""

    def __init__(self, client: Any, run: str | None, name: str, host: str, port: int, report_steps: bool,
                 report_interval_s: float, create_run: bool) -> None:
        self.client, self.run, self.name, self.host, self.port = client, run, name, host, port
        self.report_steps, self.report_interval_s, self.create_run = report_steps, report_interval_s, create_run
        self.registered = False
        self.points: deque[dict[str, Any]] = deque(maxlen=MAX_QUEUED_POINTS)
        self.sent_points = 0
        self._step = 0
        self._stop = threading.Event()
        self._unreachable = False
        self._thread: threading.Thread | None = None

    # --- what the workload calls ----------------------------------------------------------------------

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.record_step((time.perf_counter() - started) * 1000)

    def record_step(self, step_time_ms: float, step: int | None = None) -> None:
        if not self.report_steps or self.client is None:
            return
        try:
            number = self._step if step is None else int(step)
            self._step = number + 1
            self.points.append({"step": number, "step_time_ms": float(step_time_ms), "at": time.time()})
        except Exception:  # a bad value from the caller is dropped, never raised
            pass

    def detach(self, flush: bool = True, timeout_s: float = 5.0) -> None:
        """Stops the background thread (after one last send of the queued points when `flush`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if flush and self.registered and self.points:
            self._send_points()

    # --- the background thread --------------------------------------------------------------------------

    def start(self) -> Attachment:
        self._thread = threading.Thread(target=self._loop, name="xdiag-workload", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                if not self.registered:
                    self._register()
                if self.report_steps and self.points:
                    self._send_points()
                if self._unreachable:
                    log.info("xdiag: the control plane at %s answers again", self.client.url)
                    self._unreachable = False
                backoff = 1.0
                wait = self.report_interval_s if self.report_steps else 3600.0
            except Exception as exc:
                if not self._unreachable:
                    log.warning("xdiag: %s; the workload goes on, retrying in the background", exc)
                    self._unreachable = True
                wait, backoff = backoff, min(backoff * 2, MAX_BACKOFF_S)
            self._stop.wait(wait)

    def _register(self) -> None:
        from xdiag.control.client import ControlPlaneError

        if self.create_run:
            try:
                self.client.run(self.run)
            except ControlPlaneError as exc:
                if exc.status != 404:
                    raise
                self.client.create_run(self.run)
        self.client.add_target(self.run, self.name, self.host, self.port)
        self.registered = True
        log.info("xdiag: registered %s (%s:%d) as a profiler target of run %s", self.name, self.host, self.port,
                 self.run)

    def _send_points(self) -> None:
        batch = []
        while self.points and len(batch) < MAX_BATCH:
            batch.append(self.points.popleft())
        try:
            self.client.report_steps(self.run, self.name, batch)
        except Exception:
            room = MAX_QUEUED_POINTS - len(self.points)  # kept for the next try, unless newer points filled the queue
            self.points.extendleft(reversed(batch[len(batch) - room:] if room > 0 else []))
            raise
        self.sent_points += len(batch)


def attach(
    control_plane: str | None = None, port: int = 9999, run: str | None = None, name: str | None = None,
    host: str | None = None, token: str | None = None, start_server: bool = True, report_steps: bool = False,
    report_interval_s: float = 5.0, create_run: bool | None = None,
) -> Attachment:
    """Registers this process's profiler server with xdiag; returns at once (the network work runs in the
    background). Never raises: a misconfiguration is logged and an inert Attachment returned."""
    try:
        from xdiag.control.client import ControlPlaneClient

        url = control_plane or os.environ.get("XDIAG_CONTROL_PLANE_URL")
        sdk_run = _sdk_run_id()
        chosen = run or sdk_run or os.environ.get("XDIAG_RUN_ID")
        if start_server:
            log.info("xdiag: %s", _start_profiler_server(port))
        if not url or not chosen:
            missing = "the control plane URL (XDIAG_CONTROL_PLANE_URL)" if not url else "the run (run= or XDIAG_RUN_ID)"
            log.warning("xdiag: not attached: %s is not set; the workload goes on without xdiag", missing)
            return Attachment(None, chosen, name or _default_name(), host or "", port, False, report_interval_s, False)
        client = ControlPlaneClient(url, token or os.environ.get("XDIAG_CONTROL_PLANE_TOKEN"), timeout_s=2.0)
        attachment = Attachment(
            client, chosen, name or _default_name(), host or os.environ.get("XDIAG_TARGET_HOST") or _default_host(),
            port, report_steps, report_interval_s, create_run if create_run is not None else chosen != sdk_run,
        )
        return attachment.start()
    except Exception as exc:
        log.warning("xdiag: not attached (%s); the workload goes on without xdiag", exc)
        return Attachment(None, run, name or "workload", host or "", port, False, report_interval_s, False)
