"""XProf's own analyses of one device (TPU/GPU) profile session, in-process, each computed at most once.

`XprofViews` puts the session's `*.xplane.pb` files in a private
`<workdir>/plugins/profile/<session>/` (XProf's converters write `ALL_HOSTS.op_stats_v2.pb`,
`*.hlo_proto.pb` … next to their input, so never next to the originals): a link to each file, or, where
its host plane holds events XProf makes no use of, a copy without them (`xdiag.profile.slim`: the Python
tracer's events, and for the audited xprof version the stat-less events whose names it gives no meaning,
`host_events`; the views are the same, XProf's conversions a third as long on such profiles), and the HLO protos
XProf's memory viewer reads, extracted from the metadata plane alone (`extract_hlo_protos`). It answers each view by
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

Concurrently, where one process runs every tool (`xdiag analyze`): `prefetch()` starts the
conversions the views need in worker processes (XProf's C++ holds the GIL, so threads would not
overlap), each converter family once (the converters that read op_stats, smart_suggestion aside, in
one group), in its own folder of links to the same file; the views then
wait for those results instead of converting. The results are the same as in-process ones
(tests/test_xprof_views.py compares them); `XDIAG_XPROF_PROCESSES=0` turns it off, and sessions
under 16 MiB (worker.PREFETCH_MIN_BYTES) convert in-process unless it is set. `xdiag analyze` calls it as soon
as the session is located, before its own imports, and the loader before its read where no caller did
(`xdiag.analysis.xprof.start_views`), so the conversions overlap both; the workers' forkserver starts
(`worker.start_server`) before the private copy is written, with mimalloc as the workers' malloc
(`worker.ALLOCATOR_ENV`). The workers of every group but the first, which the first view waits for, run at a
lower priority (worker.LATER_GROUPS_NICENESS). A view about to wait for a worker first does the work the views will
need that no conversion still in a worker holds up (`_work_while_waiting`), and once every conversion is taken the
workers exit, freeing their memory while the analysis goes on.

Memory: each conversion holds 8-26x the bytes it reads while it runs (`memory_budget`). `prefetch` starts only as
many workers as fit side by side in the memory available, and a conversion that would not fit at all is not started:
the views it feeds raise `ConversionTooLarge` (a NotAvailable) with the estimate, the budget and what to do, instead
of the OOM killer ending the analysis; the HLO-module views (peak_allocations) still answer.

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
  all     NA: no hardware performance-counter samples in the trace (known without converting: no
          file holds the `counter_value` stat name)
smart_suggestions
  all     0 suggestions (known without converting: no file holds the name `barrier-cores`)
roofline
  TPU     4.35% of roofline, HBM bound, HBM 66.3 GiB/s, 4.47 GFLOP/s, 17 ops
  V100    NA: 0 HLO ops analysed, peak FLOP rate 0
  MI300X  1.26%, HBM bound, 16 ops / 2.12%, HBM bound, opaque custom calls
hlo_op_profile
  TPU     copy-done 83.6% of 363.7 s core time, idle 13.4%, top op copy-done.4 (21.4%)
  V100    NA: op_profile holds only IDLE (no XLA programs)
  H200    6 of the 9 in tests/: NA, only IDLE (their XLA kernels run from command buffers, CUDA graphs)
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
0.37 s, V100 0.33 s, MI300X gemm 0.16 s, conv 0.15 s. The first view pays XProf's op_stats
conversion and native start-up (overview 0.11-0.25 s); memory_profile 3-60 ms (1.9 MB of JSON on
the V100), peak_allocations 10-30 ms (one memory_viewer conversion per HLO module), every other
view under 60 ms, and every repeated call is a dictionary look-up. XProf's CLI, one process per
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

Two conversions whose answer a scan of the files' bytes can tell in advance are not run where it
can (they cost seconds each on large profiles, as much as the op_stats conversion):
- utilization_viewer builds rows only from events carrying the `counter_value` stat (hardware
  performance-counter samples); a file without that stat name has none, and the answer is NO_DATA.
- smart_suggestion in xprof 2.24.2 registers one rule, BarrierCoresRule: a suggestion when events
  named `barrier-cores` take 10% of their steps or more (it preprocesses every XSpace to measure
  that). Without that name in a file it suggests nothing. Other xprof versions are converted.
`may_have_counter_samples` / `may_have_suggestions` say which; tests/test_xprof_views.py compares
these answers with the converters' own on every real device profile.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import copy
import functools
import importlib.metadata
import json
import logging
import mmap
import os
import re
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from xdiag.analysis.xprof import (
    device_information,
    hlo_op_profile,
    host_events,
    kernel_stats,
    kpi_metrics,
    memory_budget,
    memory_profile,
    overview,
    peak_allocations,
    roofline,
    smart_suggestions,
    step_trace,
    utilization,
    worker,
)
from xdiag.analysis.xprof.common import DEFAULT_TOP_N, XPLANE_SUFFIX, as_positive, datatable_rows, table_with, xprof_api
from xdiag.analysis.xprof.worker import flush_stderr
from xdiag.errors import NotAvailable, ProfileError, XdiagError
from xdiag.profile import slim
from xdiag.profile.reader import plane_names

log = logging.getLogger(__name__)


_FETCH_PARAMS_IGNORED = frozenset({"format", "tqx", "bypass_cache", "use_saved_result"})
"""Fetch parameters that do not change what a converter returns (see raw_to_tool_data)."""
_PARSE_ERROR = re.compile(r"can't parse|cannot parse|failed to parse|data_loss|not a valid", re.IGNORECASE)
_SHORT_READ = "Read less bytes than requested"
"""What XProf logs, naming no file, when a file ends before its protobuf does (a truncated profile)."""
_HLO_PROTO_CONVERTERS = frozenset({"memory_viewer", "graph_viewer"})
"""Converters that read the HLO protos `extract_hlo_protos` puts in the run folder, not the XSpace: their memory is
that of one HLO module, so `memory_budget` does not hold them back."""


class ConversionTooLarge(NotAvailable):
    """An XProf conversion not started because it would not fit in memory (`memory_budget.refusal` says why)."""


def view_key(method: str, **arguments: Any) -> str:
    """The key a view is memoised under (and stored under, `xdiag.analysis.xprof.stored`): its name, with its
    arguments (top_n as an int, module as its repr) where it takes any."""
    if not arguments:
        return method
    shown = ", ".join(f"{name}={int(value) if name == 'top_n' else value!r}" for name, value in arguments.items())
    return f"{method}({shown})"


# --- numbers -------------------------------------------------------------------------------


# --- keeping XProf quiet --------------------------------------------------------------------


class _DemoteXprofRecords(logging.Filter):
    """Drops log records emitted from xprof's own modules and re-logs them at DEBUG here."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.pathname.startswith(xprof_api().package_dir):
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
                flush_stderr()
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
        flush_stderr()
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
        self._local = xprof_api().client.LocalXprofClient()

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
        if owner is None and path.endswith(XPLANE_SUFFIX):
            owner = _OWNERS.get(os.path.dirname(path))
    return owner


def _install_router() -> None:
    """Puts the router in front of XProf's client (again, if someone replaced it since)."""
    client_module = xprof_api().client
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
        name = path.name if path.name.endswith(XPLANE_SUFFIX) else path.name + XPLANE_SUFFIX
        if name in names:
            name = f"{path.parent.name}_{name}"
        stem, suffix = name.removesuffix(XPLANE_SUFFIX), XPLANE_SUFFIX
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


def _copy_without_unused_events(original: Path, target: Path) -> int:
    """Events left out of the copy written to `target`; 0 where none were (nothing written: link the original).
    A file the copy cannot walk goes to XProf as it is, to get XProf's own reason."""
    try:
        return slim.write_without_unused_events(original, target, host_events.unread_name_filter(_xprof_version()))
    except (ProfileError, OSError) as error:
        log.debug("%s goes to XProf as it is: %s", original, error)
        return 0


def _remove_private_copy(path: str, xprof_side_files: list[str], worker_folders: list[str]) -> None:
    shutil.rmtree(path, ignore_errors=True)
    for folder in worker_folders:
        shutil.rmtree(folder, ignore_errors=True)
    for side_file in xprof_side_files:
        with contextlib.suppress(OSError):
            os.unlink(side_file)


# --- conversions in other processes -------------------------------------------------------------

_OP_STATS_CONVERTERS = ("overview_page", "roofline_model", "op_profile", "pod_viewer", "kernel_stats")
"""Converters that share the op_stats XProf saves in their folder: one process converts them in turn,
the first computing op_stats and the others reusing them, as they do in-process (kernel_stats is a
table of op_stats' kernel_stats_db: in a process of its own it would compute op_stats again).
smart_suggestion reads op_stats too but is not among them: it also builds a memory profile of its
own (seconds on large profiles), which would lengthen this process, and its saved result changes the
folder's op_stats signature, so a converter after it would compute op_stats again."""


def _planned_conversions(
    files: Sequence[Path], counter_samples: bool, suggestions: bool
) -> list[list[tuple[str, dict[str, Any]]]]:
    """The conversions the views ask for, grouped by process: the op_stats group first (the first view, the
    overview, waits for it; prefetch lowers the priority of the later ones), then the rest. Parameters are
    the ones the views' fetches carry once the ignored ones are dropped, so the memo keys match.
    Without possible counter samples or suggestions the views do not ask for those conversions."""
    groups: list[list[tuple[str, dict[str, Any]]]] = [[(name, {}) for name in _OP_STATS_CONVERTERS]]
    if suggestions:
        groups.append([("smart_suggestion", {})])
    if len(files) == 1:
        groups.append([("memory_profile", {})])
        if counter_samples:
            groups.append([("utilization_viewer", {})])
    else:  # utilization_viewer takes one trace only, so the view does not ask; memory_profile goes per host
        groups += [[("memory_profile", {"host": path.name.removesuffix(XPLANE_SUFFIX)})] for path in files]
    return groups


def _settle(placeholder: concurrent.futures.Future, done: concurrent.futures.Future) -> None:
    if done.cancelled():
        placeholder.set_exception(RuntimeError("cancelled"))
    elif done.exception() is not None:
        placeholder.set_exception(done.exception())
    else:
        placeholder.set_result(done.result())


# --- answers known from the files' bytes -------------------------------------------------------

_COUNTER_SAMPLE_STAT = b"counter_value"
"""The stat utilization_viewer takes performance-counter samples from (XProf's StatType kCounterValue)."""
_COMMAND_BUFFER = b"command_buffer"
"""The HLO op name (`command_buffer`, `command_buffer.3`) of kernels XLA:GPU replays from a CUDA graph."""
_BARRIER_CORES_EVENT = b"barrier-cores"
"""The event xprof 2.24.2's only smart-suggestion rule (BarrierCoresRule) measures."""
_SMART_SUGGESTION_AUDITED_VERSION = "2.24.2"
"""The xprof version whose smart_suggestion rule set was read (the wheel registers BarrierCoresRule only)."""


@functools.cache
def _xprof_version() -> str | None:
    try:
        return importlib.metadata.version("xprof")
    except importlib.metadata.PackageNotFoundError:
        return None


def _file_holds(path: Path, name: bytes) -> bool:
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        return mapped.find(name) >= 0


# --- the views ----------------------------------------------------------------------------------


class XprofViews:
    """XProf's converters over one session's xplane files, on a private copy, each view computed once.

    Every view returns a JSON-serialisable dict (numbers are numbers, units in key names, None
    where XProf has no value and `unavailable` saying why, bounded `detail`), or raises
    `NotAvailable` with the reason, or `ProfileError` when XProf cannot read the files.
    Thread-safe; instances on different sessions may run concurrently.
    """

    def __init__(
        self,
        xplane_paths: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
        workdir: Path | None = None,
        all_events: bool = False,
    ):
        """`all_events=True` gives XProf the files as they are; by default the private copy leaves out the host
        events XProf's views make no use of (`xdiag.profile.slim`, `host_events`)."""
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
        self.files: list[Path] = []
        self.events_left_out = 0
        """Host events the private copy leaves out, all files together."""
        try:
            for original, name in zip(originals, _link_names(originals)):
                left_out = 0 if all_events else _copy_without_unused_events(original, self.run_dir / name)
                if not left_out:
                    _link_or_copy(original, self.run_dir / name)
                self.events_left_out += left_out
                self.files.append(self.run_dir / name)
        except OSError as error:
            shutil.rmtree(root if workdir is None else self.run_dir, ignore_errors=True)
            raise ProfileError(f"cannot set up the private copy in {self.run_dir}: {error}") from error
        self.xspace_bytes = sum(path.stat().st_size for path in self.files)
        """The bytes XProf's converters read (the private copy): what their memory is estimated from."""
        self._removable = str(root if workdir is None else self.run_dir)
        self._side_files: list[str] = []
        self._worker_folders: list[str] = []
        self._worker_run_dirs: list[Path] = []
        self._finalizer = weakref.finalize(
            self, _remove_private_copy, self._removable, self._side_files, self._worker_folders
        )

        self._lock = threading.RLock()
        self._conversions: dict[str, Any] = {}
        self._pending: dict[str, tuple[concurrent.futures.Future, int]] = {}  # key -> (worker's future, index)
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None
        self._workers = 0
        self._pages: dict[str, Any] = {}
        self._tools: dict[str, Any] = {}
        self._views: dict[str, Any] = {}
        self._unreadable: str | None = None
        self._too_large: str | None = None
        """Why conversions of this session are not started (`memory_budget.refusal`), once one was refused."""
        self._refusals = 0
        """How many times a fetch met a conversion refused for memory (`tool` tells its own calls by it)."""
        self._hlo_protos_extracted = False
        self._done_while_waiting: set[str] = set()
        self._mentioned: dict[bytes, bool] = {}
        self.conversion_counts: collections.Counter[str] = collections.Counter()
        """How often each conversion ran, keyed by converter and parameters; 1 each, by design."""
        self.worker_cpu_s: dict[str, float] = {}
        """CPU seconds of each conversion that ran in a worker process (see `prefetch`)."""
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

    @property
    def workers_converting(self) -> int:
        """How many worker processes `prefetch` started whose conversions are not all taken yet (0 for none)."""
        with self._lock:
            return self._workers if self._executor is not None and self._pending else 0

    def close(self) -> None:
        """Removes the private copy (and XProf's per-run-folder files under its cache folder)."""
        with self._lock:
            if self.closed:
                return
            with _OWNERS_LOCK:
                _OWNERS.pop(os.path.realpath(self.run_dir), None)
            if self._executor is not None:
                self._executor.shutdown(wait=True, cancel_futures=True)
                self._executor = None
            if self.conversion_counts:
                self._side_files.extend(self._xprof_side_files(self.run_dir))
            for run_dir in self._worker_run_dirs:
                self._side_files.extend(self._xprof_side_files(run_dir))
            self._finalizer()

    def _xprof_side_files(self, run_dir: Path) -> list[str]:
        """The fingerprint, owner and lock files LocalXprofClient keeps for a run folder of this session."""
        links = [run_dir / path.name for path in self.files]
        scopes = [[str(p) for p in links]] + ([[str(p)] for p in links] if len(links) > 1 else [])
        files: list[str] = []
        for paths in scopes:
            with contextlib.suppress(Exception):  # best effort: private API of xprof_client
                scope = xprof_api().client._compute_op_stats_scope(run_dir, paths)
                lock = scope.owner_dir / f"{scope.run_dir_hash}.lock"
                files += [str(scope.fp_file), str(scope.owner_file), str(lock)]
        return files

    def prefetch(self) -> int:
        """Starts the conversions the views need, concurrently, and returns at once.

        XProf's C++ converters hold the GIL, so they run in worker processes (at most
        `XDIAG_XPROF_PROCESSES`; by default the CPU count, or none for sessions under
        worker.PREFETCH_MIN_BYTES, whose conversions cost less than starting workers): the op_stats
        family in one group, every other converter in its own, the groups handed to the workers in
        turn, every group after the first at a lower priority. Each group works in its own folder of
        links to the same files (converters write side files next to their input, and a fresh op_stats
        conversion clears the folder's saved results), so the only shared copy is the one file itself. A view
        then waits for its conversion instead of running it; a conversion that failed in its worker
        runs again in-process. Returns how many processes were started (0: off, or already started).
        """
        allowed = worker.processes_allowed(self.xspace_bytes)
        fit = memory_budget.conversions_that_fit(self.xspace_bytes) if allowed else None
        if fit is not None and fit < allowed:
            log.debug("XProf conversions of %s: memory for %d at once, not %d", self.run_dir, fit, allowed)
            allowed = fit  # none: each view converts in-process, or answers why it cannot
        with self._lock:
            if self.closed:
                raise RuntimeError(f"{self!r} is closed")
            if allowed == 0 or self._executor is not None or self._unreadable:
                return 0
            groups = [
                [(name, params) for name, params in group if self._memo_key(name, params) not in self._conversions]
                for group in _planned_conversions(
                    self.files, self.may_have_counter_samples(), self.may_have_suggestions()
                )
            ]
            groups = [group for group in groups if group]
            if not groups:
                return 0
            workers = min(allowed, len(groups))
            planned = []
            try:
                for group in groups:
                    planned.append((self._worker_run_dir(group[0][0]), group, concurrent.futures.Future()))
            except OSError as error:  # no room for the folders: the views convert in-process on demand
                log.debug("XProf conversions stay in-process: %s", error)
                return 0
            for _, group, placeholder in planned:
                for index, (name, params) in enumerate(group):
                    self._pending[self._memo_key(name, params)] = (placeholder, index)
            self._executor = concurrent.futures.ProcessPoolExecutor(workers, mp_context=worker.context())
            self._workers = workers
        # Starting the forkserver takes a Python start-up and XProf's import: not on the caller's time.
        threading.Thread(
            target=self._submit, args=(self._executor, planned), name="xprof-prefetch", daemon=True
        ).start()
        return workers

    @staticmethod
    def _submit(executor: concurrent.futures.ProcessPoolExecutor, planned: list) -> None:
        try:
            worker.ensure_server()  # with its allocator, where `start_server` has not started it already
        except Exception as error:  # the first submit meets it again, and the views convert in-process
            log.debug("no forkserver for XProf's workers: %s", error)
        for index, (run_dir, group, placeholder) in enumerate(planned):
            try:
                niceness = worker.LATER_GROUPS_NICENESS if index else 0
                future = executor.submit(worker.convert, str(run_dir), group, niceness)
            except Exception as error:  # shut down meanwhile, or no processes here: the views convert in-process
                placeholder.set_exception(error)
                continue
            future.add_done_callback(lambda done, placeholder=placeholder: _settle(placeholder, done))

    def _worker_run_dir(self, label: str) -> Path:
        """A folder named like the private run folder, holding links to the same files."""
        folder = Path(tempfile.mkdtemp(prefix=f"xdiag-xprof-{label}-"))
        self._worker_folders.append(str(folder))
        run_dir = folder / self.run_dir.name
        run_dir.mkdir()
        for path in self.files:
            _link_or_copy(path.resolve(), run_dir / path.name)
        self._worker_run_dirs.append(run_dir)
        return run_dir

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
        return self._view("overview", lambda: overview.build(self))

    def step_trace(self) -> dict:
        """Per-step breakdown (pod_viewer / input_pipeline_analyzer, via get_step_trace).

        Top level: step_count, step_time_ms (average), step_time_min_ms, step_time_max_ms,
        step_time_stddev_ms, compute_time_ms, compute_percent, communication_percent,
        infeed_percent, outfeed_percent, idle_percent, primary_bottleneck, is_aggregate.
        Detail: steps (first 20). NotAvailable when the profile has no step markers.
        """
        return self._view("step_trace", lambda: step_trace.build(self))

    def kpi_metrics(self) -> dict:
        """XProf's get_kpi_metrics fields, assembled from this instance's overview, memory profile
        and roofline (nothing is converted again): step_time_ms, duty_cycle_percent,
        mxu_utilization_percent, flop_rate_utilization_percent, flops_provenance,
        derived_flops_fraction, peak_hbm_gib, memory_capacity_gib, hbm_utilization_percent,
        device_type, device_core_count."""
        return self._view("kpi_metrics", lambda: kpi_metrics.build(self))

    def device_information(self) -> dict:
        """Device peaks from the roofline model plus the run environment: device_type,
        device_core_count, host_count, peak_flop_rate_gflops, peak_hbm_bw_gibs,
        peak_vmem_read_bw_gibs, peak_vmem_write_bw_gibs, hbm_ridge_point_flop_per_byte,
        megacore, has_cmem. Detail: every property XProf gives, units in the names."""
        return self._view("device_information", lambda: device_information.build(self))

    def utilization(self) -> dict:
        """Hardware-counter utilisation (utilization_viewer): *percent_of per unit (HBM, MXU, ICI,
        vector ALU …) over the whole capture. NotAvailable without performance counters."""
        return self._view("utilization", lambda: utilization.build(self))

    def smart_suggestions(self) -> dict:
        """XProf's rule-based suggestions: suggestion_count; detail.suggestions (rule, text)."""
        return self._view("smart_suggestions", lambda: smart_suggestions.build(self))

    def roofline(self) -> dict:
        """Program roofline (get_roofline_model): roofline_efficiency_percent,
        compute_efficiency_percent, max_mem_bw_utilization_percent, hbm_bw_utilization_percent,
        bound_by, operational intensities and ridge point, measured_flop_rate_gflops,
        hbm_bw_gibs, peaks, total_time_ms, flops_provenance, derived_flops_fraction, ops_analyzed.
        Detail: top_operations (20, per-op roofline placement), device_info.
        NotAvailable when XProf analysed no HLO ops."""
        return self._view("roofline", lambda: roofline.build(self))

    def hlo_op_profile(self, top_n: int = DEFAULT_TOP_N) -> dict:
        """HLO ops by self time (op_profile, via get_hlo_op_profile and get_top_hlo_ops).

        Top level: total_time_ms (summed core time), idle_percent, op_count, category_count,
        top_category, top_category_percent, top_op, top_op_percent. Detail: categories,
        top_ops_by_time, top_ops_by_flops, top_ops_by_bytes (top_n rows each).
        NotAvailable when op_profile holds no HLO ops (only idle time).
        """
        return self._view(view_key("hlo_op_profile", top_n=top_n), lambda: hlo_op_profile.build(self, max(1, int(top_n))))

    def memory_profile(self) -> dict:
        """Device memory over the capture (memory_profile), per allocator.

        Top level: peak_hbm_gib, peak_hbm_bytes, memory_capacity_gib (of the allocator holding
        the peak), hbm_utilization_percent, peak_allocator, heap_at_peak_gib, stack_at_peak_gib,
        free_at_peak_gib, fragmentation_at_peak_percent, device_allocator_count. Detail:
        allocators (device and host), largest_allocations_at_peak (of the peak allocator).
        """
        return self._view("memory_profile", lambda: memory_profile.build(self))

    def peak_allocations(self, module: str | None = None) -> dict:
        """HLO modules by peak HBM and their largest buffers (memory_viewer, via get_peak_allocations).

        Top level: module_count, peak_module, peak_module_hbm_gib, top_buffer, top_buffer_mib
        (with `module`: module, module_hbm_gib, buffer_count, top_buffer, top_buffer_mib).
        `module` may be the full name (`jit_f(1219…)`), or a unique base name or prefix.
        Detail: modules (20), each with top_buffers (20). NotAvailable without HLO modules.
        """
        return self._view(view_key("peak_allocations", module=module), lambda: peak_allocations.build(self, module))

    def kernel_stats(self, top_n: int = DEFAULT_TOP_N) -> dict:
        """GPU kernels (XProf's kernel_stats converter).

        Top level: kernel_count, kernel_launches, total_kernel_time_ms, top_kernel,
        top_kernel_time_percent, tensor_core_time_percent, tensor_core_eligible_time_percent.
        Detail: kernels (top_n by total time: launch config, registers, occupancy, op).
        NotAvailable on TPUs (no kernel launches: see hlo_op_profile) and without kernel events.
        """
        return self._view(view_key("kernel_stats", top_n=top_n), lambda: kernel_stats.build(self, max(1, int(top_n))))

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

    @staticmethod
    def _memo_key(tool_name: str, params: dict[str, Any]) -> str:
        params = {k: v for k, v in params.items() if k not in _FETCH_PARAMS_IGNORED}
        return _converter_name(tool_name) + (json.dumps(params, sort_keys=True, default=str) if params else "")

    def _converted(self, tool_name: str, params: dict[str, Any], convert: Callable[[dict[str, Any]], Any]) -> Any:
        """One conversion (a LocalXprofClient.fetch) per converter and parameters; called by the router.
        A conversion `prefetch` started in a worker is waited for (outside the lock) and taken from it."""
        params = {k: v for k, v in params.items() if k not in _FETCH_PARAMS_IGNORED}
        key = self._memo_key(tool_name, params)
        with self._lock:
            pending = self._pending.get(key) if key not in self._conversions else None
        if pending is not None:
            self._take_from_worker(key, pending[0])
        with self._lock:
            if key not in self._conversions:
                too_large = None if _converter_name(tool_name) in _HLO_PROTO_CONVERTERS else (
                    memory_budget.refusal(self.xspace_bytes))
                if too_large is not None:  # kept too: the view answers why, and nothing is tried again
                    self._too_large = too_large
                    self._conversions[key] = ConversionTooLarge(too_large)
                else:
                    self.conversion_counts[key] += 1
                    with _quiet() as stderr_lines:
                        try:
                            outcome: Any = convert(params)
                        except Exception as error:  # kept, so a failing conversion is not retried either
                            outcome = error
                    self._keep_conversion(key, outcome, stderr_lines)
            outcome = self._conversions[key]
            if isinstance(outcome, ConversionTooLarge):
                self._refusals += 1
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def _take_from_worker(self, key: str, future: concurrent.futures.Future) -> None:
        """Waits for the worker's group that converts `key`, then keeps every conversion of that group."""
        if not future.done():
            self._work_while_waiting()
        try:
            results = future.result()
        except Exception as error:  # the worker died or could not start: the group converts in-process instead
            log.debug("XProf worker for %s failed (%s); converting in-process", key, error)
            results = None
        with self._lock:
            for taken, (group, position) in list(self._pending.items()):
                if group is not future:
                    continue
                del self._pending[taken]
                if results is None or taken in self._conversions:
                    continue
                outcome, stderr_text, cpu_s = results[position]
                self.conversion_counts[taken] += 1
                self.worker_cpu_s[taken] = round(cpu_s, 4)
                if stderr_text.strip():
                    log.debug("XProf stderr (%s, in a worker):\n%s", taken, stderr_text[-20_000:])
                self._keep_conversion(taken, outcome, stderr_text.splitlines())
            self._release_workers_when_done()

    def _work_while_waiting(self) -> None:
        """Work the views will ask for and that needs no conversion still in a worker, done by a thread about to wait
        for one instead of after: XProf's peak-allocation table (the HLO protos' extraction and a memory_viewer
        conversion per module, which no worker runs) from the start, and once the op_stats family is in hand, the
        CLI answers read from it (each parses op_profile's JSON: tens of ms apiece on the 85 MiB bench profile, while
        the views wait for memory_profile). Each once; whatever fails is left for its own view to meet and report
        (`tool` memoises the failure), never raised to the view that waits."""
        with self._lock:
            if self.closed or self._unreadable:
                return
            op_stats_in_hand = all(self._memo_key(name, {}) in self._conversions for name in _OP_STATS_CONVERTERS)
            work = {"peak_allocations": lambda: self.has_metadata_plane() and peak_allocations.every_module(self)}
            if op_stats_in_hand:
                work.update(roofline=self.roofline_tool, hlo_op_profile=lambda: hlo_op_profile.answers(self))
            for name, do in work.items():
                if name in self._done_while_waiting:
                    continue
                self._done_while_waiting.add(name)
                with contextlib.suppress(Exception):
                    do()

    def _release_workers_when_done(self) -> None:
        """Lets the workers exit once no conversion of theirs is still to be taken (called under the lock): they
        free their memory while the analysis goes on, and `close()` finds them gone instead of joining them."""
        if not self._pending and self._executor is not None:
            self._executor.shutdown(wait=False)

    def _keep_conversion(self, key: str, outcome: Any, stderr_lines: Iterable[str]) -> None:
        data = outcome[1] if isinstance(outcome, tuple) and len(outcome) == 2 else outcome
        if data is None and self._unreadable is None:
            self._unreadable = self._parse_failure(stderr_lines)
        self._conversions[key] = outcome

    def _parse_failure(self, stderr_lines: Iterable[str]) -> str | None:
        """XProf's reason for not reading one of our files, from its error log lines."""
        names = [path.name for path in self.files]
        for line in stderr_lines:
            if line[:1] not in ("E", "F"):
                continue
            if _PARSE_ERROR.search(line) and any(name in line for name in names):
                message = line.split("] ", 1)[-1].strip()
                for run_dir in (self.run_dir, *self._worker_run_dirs):
                    for name, original in zip(names, self.originals):
                        message = message.replace(str(run_dir / name), str(original))
                return f"XProf cannot read the profile: {message}"
            if _SHORT_READ in line:
                files = ", ".join(str(original) for original in self.originals)
                return f"XProf cannot read the profile: {files}: {_SHORT_READ.lower()} (it ends early: truncated?)"
        return None

    def _check_readable(self) -> None:
        if self._unreadable:
            raise ProfileError(self._unreadable)

    def fetch(self, tool_name: str, **params: Any) -> Any:
        """A converter's raw output for this session (through the router, so memoised)."""
        self._check_readable()
        _install_router()
        with _quiet():
            result = xprof_api().client.get_client().fetch(tool_name, str(self.run_dir), **params)
        self._check_readable()
        return result[1] if isinstance(result, tuple) and len(result) == 2 else result

    def page(self, tool_name: str, **params: Any) -> Any:
        """A converter's JSON output, parsed once; None when the converter gave nothing."""
        key = _converter_name(tool_name) + json.dumps(params, sort_keys=True, default=str)
        with self._lock:
            if key not in self._pages:
                data = self.fetch(tool_name, **params)
                if isinstance(data, bytes):
                    data = data.decode("utf-8", errors="replace")
                self._pages[key] = json.loads(data) if data else None
            return self._pages[key]

    def tool(self, name: str, function: Callable[..., Any], **kwargs: Any) -> Any:
        """A CLI tool function's result for this session, parsed, once per name and arguments.

        The undecorated function is called: the decorated one reads and writes XProf's
        cross-process result cache, keyed by file content rather than by session."""
        key = name + json.dumps(kwargs, sort_keys=True, default=str)
        with self._lock:
            if key not in self._tools:
                self._check_readable()
                _install_router()
                undecorated = getattr(function, "__wrapped__", None)
                refusals = self._refusals
                try:
                    with _quiet():
                        if undecorated is not None:
                            text = undecorated(str(self.run_dir), **kwargs)
                        else:
                            text = function(str(self.run_dir), bypass_cache=True, **kwargs)
                    outcome: Any = json.loads(text) if isinstance(text, str) else text
                except Exception as error:
                    outcome = error
                if self._refusals != refusals:  # XProf's tool functions turn a failed fetch into an error text
                    outcome = ConversionTooLarge(self._too_large)
                self._tools[key] = outcome
            outcome = self._tools[key]
        self._check_readable()
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def extract_hlo_protos(self) -> None:
        """Puts XProf's `<module>.hlo_proto.pb` files in the run folder, extracted from copies of the files that
        hold their metadata plane alone (`slim.write_metadata_plane`), once.

        XProf's memory viewer reads each HLO module from those files, and where the folder has none it extracts
        them by converting every file whole: one more parse of the profile (0.4 s on the 85 MiB bench profile).
        The modules are all on the metadata plane, so XProf's own extraction from the copies takes milliseconds
        and writes the same modules (tests/test_xprof_views.py compares the views both ways). Where a copy cannot
        be made, XProf extracts them from the files as before."""
        with self._lock:
            if self._hlo_protos_extracted or self.closed:
                return
            self._hlo_protos_extracted = True
            if any(self.run_dir.glob("*.hlo_proto.pb")):
                return
            moved: list[Path] = []
            try:
                scratch = Path(tempfile.mkdtemp(prefix="xdiag-hlo-protos-", dir=self.run_dir.parent.parent))
            except OSError as error:
                log.debug("XProf extracts the HLO protos of %s itself: %s", self.run_dir, error)
                return
            try:
                copies = [str(scratch / path.name) for path in self.files
                          if slim.write_metadata_plane(path, scratch / path.name)]
                if copies:
                    with _quiet():
                        xprof_api().tool_names(copies)
                    for proto in scratch.glob("*.hlo_proto.pb"):  # same filesystem: each move is a rename
                        os.replace(proto, self.run_dir / proto.name)
                        moved.append(self.run_dir / proto.name)
            except Exception as error:  # some of the modules would hide the rest from XProf: none, and it extracts
                for proto in moved:
                    with contextlib.suppress(OSError):
                        proto.unlink()
                log.debug("XProf extracts the HLO protos of %s itself: %s", self.run_dir, error)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)

    # answers known from the files' bytes (see the module docstring)

    def may_have_counter_samples(self) -> bool:
        """False when no file holds the stat name utilization_viewer reads counter samples from."""
        return self._mentions(_COUNTER_SAMPLE_STAT)

    def may_have_command_buffers(self) -> bool:
        """False when no file holds the name XLA gives kernels run from a command buffer (a CUDA graph) as their
        HLO op; XProf's op_profile does not attribute those kernels to HLO instructions."""
        return self._mentions(_COMMAND_BUFFER)

    def has_metadata_plane(self) -> bool:
        """Whether any file has the metadata plane, where the profilers put the HLO modules (from the planes' names:
        milliseconds, whatever the size)."""
        return any(slim.METADATA_PLANE in plane_names(path) for path in self.files)

    def may_have_suggestions(self) -> bool:
        """False when smart_suggestion (the rule set audited for xprof's version) cannot suggest anything."""
        return _xprof_version() != _SMART_SUGGESTION_AUDITED_VERSION or self._mentions(_BARRIER_CORES_EVENT)

    def _mentions(self, name: bytes) -> bool:
        """Whether any file holds these bytes (a string in a protobuf is stored as its UTF-8 bytes)."""
        with self._lock:
            if name not in self._mentioned:
                self._mentioned[name] = any(_file_holds(path, name) for path in self.files)
            return self._mentioned[name]

    def require_readable(self) -> None:
        """Raises ProfileError if XProf cannot read the files (as a conversion of them would)."""
        with contextlib.suppress(NotAvailable):
            self.overview_tool()

    # shared pieces

    def overview_tool(self) -> dict:
        try:
            return self.tool("get_overview", xprof_api().overview)
        except (FileNotFoundError, ValueError, RuntimeError) as error:
            raise NotAvailable(f"XProf's overview_page has no data for this profile ({error})") from error

    def device_type(self) -> str | None:
        with contextlib.suppress(XdiagError):
            return self.overview_tool().get("run_environment", {}).get("device_type")
        return None

    def no_steps_reason(self) -> str:
        for row in datatable_rows(table_with(self.page("overview_page"), "severity")):
            message = str(row.get("message") or "")
            if "step" in message.lower():
                return f'no step markers (XProf: "{message.split(". ")[0].strip().rstrip(".")}")'
        return "XProf measured no step time in this profile (no step markers)"

    def roofline_tool(self) -> dict:
        try:
            data = self.tool("get_roofline_model", xprof_api().roofline, top_n=DEFAULT_TOP_N)
        except (FileNotFoundError, ValueError, RuntimeError) as error:
            raise NotAvailable(f"XProf's roofline_model failed on this profile ({error})") from error
        if data.get("status") == "NO_DATA" or "program" not in data:
            message = data.get("message", "no program row")
            raise NotAvailable(f"XProf's roofline_model has no data for this profile: {message}")
        if not data.get("total_operations_analyzed"):
            peak = as_positive(data.get("device_info", {}).get("peak_flop_rate"))
            raise NotAvailable(
                "XProf's roofline_model analysed 0 HLO ops on this profile (no XLA ops with cost-model "
                "FLOPs and bytes" + ("" if peak else "; the device's peak FLOP rate is reported as 0") + ")"
            )
        return data

    def roofline_gap(self) -> str | None:
        try:
            self.roofline_tool()
        except NotAvailable as error:
            return str(error)
        return None

    # builders
