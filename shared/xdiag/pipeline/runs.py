"""The run registry: runs, their profiler targets and captured sessions in the state store, and the checks every
id, address, duration and tracer level passes before anything is stored or any target is called.

    runs/{run}                        the run: display name, its folder in the bucket (`path`), the SDK's fields,
                                      continuous-profiling state, last automatic capture
    runs/{run}/targets/{name}         a profiler target: host, port (registered by the workload, never by a message)
    runs/{run}/sessions/{session}     a session: kind programmatic | on_demand | snapshot | auto, status, hosts, files
    alerts/{key}                      every message on `alerts` and what became of it
    monitors/{run}                    the monitor's baseline and window of step times

A run's profiles live under `gs://BUCKET/<path>/plugins/profile/<session>/`. A run registered through the ML
Diagnostics SDK with `gcs_path=gs://BUCKET/PREFIX` has `path` PREFIX/<run> (where the SDK's own `xprof()`
writes); any other run's path is its id.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Any

from xdiag.errors import InvalidRequest
from xdiag.ids import check_name
from xdiag.pipeline.layout import state_key
from xdiag.pipeline.run_index import RUNS, get_run, run_for_path  # noqa: F401 (imported from here too)
from xdiag.pipeline.ports import StateStore

ALERTS = "alerts"
MONITORS = "monitors"

KIND_PROGRAMMATIC, KIND_ON_DEMAND, KIND_SNAPSHOT, KIND_AUTO = "programmatic", "on_demand", "snapshot", "auto"
CAPTURED_KINDS = (KIND_ON_DEMAND, KIND_SNAPSHOT, KIND_AUTO)  # sessions the capture function announces itself

_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_PREFIX_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
TRACER_LEVELS = {"host_tracer_level": 3, "device_tracer_level": 2, "python_tracer_level": 1}


@dataclass
class CaptureSettings:
    """How the capture function behaves (XDIAG_CAPTURE_* in the environment)."""

    cooldown_s: float = 600.0  # one automatic capture per run inside this window, however many alerts arrive
    duration_ms: int = 2000  # an alert's capture, and a request's default
    max_duration_ms: int = 60_000  # the profiler's own session deadline is 60 s
    attempts: int = 3  # tracing attempts per target before its session is FAILED
    run_label: str = "run_id"  # the incident label that names the run
    allow_loopback: bool = False  # loopback targets: only the local stack (XDIAG_ALLOW_LOOPBACK_TARGETS=1)


@dataclass
class MonitorSettings:
    """How the monitor judges a run's step times (XDIAG_MONITOR_* in the environment).

    A verdict is `bad` only for a sustained slowdown: the median step time of each window of `window_s` seconds
    (with at least `min_window_points` steps in it) above the baseline by more than `margin`, for
    `consecutive_windows` windows in a row: by default 3 windows of 10 s, so at least 30 s of slowdown. A busy
    machine's scattered slow steps, or a burst of a second or two, move no window's median that far."""

    margin: float = 0.15  # bad when a window's median is this much above the baseline
    warmup_points: int = 5  # the first points (compilation, warm-up) are not part of the baseline
    baseline_points: int = 20  # the baseline is the median of this many points after the warm-up
    window_s: float = 10.0  # the median is taken over the steps that ended in each window of this many seconds
    min_window_points: int = 5  # a window with fewer steps says too little to be judged
    consecutive_windows: int = 3  # this many judged windows in a row above the margin make a slowdown sustained


METADATA_NAMES = frozenset({"metadata", "metadata.google.internal", "metadata.goog"})
"""Names of the cloud's metadata server: never a profiler target, whatever they resolve to here."""


def check_address(host: Any, port: Any, allow_loopback: bool = False) -> tuple[str, int]:
    """A profiler target's address as registered: a DNS name or an IP literal, and a port. The name is resolved and
    every address it resolves to is checked (`resolve_target`): a name cannot smuggle in an address a literal
    could not. Returns the host as given (an IP literal normalised) and the port."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidRequest(f"port {port!r} is not valid: an integer from 1 to 65535")
    if not isinstance(host, str) or not host or len(host) > 253:
        raise InvalidRequest(f"host {host!r} is not valid: a DNS name or an IP address")
    try:
        host = str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        labels = host.rstrip(".").split(".")
        if not all(_HOST_LABEL.fullmatch(label) for label in labels):
            raise InvalidRequest(f"host {host!r} is not valid: a DNS name or an IP address") from None
    resolve_target(host, port, allow_loopback)
    return host, port


def resolve_target(host: str, port: int, allow_loopback: bool = False) -> str:
    """The address to call for a registered target, resolved now (at registration, and again at capture time, so
    a name re-pointed since cannot reach what registration refused). Refuses link-local (the metadata server),
    multicast, unspecified, reserved and broadcast addresses, the metadata server's names, and loopback unless
    the deployment allows it (the local stack); InvalidRequest with the reason."""
    if host.rstrip(".").lower() in METADATA_NAMES:
        raise InvalidRequest(f"host {host!r} is the metadata server, not a profiler target")
    try:
        found = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise InvalidRequest(f"host {host!r} does not resolve ({exc})") from None
    addresses = sorted({info[4][0].split("%", 1)[0] for info in found})
    if not addresses:
        raise InvalidRequest(f"host {host!r} does not resolve")
    for text in addresses:
        refused = _refused(ipaddress.ip_address(text), allow_loopback)
        if refused:
            shown = host if host == text else f"{host!r} (resolves to {text})"
            raise InvalidRequest(f"host {shown} is not a profiler target address: {refused}")
    return addresses[0]


def _refused(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, allow_loopback: bool) -> str:
    """Why an address may not be called ('' where it may)."""
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None:
        ip = mapped
    if ip.is_loopback:
        return "" if allow_loopback else "loopback (allowed only where the deployment is the local stack)"
    if ip.is_link_local:
        return "link-local (the metadata server lives there)"
    if ip.is_multicast:
        return "multicast"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_reserved or ip == ipaddress.ip_address("255.255.255.255"):
        return "reserved"
    return ""


def check_duration_ms(value: Any, settings: CaptureSettings) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 100 <= value <= settings.max_duration_ms:
        raise InvalidRequest(
            f"duration_ms {value!r} is not valid: an integer from 100 to {settings.max_duration_ms} (milliseconds)"
        )
    return value


def check_tracer_levels(request: dict[str, Any]) -> dict[str, int]:
    """The tracer levels a request sets (host 0-3, device 0-2, python 0-1)."""
    levels = {}
    for key, maximum in TRACER_LEVELS.items():
        if key in request and request[key] is not None:
            value = request[key]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
                raise InvalidRequest(f"{key} {value!r} is not valid: an integer from 0 to {maximum}")
            levels[key] = value
    return levels


def check_hosts(value: Any) -> list[str]:
    """Target names a request selects (never addresses: a capture only calls registered targets)."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > 256:
        raise InvalidRequest("hosts must be a list of registered target names")
    return [check_name(name, "target name") for name in value]


def check_prefix(base_blob_path: Any, bucket: str) -> str:
    """`gs://BUCKET[/PREFIX]` → PREFIX ('' for the bucket's root); xdiag writes into its own bucket only."""
    root = f"gs://{bucket}"
    if not isinstance(base_blob_path, str) or not (base_blob_path == root or base_blob_path.startswith(root + "/")):
        raise InvalidRequest(f"baseBlobPath {base_blob_path!r} is not in xdiag's bucket: it must start with {root}")
    prefix = base_blob_path[len(root):].strip("/")
    if prefix and not all(_PREFIX_SEGMENT.fullmatch(part) for part in prefix.split("/")):
        raise InvalidRequest(f"baseBlobPath {base_blob_path!r} has a folder name that is not allowed")
    return prefix


def targets_collection(run_id: str) -> str:
    return f"{RUNS}/{state_key(run_id)}/targets"


def run_path(state: StateStore, run_id: str) -> str:
    """The run's folder in the bucket: `<path>/plugins/profile/<session>/`."""
    doc = get_run(state, run_id) or {}
    return doc.get("path") or doc.get("run_id") or run_id  # an uploaded run's id is its folder (`~` was `/`)


def list_targets(state: StateStore, run_id: str) -> list[dict[str, Any]]:
    return [doc for _, doc in state.list(targets_collection(run_id))]
