"""XProf's own analyses of one device (TPU/GPU) profile session, in-process, each computed at most once.

`XprofViews` links the session's `*.xplane.pb` files into a private
`<workdir>/plugins/profile/<session>/` (XProf's converters write `ALL_HOSTS.op_stats_v2.pb`,
`*.hlo_proto.pb` … next to their input, so never next to the originals) and answers each view by
calling the XProf CLI tool functions that ship in the `xprof` wheel (`xprof.cli.tools.*`,
`xprof.cli.internal.xprof_data`), or the converter itself where no tool reads it (kernel_stats,
smart_suggestion, memory_profile). Every view returns a plain JSON-serialisable dict: a compact
top level of numbers with units in their names, `unavailable` (top-level key -> why it is None)
where some are missing, and `detail` with bounded fuller data. A view XProf has no data for raises
`NotAvailable` with the reason; an unreadable file raises `ProfileError`.

Computed once, per instance. The CLI tools fetch through XProf's process-wide client
(`xprof_client.get_client()`); this module puts a router in front of it that answers fetches for
an XprofViews session from that instance's memo (keyed by converter and the parameters the
converter reads), so overview, step trace, roofline, KPIs and device information share one
overview_page / roofline_model conversion. Other sessions pass through to the original client.
The tools' own result cache (`decorators.cached`: SQLite in `$TMPDIR/xprof_cli_cache_<user>`, keyed
by file *content*, shared by every process) is bypassed by calling the undecorated functions,
so two instances never see each other's results. Tool results and finished views are memoised
on the instance too; `conversion_counts` shows how often each conversion ran (always 1).

XProf logs a great deal from C++ to fd 2 and from Python to the root logger. While a conversion
runs, fd 2 goes to a scratch file and records from xprof's modules are demoted; both are
re-logged at DEBUG on this module's logger (and parse errors become `ProfileError`). The switch
is process-wide, so whatever another thread writes to fd 2 during a conversion (tens of ms on
these profiles) lands in that DEBUG record too. `close()` (or the context manager) removes the
private copy and the fingerprint/owner/lock files XProf's client keeps for it under its cache
folder; XProf's client stays routed for the life of the process (it delegates everything else).

What each view gives on the shared profiles (`shared/profiles`, xprof 2.24.2). TPU = TPU v6e inference
(4 cores); V100 = 8 x V100 TF BERT worker, no XLA; MI300X = JAX gemm, and conv_8gpu after a slash.
"NA" = raises NotAvailable, with the reason given.

overview
  TPU     duty cycle 86.5%, idle 13.4%, MXU 0.0%, flop-rate util 4.35% (the roofline figure), HBM bound;
          step time None (no step markers)
  V100    step time 21.3 ms; duty cycle, idle, MXU None (TPU-only); roofline figures None (0 ops analysed)
  MI300X  flop-rate util 1.26% / 2.12%, HBM bound, custom calls 34% of device time (gemm); step time None
step_trace
  TPU     NA: no step markers
  V100    1 step of 21.31 ms: compute 69.8%, idle 30.2%
  MI300X  NA: no step markers
kpi_metrics
  TPU     duty 86.5, flop util 4.35, peak HBM 20.02 of 31.25 GiB (64.1%), MXU 0.0, step time None
  V100    step 21.3 ms, peak 5.78 of 14.41 GiB (40.1%); duty, MXU, flop util None
  MI300X  flop util 1.26 ("mixed": 99% of FLOPs shape-derived) / 2.12 ("opaque_custom_call");
          peak 0.45 / 1.61 of 143.99 GiB
device_information
  TPU     TPU v6 Lite, 918 TFLOP/s, HBM 1525.5 GiB/s, ridge 560.4 FLOP/byte, VMEM r/w 21696/15020 GiB/s
  V100    "GPU" (XProf cannot tell the vendor), HBM 836.4 GiB/s; peak FLOP rate None (XProf says 0)
  MI300X  AMD GPU - gfx942, 1307 TFLOP/s, HBM 2479.6 GiB/s, ridge 491.1 FLOP/byte
utilization
  all     NA: no hardware performance-counter samples in the trace
smart_suggestions
  all     0 suggestions
roofline
  TPU     4.35% of roofline, HBM bound, HBM 66.3 GiB/s, 4.47 GFLOP/s, 17 ops
  V100    NA: 0 HLO ops analysed, peak FLOP rate 0
  MI300X  1.26%, HBM bound, 16 ops / 2.12%, HBM bound, opaque custom calls
hlo_op_profile
  TPU     copy-done 83.6% of 363.7 s core time, idle 13.4%, top op copy-done.4 (21.4%)
  V100    NA: op_profile holds only IDLE (no XLA programs)
  MI300X  custom-call 34.0%, idle 63.9%, top op custom-call.1 / idle 96.7% (8 GPUs), input_transpose_fusion
memory_profile
  TPU     peak 20.02 GiB (a stack reservation) of 31.25 GiB, allocator 1 of 4
  V100    peak 5.78 of 14.41 GiB on GPU_6_bfc; the largest live tensors at the peak, named by TF op
  MI300X  0.45 GiB on GPU_0_bfc / 1.61 GiB on each of 8 GPUs
peak_allocations
  TPU     jit_f 20.0 GiB (4 buffers of 5 GiB), 4 modules
  V100    NA: no HLO modules
  MI300X  jit_dot(49) 0.32 GiB of 16 modules / jit_forward_3d_conv(15) 1.08 GiB
kernel_stats
  TPU     NA: a TPU has no GPU kernel launches (see hlo_op_profile)
  V100    15 kernels, 29.7 ms; FillPhiloxRandomKernelLaunch 26.6%; no tensor-core kernels
  MI300X  12 kernels, 3.48 ms, Cijk_* GEMMs 93% on matrix cores / 8 kernels, 28.1 ms, input_transpose_fusion.kd 51%

Time on this machine (2 cores, warm disk), every view of a fresh instance in a fresh process: TPU
0.37 s, V100 0.55 s, MI300X gemm 0.25 s, conv 0.22 s. The first view pays XProf's op_stats
conversion and native start-up (overview 0.12-0.3 s); memory_profile 5-130 ms (1.9 MB of JSON on
the V100), peak_allocations 10-30 ms (one memory_viewer conversion per HLO module), every other
view under 70 ms, and every repeated call is a dictionary look-up. XProf's CLI, one process per
tool, re-reads the profile each time (design.md: ~41 s for the ten main tools on a 22 MB profile).

Quirks of xprof 2.24.2 worked around here:
- The tools return "N/A", "-nan", percent strings and -1.0 for missing values; all become numbers
  or None. Zeros that mean "unknown" (GPU occupancy and registers, peak FLOP rate, ridge points,
  step time without step markers, roofline figures with 0 ops analysed) become None too.
- `get_memory_profile` takes the largest capacity of *any* allocator, so on the V100 it divides
  the device peak by the 64 GiB host allocator (9% "utilisation"); here the capacity is that of the
  allocator that holds the peak (40.1%).
- `get_overview` fills the roofline figures from roofline_model because overview_page says 0.0%;
  get_kpi_metrics' roofline util switches to the shape-derived figure for custom-call programs.
- `get_kernel_stats` (CLI) sums device-plane events by TF op name; XProf's kernel_stats converter,
  used here, has the real per-kernel table (registers, shared memory, grid, tensor-core use).
- Converters return None on failure and only log the reason to stderr ("Can't parse … as binary
  proto"); that line is picked out of the captured log to raise `ProfileError`.
- memory_profile and utilization_viewer accept one trace only; memory_profile is asked per host
  for multi-file sessions, utilization answers NotAvailable for them.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from xdiag.errors import NotAvailable, ProfileError, XdiagError

log = logging.getLogger(__name__)

DEFAULT_TOP_N = 20
"""Rows kept in each `detail` list when a view takes no top_n."""

_GIB = 1024**3
_MIB = 1024**2
_XPLANE_SUFFIX = ".xplane.pb"
_FETCH_PARAMS_IGNORED = frozenset({"format", "tqx", "bypass_cache", "use_saved_result"})
"""Fetch parameters that do not change what a converter returns (see raw_to_tool_data)."""
_CUSTOM_CALL_REASON = "XProf reports the custom-call share only when custom calls take 10% of device time or more"
_PARSE_ERROR = re.compile(r"can't parse|cannot parse|failed to parse|data_loss|not a valid", re.IGNORECASE)


@functools.cache
def _xprof() -> types.SimpleNamespace:
    """XProf's modules, imported on first use so that importing xdiag stays cheap."""
    import xprof
    from xprof.cli.internal import xprof_data
    from xprof.cli.internal.oss import xprof_client
    from xprof.cli.tools import (
        get_memory_profile_tool,
        get_overview_tool,
        get_peak_allocations_tool,
        get_roofline_model_tool,
        get_step_trace_tool,
        get_top_hlo_ops_tool,
        get_utilization_viewer_tool,
    )

    return types.SimpleNamespace(
        package_dir=os.path.dirname(os.path.abspath(xprof.__file__)) + os.sep,
        client=xprof_client,
        data=xprof_data,
        overview=get_overview_tool.get_overview,
        step_trace=get_step_trace_tool.get_step_trace,
        roofline=get_roofline_model_tool.get_roofline_model,
        device_information=xprof_data.get_device_information,
        hlo_op_profile=xprof_data.get_hlo_op_profile,
        top_hlo_ops=get_top_hlo_ops_tool.get_top_hlo_ops,
        memory_profile=get_memory_profile_tool.get_memory_profile,
        peak_allocations=get_peak_allocations_tool.get_peak_allocations,
        utilization=get_utilization_viewer_tool.get_utilization_viewer,
    )


# --- numbers -------------------------------------------------------------------------------


def _number(value: Any) -> float | int | None:
    """'86.5%' -> 86.5, '21.3' -> 21.3, 7 -> 7; 'N/A', '-nan', '', -inf, bools and the rest -> None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        text = value.strip().removesuffix("%").strip()
        if re.fullmatch(r"[+-]?\d+", text):
            return int(text)  # int64 fields arrive as strings; float() would round them
        try:
            number = float(text)
        except ValueError:
            return None
        return number if math.isfinite(number) else None
    return None


def _positive(value: Any) -> float | int | None:
    """A number that means "unknown" when XProf reports it as 0 or below (-1.0 is its N/A)."""
    number = _number(value)
    return number if number is not None and number > 0 else None


def _non_negative(value: Any) -> float | int | None:
    number = _number(value)
    return number if number is not None and number >= 0 else None


def _int(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None else None


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    number = _number(value)
    return bool(number) if number is not None else None


def _round(value: float | int | None, digits: int = 3) -> float | int | None:
    return round(value, digits) if isinstance(value, float) else value


def _gib(byte_count: Any) -> float | None:
    number = _non_negative(byte_count)
    return round(number / _GIB, 3) if number is not None else None


def _scaled(value: Any, factor: float, digits: int) -> float | None:
    number = _non_negative(value)
    return round(number * factor, digits) if number is not None else None


def _percent(part: float | None, whole: float | None) -> float | None:
    if part is None or not whole:
        return None
    return round(100.0 * part / whole, 2)


def _clean(value: Any) -> Any:
    """Makes nested tool output xdiag-shaped: percent/number strings become numbers, "N/A" and
    NaN disappear, keys keep their names."""
    if isinstance(value, dict):
        cleaned = {str(key): item if str(key).endswith("_id") else _clean(item) for key, item in value.items()}
        return {key: item for key, item in cleaned.items() if item not in (None, "")}
    if isinstance(value, (list, tuple)):
        return [_clean(item) for item in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return _number(value)
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.upper() in ("N/A", "NA", "NAN", "-NAN", "UNKNOWN", ""):
            return None
        if stripped.lower() in ("true", "false"):
            return stripped.lower() == "true"
        if re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?%?", stripped):
            return _number(stripped)
        return value
    return str(value)


def _datatable_rows(table: Any) -> list[dict[str, Any]]:
    """Rows of one Google DataTable (`{"cols": [...], "rows": [...]}`) keyed by column id."""
    if isinstance(table, list):
        table = table[0] if table else {}
    if not isinstance(table, dict):
        return []
    ids = [column.get("id") or column.get("label") or f"col_{i}" for i, column in enumerate(table.get("cols", []))]
    rows = []
    for row in table.get("rows", []):
        cells = row.get("c", []) if isinstance(row, dict) else []
        values = [cell.get("v") if isinstance(cell, dict) else cell for cell in cells]
        rows.append(dict(zip(ids, values)))
    return rows


def _table_with(tables: Any, column: str) -> dict | None:
    """The first table of a multi-table converter output (a list) that has a column with this id."""
    for table in tables if isinstance(tables, list) else []:
        if isinstance(table, dict) and any(c.get("id") == column for c in table.get("cols", [])):
            return table
    return None


def _properties(tables: Any) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for table in tables if isinstance(tables, list) else []:
        if isinstance(table, dict):
            merged.update(table.get("p", {}))
    return merged


def _with_reasons(result: dict[str, Any], reasons: dict[str, str]) -> dict[str, Any]:
    """Adds `unavailable` (key -> why it is None) for top-level keys that came out as None."""
    default = "XProf has no value for it on this profile"
    missing = {key: reasons.get(key, default) for key, value in result.items() if value is None}
    if missing:
        result["unavailable"] = missing
    return result


# --- keeping XProf quiet --------------------------------------------------------------------


class _DemoteXprofRecords(logging.Filter):
    """Drops log records emitted from xprof's own modules and re-logs them at DEBUG here."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.pathname.startswith(_xprof().package_dir):
            log.debug("xprof %s: %s", record.levelname, record.getMessage())
            return False
        return True


class _QuietXprof:
    """While any conversion runs (in any thread), fd 2 goes to a scratch file and xprof's Python
    log records are demoted; each caller gets the stderr text written during its own window."""

    _LOGGERS = ("", "absl", "tensorboard")

    def __init__(self) -> None:
        self._thread = threading.local()  # nesting depth per thread: only the outermost window logs
        self._lock = threading.Lock()
        self._users = 0
        self._saved_fd: int | None = None
        self._scratch: Any = None
        self._filter = _DemoteXprofRecords()

    @contextlib.contextmanager
    def __call__(self) -> Iterator[list[str]]:
        lines: list[str] = []
        depth = getattr(self._thread, "depth", 0)
        self._thread.depth = depth + 1
        start = self._enter()
        try:
            yield lines
        finally:
            self._thread.depth = depth
            lines.extend(self._exit(start, outermost=depth == 0))

    def _enter(self) -> int | None:
        with self._lock:
            if self._users == 0:
                _flush_stderr()
                try:
                    scratch = tempfile.TemporaryFile()
                    saved = os.dup(2)
                    os.dup2(scratch.fileno(), 2)
                except OSError:  # no usable fd 2: let XProf talk
                    return None
                self._scratch, self._saved_fd = scratch, saved
                for name in self._LOGGERS:
                    logging.getLogger(name).addFilter(self._filter)
            self._users += 1
            return os.lseek(self._scratch.fileno(), 0, os.SEEK_CUR)

    def _exit(self, start: int | None, outermost: bool) -> list[str]:
        if start is None:
            return []
        _flush_stderr()
        with self._lock:
            fd = self._scratch.fileno()
            end = os.lseek(fd, 0, os.SEEK_CUR)
            text = os.pread(fd, max(0, end - start), start).decode("utf-8", errors="replace")
            self._users -= 1
            if self._users == 0:
                os.dup2(self._saved_fd, 2)
                os.close(self._saved_fd)
                self._scratch.close()
                self._scratch = self._saved_fd = None
                for name in self._LOGGERS:
                    logging.getLogger(name).removeFilter(self._filter)
        if outermost and text.strip():
            log.debug("XProf stderr:\n%s", text[-20_000:])
        return text.splitlines()


def _flush_stderr() -> None:
    with contextlib.suppress(Exception):
        sys.stderr.flush()


_quiet = _QuietXprof()


# --- routing XProf's process-wide client to per-instance memos ------------------------------

_OWNERS: weakref.WeakValueDictionary[str, XprofViews] = weakref.WeakValueDictionary()
_OWNERS_LOCK = threading.Lock()


class _SessionRouter:
    """Stands in for XProf's process-wide client: fetches for an XprofViews session are answered
    from that instance's memo (converted once, by a local client); everything else goes to the
    client that was there before."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._local = _xprof().client.LocalXprofClient()

    def __getattr__(self, name: str) -> Any:
        if name in ("_inner", "_local"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def fetch(self, tool_name: str, session_id: str, rpc_deadline_s: int = 600, **kwargs: Any) -> Any:
        owner = _owner_of(session_id)
        if owner is None:
            return self._inner.fetch(tool_name, session_id, rpc_deadline_s, **kwargs)
        return owner._converted(
            tool_name, kwargs, lambda params: self._local.fetch(tool_name, session_id, rpc_deadline_s, **params)
        )


def _owner_of(session_id: Any) -> XprofViews | None:
    try:
        path = os.path.realpath(os.fspath(session_id))
    except (TypeError, ValueError):
        return None
    with _OWNERS_LOCK:
        owner = _OWNERS.get(path)
        if owner is None and path.endswith(_XPLANE_SUFFIX):
            owner = _OWNERS.get(os.path.dirname(path))
    return owner


def _install_router() -> None:
    """Puts the router in front of XProf's client (again, if someone replaced it since)."""
    client_module = _xprof().client
    with _OWNERS_LOCK:
        current = client_module.get_client()
        if not isinstance(current, _SessionRouter):
            client_module.set_client(_SessionRouter(current))


def _converter_name(tool_name: str) -> str:
    """The converter a fetch runs, as LocalXprofClient.fetch maps it."""
    name = tool_name.removesuffix(".json")
    return "op_profile" if name == "hlo_op_profile" else name


# --- the private copy -------------------------------------------------------------------------


def _session_name(paths: Sequence[Path]) -> str:
    parents = {path.parent.name for path in paths}
    name = parents.pop() if len(parents) == 1 else "session"
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "session"


def _make_session_dir(profile_root: Path, name: str) -> Path:
    profile_root.mkdir(parents=True, exist_ok=True)
    for attempt in range(1000):
        candidate = profile_root / (name if attempt == 0 else f"{name}-{attempt + 1}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise ProfileError(f"{profile_root}: cannot create a session folder named {name}*")


def _link_names(paths: Sequence[Path]) -> list[str]:
    """File names in the session folder: the originals' names, made unique, ending in .xplane.pb
    (XProf only looks for that suffix; the stem becomes the host name)."""
    names: list[str] = []
    for path in paths:
        name = path.name if path.name.endswith(_XPLANE_SUFFIX) else path.name + _XPLANE_SUFFIX
        if name in names:
            name = f"{path.parent.name}_{name}"
        stem, suffix = name.removesuffix(_XPLANE_SUFFIX), _XPLANE_SUFFIX
        counter = 2
        while name in names:
            name = f"{stem}_{counter}{suffix}"
            counter += 1
        names.append(name)
    return names


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        target.symlink_to(source)
    except OSError:  # no symlinks here (some filesystems, Windows without privilege)
        shutil.copyfile(source, target)


def _remove_private_copy(path: str, xprof_side_files: list[str]) -> None:
    shutil.rmtree(path, ignore_errors=True)
    for side_file in xprof_side_files:
        with contextlib.suppress(OSError):
            os.unlink(side_file)


# --- the views ----------------------------------------------------------------------------------


class XprofViews:
    """XProf's converters over one session's xplane files, on a private copy, each view computed once.

    Every view returns a JSON-serialisable dict (numbers are numbers, units in key names, None
    where XProf has no value and `unavailable` saying why, bounded `detail`), or raises
    `NotAvailable` with the reason, or `ProfileError` when XProf cannot read the files.
    Thread-safe; instances on different sessions may run concurrently.
    """

    def __init__(
        self, xplane_paths: Sequence[str | os.PathLike[str]] | str | os.PathLike[str], workdir: Path | None = None
    ):
        if isinstance(xplane_paths, (str, os.PathLike)):
            xplane_paths = [xplane_paths]
        originals = [Path(p).expanduser().absolute() for p in xplane_paths]
        if not originals:
            raise ProfileError("no xplane files given")
        for path in originals:
            if not path.is_file():
                raise ProfileError(f"{path}: no such file")
            if path.stat().st_size == 0:
                raise ProfileError(f"{path}: empty file")
        self.originals: tuple[Path, ...] = tuple(originals)

        root = Path(tempfile.mkdtemp(prefix="xdiag-xprof-")) if workdir is None else Path(workdir).absolute()
        self.run_dir: Path = _make_session_dir(root / "plugins" / "profile", _session_name(originals))
        self._files: list[Path] = []
        try:
            for original, name in zip(originals, _link_names(originals)):
                _link_or_copy(original, self.run_dir / name)
                self._files.append(self.run_dir / name)
        except OSError as error:
            shutil.rmtree(root if workdir is None else self.run_dir, ignore_errors=True)
            raise ProfileError(f"cannot set up the private copy in {self.run_dir}: {error}") from error
        self._removable = str(root if workdir is None else self.run_dir)
        self._side_files: list[str] = []
        self._finalizer = weakref.finalize(self, _remove_private_copy, self._removable, self._side_files)

        self._lock = threading.RLock()
        self._conversions: dict[str, Any] = {}
        self._pages: dict[str, Any] = {}
        self._tools: dict[str, Any] = {}
        self._views: dict[str, Any] = {}
        self._unreadable: str | None = None
        self.conversion_counts: collections.Counter[str] = collections.Counter()
        """How often each conversion ran, keyed by converter and parameters; 1 each, by design."""
        self.timings_s: dict[str, float] = {}
        """Seconds each view took the first time (conversions included), keyed by view name."""
        with _OWNERS_LOCK:
            _OWNERS[os.path.realpath(self.run_dir)] = self

    # context manager and clean-up

    def __enter__(self) -> XprofViews:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"XprofViews({[str(p) for p in self.originals]!r}, run_dir={str(self.run_dir)!r})"

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Removes the private copy (and XProf's per-run-folder files under its cache folder)."""
        with self._lock:
            if self.closed:
                return
            with _OWNERS_LOCK:
                _OWNERS.pop(os.path.realpath(self.run_dir), None)
            if self.conversion_counts:
                self._side_files.extend(self._xprof_side_files())
            self._finalizer()

    def _xprof_side_files(self) -> list[str]:
        """The fingerprint, owner and lock files LocalXprofClient keeps for this run folder."""
        scopes = [[str(p) for p in self._files]] + ([[str(p)] for p in self._files] if len(self._files) > 1 else [])
        files: list[str] = []
        for paths in scopes:
            with contextlib.suppress(Exception):  # best effort: private API of xprof_client
                scope = _xprof().client._compute_op_stats_scope(self.run_dir, paths)
                lock = scope.owner_dir / f"{scope.run_dir_hash}.lock"
                files += [str(scope.fp_file), str(scope.owner_file), str(lock)]
        return files

    # the views

    def overview(self) -> dict:
        """XProf's overview page: step time, duty cycle, idle, MXU, roofline utilisation, device.

        Top level: device_type, device_core_count, host_count, is_training, step_time_ms,
        step_time_stddev_ms, duty_cycle_percent, device_idle_percent, mxu_utilization_percent,
        flop_rate_utilization_percent, memory_bw_utilization_percent, hbm_bw_utilization_percent,
        bound_by, custom_call_share_percent. Detail: performance_summary and run_environment as
        XProf's get_overview gives them (numbers made numbers), xprof_statement (XProf's own
        bottleneck verdict, not a finding), diagnostics, top_ops (XProf's top-10 table).
        """
        return self._view("overview", self._build_overview)

    def step_trace(self) -> dict:
        """Per-step breakdown (pod_viewer / input_pipeline_analyzer, via get_step_trace).

        Top level: step_count, step_time_ms (average), step_time_min_ms, step_time_max_ms,
        step_time_stddev_ms, compute_time_ms, compute_percent, communication_percent,
        infeed_percent, outfeed_percent, idle_percent, primary_bottleneck, is_aggregate.
        Detail: steps (first 20). NotAvailable when the profile has no step markers.
        """
        return self._view("step_trace", self._build_step_trace)

    def kpi_metrics(self) -> dict:
        """XProf's get_kpi_metrics fields, assembled from this instance's overview, memory profile
        and roofline (nothing is converted again): step_time_ms, duty_cycle_percent,
        mxu_utilization_percent, flop_rate_utilization_percent, flops_provenance,
        derived_flops_fraction, peak_hbm_gib, memory_capacity_gib, hbm_utilization_percent,
        device_type, device_core_count."""
        return self._view("kpi_metrics", self._build_kpi_metrics)

    def device_information(self) -> dict:
        """Device peaks from the roofline model plus the run environment: device_type,
        device_core_count, host_count, peak_flop_rate_gflops, peak_hbm_bw_gibs,
        peak_vmem_read_bw_gibs, peak_vmem_write_bw_gibs, hbm_ridge_point_flop_per_byte,
        megacore, has_cmem. Detail: every property XProf gives, units in the names."""
        return self._view("device_information", self._build_device_information)

    def utilization(self) -> dict:
        """Hardware-counter utilisation (utilization_viewer): *_percent per unit (HBM, MXU, ICI,
        vector ALU …) over the whole capture. NotAvailable without performance counters."""
        return self._view("utilization", self._build_utilization)

    def smart_suggestions(self) -> dict:
        """XProf's rule-based suggestions: suggestion_count; detail.suggestions (rule, text)."""
        return self._view("smart_suggestions", self._build_smart_suggestions)

    def roofline(self) -> dict:
        """Program roofline (get_roofline_model): roofline_efficiency_percent,
        compute_efficiency_percent, max_mem_bw_utilization_percent, hbm_bw_utilization_percent,
        bound_by, operational intensities and ridge point, measured_flop_rate_gflops,
        hbm_bw_gibs, peaks, total_time_ms, flops_provenance, derived_flops_fraction, ops_analyzed.
        Detail: top_operations (20, per-op roofline placement), device_info.
        NotAvailable when XProf analysed no HLO ops."""
        return self._view("roofline", self._build_roofline)

    def hlo_op_profile(self, top_n: int = DEFAULT_TOP_N) -> dict:
        """HLO ops by self time (op_profile, via get_hlo_op_profile and get_top_hlo_ops).

        Top level: total_time_ms (summed core time), idle_percent, op_count, category_count,
        top_category, top_category_percent, top_op, top_op_percent. Detail: categories,
        top_ops_by_time, top_ops_by_flops, top_ops_by_bytes (top_n rows each).
        NotAvailable when op_profile holds no HLO ops (only idle time).
        """
        return self._view(f"hlo_op_profile(top_n={int(top_n)})", lambda: self._build_hlo_op_profile(max(1, int(top_n))))

    def memory_profile(self) -> dict:
        """Device memory over the capture (memory_profile), per allocator.

        Top level: peak_hbm_gib, peak_hbm_bytes, memory_capacity_gib (of the allocator holding
        the peak), hbm_utilization_percent, peak_allocator, heap_at_peak_gib, stack_at_peak_gib,
        free_at_peak_gib, fragmentation_at_peak_percent, device_allocator_count. Detail:
        allocators (device and host), largest_allocations_at_peak (of the peak allocator).
        """
        return self._view("memory_profile", self._build_memory_profile)

    def peak_allocations(self, module: str | None = None) -> dict:
        """HLO modules by peak HBM and their largest buffers (memory_viewer, via get_peak_allocations).

        Top level: module_count, peak_module, peak_module_hbm_gib, top_buffer, top_buffer_mib
        (with `module`: module, module_hbm_gib, buffer_count, top_buffer, top_buffer_mib).
        `module` may be the full name (`jit_f(1219…)`), or a unique base name or prefix.
        Detail: modules (20), each with top_buffers (20). NotAvailable without HLO modules.
        """
        return self._view(f"peak_allocations(module={module!r})", lambda: self._build_peak_allocations(module))

    def kernel_stats(self, top_n: int = DEFAULT_TOP_N) -> dict:
        """GPU kernels (XProf's kernel_stats converter).

        Top level: kernel_count, kernel_launches, total_kernel_time_ms, top_kernel,
        top_kernel_time_percent, tensor_core_time_percent, tensor_core_eligible_time_percent.
        Detail: kernels (top_n by total time: launch config, registers, occupancy, op).
        NotAvailable on TPUs (no kernel launches: see hlo_op_profile) and without kernel events.
        """
        return self._view(f"kernel_stats(top_n={int(top_n)})", lambda: self._build_kernel_stats(max(1, int(top_n))))

    # memoisation

    def _view(self, key: str, build: Callable[[], dict]) -> dict:
        with self._lock:
            if self.closed:
                raise RuntimeError(f"{self!r} is closed")
            if key not in self._views:
                started = time.perf_counter()
                try:
                    outcome: Any = build()
                except XdiagError as error:
                    outcome = error
                except Exception as error:
                    if self._unreadable:
                        raise ProfileError(self._unreadable) from error
                    raise
                self._views[key] = outcome
                self.timings_s[key] = round(time.perf_counter() - started, 4)
            outcome = self._views[key]
        if isinstance(outcome, Exception):
            raise outcome
        return copy.deepcopy(outcome)

    def _converted(self, tool_name: str, params: dict[str, Any], convert: Callable[[dict[str, Any]], Any]) -> Any:
        """One conversion (a LocalXprofClient.fetch) per converter and parameters; called by the router."""
        converter = _converter_name(tool_name)
        params = {k: v for k, v in params.items() if k not in _FETCH_PARAMS_IGNORED}
        key = converter + (json.dumps(params, sort_keys=True, default=str) if params else "")
        with self._lock:
            if key not in self._conversions:
                self.conversion_counts[key] += 1
                with _quiet() as stderr_lines:
                    try:
                        outcome: Any = convert(params)
                    except Exception as error:  # kept, so a failing conversion is not retried either
                        outcome = error
                data = outcome[1] if isinstance(outcome, tuple) and len(outcome) == 2 else outcome
                if data is None and self._unreadable is None:
                    self._unreadable = self._parse_failure(stderr_lines)
                self._conversions[key] = outcome
            outcome = self._conversions[key]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def _parse_failure(self, stderr_lines: Iterable[str]) -> str | None:
        """XProf's reason for not reading one of our files, from its error log lines."""
        ours = [str(path) for path in self._files]
        names = [path.name for path in self._files]
        for line in stderr_lines:
            if line[:1] in ("E", "F") and _PARSE_ERROR.search(line) and any(name in line for name in names):
                message = line.split("] ", 1)[-1].strip()
                for path, original in zip(ours, self.originals):
                    message = message.replace(path, str(original))
                return f"XProf cannot read the profile: {message}"
        return None

    def _check_readable(self) -> None:
        if self._unreadable:
            raise ProfileError(self._unreadable)

    def _fetch(self, tool_name: str, **params: Any) -> Any:
        """A converter's raw output for this session (through the router, so memoised)."""
        self._check_readable()
        _install_router()
        with _quiet():
            result = _xprof().client.get_client().fetch(tool_name, str(self.run_dir), **params)
        self._check_readable()
        return result[1] if isinstance(result, tuple) and len(result) == 2 else result

    def _page(self, tool_name: str, **params: Any) -> Any:
        """A converter's JSON output, parsed once; None when the converter gave nothing."""
        key = _converter_name(tool_name) + json.dumps(params, sort_keys=True, default=str)
        with self._lock:
            if key not in self._pages:
                data = self._fetch(tool_name, **params)
                if isinstance(data, bytes):
                    data = data.decode("utf-8", errors="replace")
                self._pages[key] = json.loads(data) if data else None
            return self._pages[key]

    def _tool(self, name: str, function: Callable[..., Any], **kwargs: Any) -> Any:
        """A CLI tool function's result for this session, parsed, once per name and arguments.

        The undecorated function is called: the decorated one reads and writes XProf's
        cross-process result cache, keyed by file content rather than by session."""
        key = name + json.dumps(kwargs, sort_keys=True, default=str)
        with self._lock:
            if key not in self._tools:
                self._check_readable()
                _install_router()
                undecorated = getattr(function, "__wrapped__", None)
                try:
                    with _quiet():
                        if undecorated is not None:
                            text = undecorated(str(self.run_dir), **kwargs)
                        else:
                            text = function(str(self.run_dir), bypass_cache=True, **kwargs)
                    outcome: Any = json.loads(text) if isinstance(text, str) else text
                except Exception as error:
                    outcome = error
                self._tools[key] = outcome
            outcome = self._tools[key]
        self._check_readable()
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    # shared pieces

    def _overview_tool(self) -> dict:
        try:
            return self._tool("get_overview", _xprof().overview)
        except (FileNotFoundError, ValueError, RuntimeError) as error:
            raise NotAvailable(f"XProf's overview_page has no data for this profile ({error})") from error

    def _device_type(self) -> str | None:
        with contextlib.suppress(XdiagError):
            return self._overview_tool().get("run_environment", {}).get("device_type")
        return None

    def _no_steps_reason(self) -> str:
        for row in _datatable_rows(_table_with(self._page("overview_page"), "severity")):
            message = str(row.get("message") or "")
            if "step" in message.lower():
                return f'no step markers (XProf: "{message.split(". ")[0].strip().rstrip(".")}")'
        return "XProf measured no step time in this profile (no step markers)"

    def _roofline_tool(self) -> dict:
        try:
            data = self._tool("get_roofline_model", _xprof().roofline, top_n=DEFAULT_TOP_N)
        except (FileNotFoundError, ValueError, RuntimeError) as error:
            raise NotAvailable(f"XProf's roofline_model failed on this profile ({error})") from error
        if data.get("status") == "NO_DATA" or "program" not in data:
            message = data.get("message", "no program row")
            raise NotAvailable(f"XProf's roofline_model has no data for this profile: {message}")
        if not data.get("total_operations_analyzed"):
            peak = _positive(data.get("device_info", {}).get("peak_flop_rate"))
            raise NotAvailable(
                "XProf's roofline_model analysed 0 HLO ops on this profile (no XLA ops with cost-model "
                "FLOPs and bytes" + ("" if peak else "; the device's peak FLOP rate is reported as 0") + ")"
            )
        return data

    def _roofline_gap(self) -> str | None:
        try:
            self._roofline_tool()
        except NotAvailable as error:
            return str(error)
        return None

    # builders

    def _build_overview(self) -> dict:
        summary = self._overview_tool()
        perf = summary.get("performance_summary", {})
        env = summary.get("run_environment", {})
        device_type = env.get("device_type")
        is_tpu = str(device_type or "").upper().startswith("TPU")
        roofline_gap = self._roofline_gap()
        step_time = _positive(perf.get("steptime_ms_average"))
        reasons = {
            "step_time_ms": self._no_steps_reason(),
            "step_time_stddev_ms": "no step time",
            "duty_cycle_percent": "XProf's overview reports the device duty cycle for TPUs only",
            "device_idle_percent": "XProf's overview reports device idle time for TPUs only",
            "mxu_utilization_percent": f"MXU utilisation is a TPU figure; this device is {device_type}",
        }
        roofline_keys = ("flop_rate_utilization_percent", "memory_bw_utilization_percent", "hbm_bw_utilization_percent")
        for key in (*roofline_keys, "bound_by"):
            reasons[key] = roofline_gap or "not in XProf's overview"
        reasons["custom_call_share_percent"] = _CUSTOM_CALL_REASON

        def roofline_figure(key: str) -> Any:
            return None if roofline_gap else _number(perf.get(key))

        page = self._page("overview_page")
        properties = _properties(page)
        top_ops = [
            {
                "operation": row.get("operation"),
                "category": row.get("category"),
                "self_time_percent": _scaled(row.get("selfTimePercent"), 100.0, 2),
            }
            for row in _datatable_rows(_table_with(page, "selfTimePercent"))[:DEFAULT_TOP_N]
        ]
        bound_by = perf.get("bound_by")
        result = {
            "device_type": device_type,
            "device_core_count": _int(env.get("device_core_count")),
            "host_count": _int(env.get("host_count")),
            "is_training": _bool(env.get("is_training")),
            "step_time_ms": step_time,
            "step_time_stddev_ms": _number(perf.get("steptime_ms_standard_deviation")) if step_time else None,
            "duty_cycle_percent": _number(perf.get("device_duty_cycle_percent")),
            "device_idle_percent": _number(perf.get("device_idle_time_percent")) if is_tpu else None,
            "mxu_utilization_percent": _number(perf.get("mxu_utilization_percent")) if is_tpu else None,
            "flop_rate_utilization_percent": roofline_figure("flop_rate_utilization_relative_to_roofline"),
            "memory_bw_utilization_percent": roofline_figure("memory_bw_utilization_relative_to_hw_limit"),
            "hbm_bw_utilization_percent": roofline_figure("hbm_bw_utilization_percent"),
            "bound_by": None if roofline_gap or bound_by in (None, "", "Unknown") else bound_by,
            "custom_call_share_percent": _number(perf.get("custom_call_share_pct")),
        }
        _with_reasons(result, reasons)
        result["detail"] = {
            "performance_summary": _clean(perf),
            "run_environment": _clean(env),
            "xprof_statement": properties.get("statement") or properties.get("input_conclusion") or None,
            "diagnostics": [
                {"severity": row.get("severity"), "message": row.get("message")}
                for row in _datatable_rows(_table_with(page, "severity"))[:DEFAULT_TOP_N]
            ],
            "top_ops": top_ops,
        }
        return result

    def _build_step_trace(self) -> dict:
        try:
            data = self._tool("get_step_trace", _xprof().step_trace, limit=DEFAULT_TOP_N)
        except (FileNotFoundError, ValueError, RuntimeError) as error:
            raise NotAvailable(f"XProf's step trace failed on this profile ({error})") from error
        summary = data.get("summary")
        if data.get("status") == "NO_DATA" or not summary or not _positive(summary.get("step_time_ms_average")):
            raise NotAvailable(f"XProf found no steps in this profile: {self._no_steps_reason()}")
        result = {
            "step_count": _int(summary.get("total_steps")),
            "step_time_ms": _number(summary.get("step_time_ms_average")),
            "step_time_min_ms": _number(summary.get("step_time_ms_min")),
            "step_time_max_ms": _number(summary.get("step_time_ms_max")),
            "step_time_stddev_ms": _number(summary.get("step_time_ms_stddev")),
            "compute_time_ms": _number(summary.get("compute_time_ms_average")),
            "compute_percent": _number(summary.get("compute_percent")),
            "communication_percent": _number(summary.get("communication_percent")),
            "infeed_percent": _number(summary.get("infeed_percent")),
            "outfeed_percent": _number(summary.get("outfeed_percent")),
            "idle_percent": _number(summary.get("idle_percent")),
            "primary_bottleneck": summary.get("primary_bottleneck"),
            "is_aggregate": bool(summary.get("is_aggregate")),
        }
        _with_reasons(result, {"step_count": "XProf gives aggregate figures only, without a step count"})
        result["detail"] = {
            "steps": _clean(data.get("step_breakdown", []))[:DEFAULT_TOP_N],
            "total_step_records": _int(data.get("total_records")),
            "note": summary.get("note") or summary.get("conclusion"),
        }
        return result

    def _build_kpi_metrics(self) -> dict:
        overview = self.overview()
        reasons = dict(overview.get("unavailable", {}))
        memory: dict | None = None
        try:
            memory = self.memory_profile()
        except NotAvailable as error:
            reasons["peak_hbm_gib"] = reasons["memory_capacity_gib"] = reasons["hbm_utilization_percent"] = str(error)
        roofline: dict | None = None
        with contextlib.suppress(NotAvailable):
            roofline = self.roofline()
        flop_rate_utilization = overview["flop_rate_utilization_percent"]
        provenance = roofline["flops_provenance"] if roofline else None
        if roofline and provenance in ("derived_from_shapes", "mixed"):
            # As get_kpi_metrics: custom-call FLOPs derived from shapes correct the cost model's 0.
            flop_rate_utilization = roofline["roofline_efficiency_percent"]
        result = {
            "step_time_ms": overview["step_time_ms"],
            "duty_cycle_percent": overview["duty_cycle_percent"],
            "mxu_utilization_percent": overview["mxu_utilization_percent"],
            "flop_rate_utilization_percent": flop_rate_utilization,
            "flops_provenance": provenance,
            "derived_flops_fraction": roofline["derived_flops_fraction"] if roofline else None,
            "peak_hbm_gib": memory["peak_hbm_gib"] if memory else None,
            "memory_capacity_gib": memory["memory_capacity_gib"] if memory else None,
            "hbm_utilization_percent": memory["hbm_utilization_percent"] if memory else None,
            "device_type": overview["device_type"],
            "device_core_count": overview["device_core_count"],
        }
        reasons.setdefault("flops_provenance", reasons.get("flop_rate_utilization_percent", "no roofline"))
        reasons.setdefault("derived_flops_fraction", reasons["flops_provenance"])
        _with_reasons(result, reasons)
        custom_call_warning = overview["detail"]["performance_summary"].get("custom_call_warning")
        result["detail"] = {"custom_call_warning": custom_call_warning} if custom_call_warning else {}
        return result

    def _build_device_information(self) -> dict:
        try:
            info = self._tool("get_device_information", _xprof().device_information)
        except (FileNotFoundError, ValueError, RuntimeError) as error:
            raise NotAvailable(f"XProf's roofline_model gives no device information ({error})") from error
        try:
            env = self._overview_tool().get("run_environment", {})
        except NotAvailable:
            env = {}
        units = info.get("units", {})
        detail: dict[str, Any] = {}
        for key, value in info.items():
            if key == "units":
                continue
            unit = units.get(key)
            if unit == "GFLOP/s" and not key.endswith("_gflops"):
                key += "_gflops"
            elif unit == "FLOP/byte":
                key += "_flop_per_byte"
            detail[key] = _clean(value)
        result = {
            "device_type": info.get("device_type") or env.get("device_type"),
            "device_core_count": _int(env.get("device_core_count")),
            "host_count": _int(env.get("host_count")),
            "peak_flop_rate_gflops": _positive(info.get("peak_flop_rate")),
            "peak_hbm_bw_gibs": _positive(info.get("peak_hbm_bw_gibs")),
            "peak_vmem_read_bw_gibs": _positive(info.get("peak_vmem_read_bw_gibs")),
            "peak_vmem_write_bw_gibs": _positive(info.get("peak_vmem_write_bw_gibs")),
            "hbm_ridge_point_flop_per_byte": _positive(info.get("hbm_ridge_point")),
            "megacore": _bool(info.get("megacore")),
            "has_cmem": _bool(info.get("has_cmem")),
        }
        if result["peak_flop_rate_gflops"] is None and result["peak_hbm_bw_gibs"] is None and not result["device_type"]:
            raise NotAvailable("XProf's roofline_model knows nothing about this device (no type, no peaks)")
        _with_reasons(result, {
            "peak_flop_rate_gflops": "XProf reports the peak FLOP rate as 0 (unknown) for this device",
            "hbm_ridge_point_flop_per_byte": "no ridge point without a peak FLOP rate",
            "peak_vmem_read_bw_gibs": "no VMEM read figure for this device",
            "peak_vmem_write_bw_gibs": "no VMEM write figure for this device",
            "megacore": "a TPU property",
            "has_cmem": "a TPU property",
        })
        result["detail"] = detail
        return result

    def _build_utilization(self) -> dict:
        if len(self._files) > 1:
            raise NotAvailable(f"XProf's utilization_viewer reads one trace; this session has {len(self._files)}")
        try:
            data = self._tool("get_utilization_viewer", _xprof().utilization)
        except (FileNotFoundError, ValueError, RuntimeError) as error:
            raise NotAvailable(f"XProf's utilization_viewer failed on this profile ({error})") from error
        if data.get("status") == "NO_DATA":
            raise NotAvailable(
                "XProf's utilization_viewer found no hardware performance-counter samples in this profile "
                f"(device: {self._device_type() or 'unknown'}); they are recorded only when the capture "
                "enables TPU performance counters"
            )
        result: dict[str, Any] = {key: _number(value) for key, value in data.items() if key.endswith("_percent")}
        metrics = _clean(data.get("metrics", {}))
        peaks = _clean(data.get("peak_sample_percent", {}))
        kept = sorted(metrics, key=lambda name: -(metrics[name] or 0))[:50]
        result["detail"] = {
            "metrics_percent": {name: metrics[name] for name in kept},
            "peak_sample_percent": {name: peaks[name] for name in kept if name in peaks},
            "basis": data.get("measurement_window", {}).get("basis"),
            "warnings": data.get("warnings", []),
        }
        return result

    def _build_smart_suggestions(self) -> dict:
        page = self._page("smart_suggestion")
        if page is None:
            raise NotAvailable("XProf's smart_suggestion converter returned nothing for this profile")
        suggestions = [
            {
                "rule": item.get("ruleName") or item.get("rule_name"),
                "text": re.sub(r"<[^>]+>", "", str(item.get("suggestionText") or item.get("suggestion_text"))).strip(),
            }
            for item in page.get("suggestions", [])
            if isinstance(item, dict)
        ]
        return {"suggestion_count": len(suggestions), "detail": {"suggestions": suggestions[:DEFAULT_TOP_N]}}

    def _build_roofline(self) -> dict:
        data = self._roofline_tool()
        program = data["program"]
        device = data.get("device_info", {})
        result = {
            "roofline_efficiency_percent": _number(program.get("roofline_efficiency_percent")),
            "compute_efficiency_percent": _number(program.get("compute_efficiency_percent")),
            "max_mem_bw_utilization_percent": _number(program.get("max_mem_bw_utilization_percent")),
            "hbm_bw_utilization_percent": _number(program.get("hbm_bw_utilization_percent")),
            "bound_by": program.get("bound_by") if program.get("bound_by") not in (None, "", "Unknown") else None,
            "operational_intensity_flop_per_byte": _number(program.get("operational_intensity_flop_per_byte")),
            "bottleneck_operational_intensity_flop_per_byte": _number(
                program.get("bottleneck_operational_intensity_flop_per_byte")
            ),
            "bound_by_ridge_point_flop_per_byte": _positive(program.get("bound_by_ridge_point_flop_per_byte")),
            "measured_flop_rate_gflops": _number(program.get("measured_flop_rate_gflops")),
            "measured_memory_bw_gibs": _number(program.get("measured_memory_bw_gibs")),
            "hbm_bw_gibs": _number(program.get("hbm_bw_gibs")),
            "peak_flop_rate_gflops": _positive(device.get("peak_flop_rate")),
            "peak_hbm_bw_gibs": _positive(device.get("peak_hbm_bw_gibs")),
            "total_time_ms": _number(program.get("total_time_ms")),
            "flops_provenance": program.get("flops_provenance"),
            "derived_flops_fraction": _number(program.get("derived_flops_fraction")),
            "has_opaque_custom_calls": bool(program.get("has_opaque_custom_calls")),
            "custom_call_share_percent": _number(data.get("custom_call_share_pct")),
            "ops_analyzed": _int(data.get("total_operations_analyzed")),
        }
        _with_reasons(result, {
            "custom_call_share_percent": _CUSTOM_CALL_REASON,
            "bound_by_ridge_point_flop_per_byte": "no ridge point for this bound",
            "peak_flop_rate_gflops": "XProf reports the peak FLOP rate as 0 (unknown) for this device",
        })
        top = []
        for op in data.get("top_operations", [])[:DEFAULT_TOP_N]:
            top.append(_clean(op))
        result["detail"] = {
            "top_operations": top,
            "device_info": _clean({k: v for k, v in device.items() if k != "units"}),
            "custom_call_warning": data.get("custom_call_warning"),
            "note": (
                "total_time_ms sums op time over all cores; measured_memory_bw_gibs counts every memory space, "
                "compare hbm_bw_gibs with peak_hbm_bw_gibs"
            ),
        }
        return result

    def _build_hlo_op_profile(self, top_n: int) -> dict:
        try:
            categories = self._tool("get_hlo_op_profile", _xprof().hlo_op_profile, view="category", top_n=0)
            ops = self._tool("get_top_hlo_ops", _xprof().top_hlo_ops, limit=0)
        except (FileNotFoundError, ValueError, RuntimeError) as error:
            raise NotAvailable(f"XProf's op_profile has no HLO ops for this profile ({error})") from error
        summary = categories.get("category_summary", [])
        total_ms = _number(categories.get("total_profile_time_ms"))
        busy = [c for c in summary if str(c.get("category", "")).upper() != "IDLE"]
        if not busy:
            raise NotAvailable(
                f"XProf's op_profile holds no HLO ops on this profile, only idle time ({total_ms} ms): "
                "the profile has no XLA programs on the device"
            )
        idle_ms = sum(_number(c.get("total_self_time_ms")) or 0.0 for c in summary if c not in busy)

        def op_row(op: dict) -> dict:
            # "by_program/jit_dot(49)/custom-call/custom-call.1 [jit(dot)/dot_general:]": the label in
            # brackets (provenance or custom-call target) may itself contain slashes.
            path, bracket, label = str(op.get("name", "")).partition(" [")
            parts = path.split("/")
            source = f"{op['source_file']}:{op.get('source_line', 0)}" if op.get("source_file") else None
            self_ms = _number(op.get("total_self_time_ms"))
            return {
                "name": parts[-1] + (bracket + label if bracket else ""),
                "program": parts[1] if len(parts) > 2 and parts[0] == "by_program" else None,
                "category": op.get("category"),
                "self_time_ms": _round(self_ms, 4),
                "time_percent": _percent(self_ms, total_ms),
                "occurrences": _int(op.get("occurrences")),
                "flops": _number(op.get("flops")),
                "bytes_accessed": _number(op.get("bytes_accessed")),
                "flops_provenance": op.get("flops_provenance"),
                "source": source,
            }

        def busy_ops(key: str, measure: str | None = None) -> list[dict]:
            return [
                op
                for op in ops.get(key, [])
                if str(op.get("category", "")).upper() != "IDLE"
                and not str(op.get("name", "")).endswith("IDLE")
                and (measure is None or (_number(op.get(measure)) or 0) > 0)
            ]

        by_time = [op_row(op) for op in busy_ops("top_by_time")]
        top_category = busy[0]
        result = {
            "total_time_ms": _round(total_ms, 4),
            "idle_percent": _percent(idle_ms, total_ms),
            "op_count": len(by_time),
            "category_count": len(busy),
            "top_category": top_category.get("category"),
            "top_category_percent": _percent(_number(top_category.get("total_self_time_ms")), total_ms),
            "top_op": by_time[0]["name"] if by_time else None,
            "top_op_percent": by_time[0]["time_percent"] if by_time else None,
            "detail": {
                "categories": [
                    {
                        "category": c.get("category"),
                        "self_time_ms": _number(c.get("total_self_time_ms")),
                        "time_percent": _percent(_number(c.get("total_self_time_ms")), total_ms),
                        "op_count": _int(c.get("op_count")),
                        "flops": _number(c.get("total_flops")),
                        "bytes_accessed": _number(c.get("bytes_accessed")),
                        "top_op": c.get("top_op"),
                    }
                    for c in summary[:top_n]
                ],
                "top_ops_by_time": by_time[:top_n],
                "top_ops_by_flops": [op_row(op) for op in busy_ops("top_by_flops", "flops")[:top_n]],
                "top_ops_by_bytes": [op_row(op) for op in busy_ops("top_by_bytes_accessed", "bytes_accessed")[:top_n]],
                "note": (
                    "total_time_ms and self times are core time summed over all cores; flops come from XLA's "
                    "cost model (shape-derived for custom calls)"
                ),
            },
        }
        return result

    def _memory_documents(self) -> list[tuple[str | None, dict]]:
        if len(self._files) == 1:
            hosts: list[str | None] = [None]
        else:
            hosts = [path.name.removesuffix(_XPLANE_SUFFIX) for path in self._files]
        documents = []
        for host in hosts:
            try:
                page = self._page("memory_profile", **({"host": host} if host else {}))
            except (ValueError, OSError, RuntimeError) as error:
                log.debug("memory_profile for host %s failed: %s", host, error)
                continue
            if isinstance(page, dict):
                documents.append((host, page))
        return documents

    def _build_memory_profile(self) -> dict:
        allocators: list[dict] = []
        raw_by_name: dict[str, dict] = {}
        for host, document in self._memory_documents():
            for name, allocator in document.get("memoryProfilePerAllocator", {}).items():
                summary = allocator.get("profileSummary", {})
                peak = summary.get("peakStats", {})
                label = f"{host}:{name}" if host else str(name)
                lowered = str(name).lower()
                allocators.append({
                    "allocator": label,
                    "kind": "host" if "host" in lowered or lowered.startswith("cpu") else "device",
                    "capacity_gib": _gib(summary.get("memoryCapacity")),
                    "peak_in_use_gib": _gib(peak.get("peakBytesInUse")),
                    "peak_in_use_bytes": _int(peak.get("peakBytesInUse")),
                    "peak_lifetime_gib": _gib(summary.get("peakBytesUsageLifetime")),
                    "heap_at_peak_gib": _gib(peak.get("heapAllocatedBytes")),
                    "stack_at_peak_gib": _gib(peak.get("stackReservedBytes")),
                    "free_at_peak_gib": _gib(peak.get("freeMemoryBytes")),
                    "fragmentation_at_peak_percent": _scaled(peak.get("fragmentation"), 100.0, 2),
                    "peak_time_ms": _scaled(summary.get("peakStatsTimePs"), 1e-9, 3),
                    "_capacity_bytes": _int(summary.get("memoryCapacity")),
                })
                raw_by_name[label] = allocator
        if not allocators:
            raise NotAvailable(
                "XProf's memory_profile found no allocator activity in this profile "
                "(no memory allocation events were traced)"
            )
        devices = [a for a in allocators if a["kind"] == "device" and (a["peak_in_use_bytes"] or 0) > 0]
        if not devices:
            raise NotAvailable("XProf's memory_profile has host allocators only, no device memory activity")
        # XProf's allocator order varies from run to run; ties (TPU cores at the same peak) go to the lowest name.
        peak = min(devices, key=lambda a: (-a["peak_in_use_bytes"], _natural(a["allocator"])))
        capacity = peak["_capacity_bytes"] if (peak["_capacity_bytes"] or 0) > 0 else None
        result = {
            "peak_hbm_gib": peak["peak_in_use_gib"],
            "peak_hbm_bytes": peak["peak_in_use_bytes"],
            "memory_capacity_gib": _gib(capacity) if capacity else None,
            "hbm_utilization_percent": _percent(peak["peak_in_use_bytes"], capacity),
            "peak_allocator": peak["allocator"],
            "heap_at_peak_gib": peak["heap_at_peak_gib"],
            "stack_at_peak_gib": peak["stack_at_peak_gib"],
            "free_at_peak_gib": peak["free_at_peak_gib"],
            "fragmentation_at_peak_percent": peak["fragmentation_at_peak_percent"],
            "device_allocator_count": len([a for a in allocators if a["kind"] == "device"]),
        }
        no_capacity = "the allocator reports no capacity"
        _with_reasons(result, {"memory_capacity_gib": no_capacity, "hbm_utilization_percent": no_capacity})
        for allocator in allocators:
            allocator.pop("_capacity_bytes")
        allocators.sort(key=lambda a: (a["kind"] != "device", -(a["peak_in_use_bytes"] or 0), _natural(a["allocator"])))
        result["detail"] = {
            "allocators": allocators[:DEFAULT_TOP_N],
            "largest_allocations_at_peak": _allocations_at_peak(raw_by_name[peak["allocator"]])[:DEFAULT_TOP_N],
            "note": (
                "capacity is that of the allocator holding the peak (XProf's get_memory_profile takes the largest "
                "capacity of any allocator, host included)"
            ),
        }
        return result

    def _build_peak_allocations(self, module: str | None) -> dict:
        try:
            data = self._tool("get_peak_allocations", _xprof().peak_allocations, limit=0)
        except (FileNotFoundError, ValueError, RuntimeError) as error:
            raise NotAvailable(
                "the profile has no XLA HLO modules with a buffer assignment, so XProf's memory_viewer "
                f"has nothing to show ({error})"
            ) from error
        modules = data.get("modules", [])
        if not modules:
            raise NotAvailable("XProf's memory_viewer returned no HLO module buffers for this profile")
        if module is not None:
            modules = [_resolve_module(modules, module)]
        rows = [
            {
                "module": m.get("module_name"),
                "total_hbm_mib": _round(_number(m.get("total_hbm_mib")), 3),
                "buffer_count": len(m.get("top_buffers", [])),
                "top_buffers": [
                    {"instruction": b.get("instruction"), "size_mib": _round(_number(b.get("size_mib")), 3)}
                    for b in m.get("top_buffers", [])[:DEFAULT_TOP_N]
                ],
            }
            for m in modules[:DEFAULT_TOP_N]
        ]
        first = rows[0]
        top_buffer = first["top_buffers"][0] if first["top_buffers"] else {}
        hbm_gib = _round((first["total_hbm_mib"] or 0) / 1024, 3)
        if module is None:
            result = {
                "module_count": len(modules),
                "peak_module": first["module"],
                "peak_module_hbm_gib": hbm_gib,
            }
        else:
            result = {"module": first["module"], "module_hbm_gib": hbm_gib, "buffer_count": first["buffer_count"]}
        result["top_buffer"] = top_buffer.get("instruction")
        result["top_buffer_mib"] = top_buffer.get("size_mib")
        result["detail"] = {
            "modules": rows,
            "note": (
                "buffers under 1 MiB are summed into 'Others'; same-size buffers of one base name are summed "
                "into 'name.*'"
            ),
        }
        return result

    def _build_kernel_stats(self, top_n: int) -> dict:
        page = self._page("kernel_stats")
        rows = _datatable_rows(page) if page is not None else []
        if not rows:
            device_type = self._device_type() or "unknown"
            if device_type.upper().startswith("TPU"):
                raise NotAvailable(
                    f"XProf's kernel_stats lists GPU kernel launches; a TPU ({device_type}) runs XLA ops "
                    "without kernel launches, see hlo_op_profile"
                )
            raise NotAvailable(
                f"XProf's kernel_stats found no GPU kernel events in this profile (device: {device_type})"
            )
        rows.sort(key=lambda r: -(_number(r.get("total_duration_us")) or 0.0))
        total_us = sum(_number(r.get("total_duration_us")) or 0.0 for r in rows)

        def time_where(flag: str) -> float:
            return sum(_number(r.get("total_duration_us")) or 0.0 for r in rows if _bool(r.get(flag)))

        kernels = [
            {
                "kernel_name": r.get("kernel_name"),
                "op_name": r.get("op_name") or None,
                "occurrences": _int(r.get("occurrences")),
                "total_duration_us": _number(r.get("total_duration_us")),
                "avg_duration_us": _number(r.get("avg_duration_us")),
                "min_duration_us": _number(r.get("min_duration_us")),
                "max_duration_us": _number(r.get("max_duration_us")),
                "time_percent": _percent(_number(r.get("total_duration_us")), total_us),
                "registers_per_thread": _positive(r.get("registers_per_thread")),
                "shmem_bytes": _non_negative(r.get("shmem_bytes")),
                "block_dim": r.get("block_dim"),
                "grid_dim": r.get("grid_dim"),
                "occupancy_percent": _positive(r.get("occupancy_pct")),
                "uses_tensor_core": _bool(r.get("is_kernel_using_tensor_core")),
                "op_tensor_core_eligible": _bool(r.get("is_op_tensor_core_eligible")),
            }
            for r in rows[:top_n]
        ]
        return {
            "kernel_count": len(rows),
            "kernel_launches": sum(_int(r.get("occurrences")) or 0 for r in rows),
            "total_kernel_time_ms": round(total_us / 1000.0, 4),
            "top_kernel": kernels[0]["kernel_name"],
            "top_kernel_time_percent": kernels[0]["time_percent"],
            "tensor_core_time_percent": _percent(time_where("is_kernel_using_tensor_core"), total_us),
            "tensor_core_eligible_time_percent": _percent(time_where("is_op_tensor_core_eligible"), total_us),
            "detail": {
                "kernels": kernels,
                "note": (
                    "one row per kernel, op and launch configuration; registers and occupancy are None where the "
                    "trace does not record them (0 in XProf)"
                ),
            },
        }


def _natural(name: str) -> tuple:
    """Sort key that puts GPU_2_bfc before GPU_10_bfc."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name))


def _allocations_at_peak(allocator: dict) -> list[dict]:
    """XProf's active allocations at the allocator's peak, largest first."""
    snapshots = allocator.get("memoryProfileSnapshots", [])
    specials = allocator.get("specialAllocations", [])
    rows = []
    for active in allocator.get("activeAllocations", []):
        snapshot, special = _int(active.get("snapshotIndex")), _int(active.get("specialIndex"))
        if snapshot is not None and 0 <= snapshot < len(snapshots):
            meta = snapshots[snapshot].get("activityMetadata", {})
        elif special is not None and 0 <= special < len(specials):
            meta = specials[special]
        else:
            continue
        size = _non_negative(meta.get("allocationBytes")) or 0
        rows.append({
            "op_name": meta.get("tfOpName") or None,
            "size_mib": round(size / _MIB, 3),
            "requested_mib": round((_non_negative(meta.get("requestedBytes")) or 0) / _MIB, 3),
            "occurrences": _int(active.get("numOccurrences")) or 1,
            "region_type": meta.get("regionType") or None,
            "data_type": meta.get("dataType") if meta.get("dataType") not in (None, "", "INVALID") else None,
            "shape": meta.get("tensorShape") if meta.get("tensorShape") not in (None, "", "unknown") else None,
        })
    rows.sort(key=lambda r: (-r["size_mib"] * r["occurrences"], r["op_name"] or ""))
    return rows


def _resolve_module(modules: list[dict], wanted: str) -> dict:
    """A module by full name (`jit_f(123)`), unique base name (`jit_f`) or unique prefix."""
    names = [str(m.get("module_name")) for m in modules]
    for matcher in (
        lambda name: name == wanted,
        lambda name: name.split("(")[0] == wanted,
        lambda name: name.startswith(wanted),
    ):
        matches = [m for m, name in zip(modules, names) if matcher(name)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise NotAvailable(
                f"HLO module {wanted!r} is ambiguous: {', '.join(str(m.get('module_name')) for m in matches[:10])}"
            )
    raise NotAvailable(f"no HLO module {wanted!r} in this profile; modules: {', '.join(names[:10])}")
