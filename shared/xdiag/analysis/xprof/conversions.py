"""XProf's conversions of one private session folder, each run at most once and kept: in this process when a view's
fetch asks, or ahead of the views in worker processes (`Conversions.prefetch`).

XProf's CLI tools fetch through its process-wide client (`xprof_client.get_client()`); a router put in front of it
answers the fetches for a run folder from that folder's `Conversions` (keyed by converter and the parameters the
converter reads), so the views share one overview_page / roofline_model conversion; other fetches pass through to the
client that was there before, which the router delegates everything else to for the life of the process.

XProf's C++ converters hold the GIL, so prefetched conversions run in worker processes (`worker`), each converter
family once (the converters that read op_stats, smart_suggestion aside, in one group), in a folder of links to the
same files of its own; the views then wait for those results instead of converting, and get the same results. A
view about to wait first does the work its views need that no worker holds up, and once every conversion is taken
the workers exit, freeing their memory while the analysis goes on.

Memory: each conversion holds several times the bytes it reads while it runs (`memory_budget`). `prefetch` starts
only as many workers as fit side by side in the memory available, and a conversion that would not fit at all is not
started: the views it feeds raise `ConversionTooLarge` with the estimate, the budget and what to do, instead of the
OOM killer ending the analysis.

XProf's converters return None on failure and only log the reason to stderr ("Can't parse … as binary proto"); that
line, picked out of what `quiet` captured, is kept as the reason XProf cannot read the files (`unreadable`), which the
views raise as `ProfileError`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import contextvars
import json
import logging
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from xdiag.analysis.xprof import memory_budget, worker
from xdiag.analysis.xprof.common import XPLANE_SUFFIX, xprof_api
from xdiag.analysis.xprof.quiet import quiet
from xdiag.analysis.xprof.session_dir import link_private
from xdiag.errors import NotAvailable
from xdiag.profile import scratch

log = logging.getLogger(__name__)

_FETCH_PARAMS_IGNORED = frozenset({"format", "tqx", "bypass_cache", "use_saved_result"})
"""Fetch parameters that do not change what a converter returns (see raw_to_tool_data)."""
_PARSE_ERROR = re.compile(r"can't parse|cannot parse|failed to parse|data_loss|not a valid", re.IGNORECASE)
_SHORT_READ = "Read less bytes than requested"
"""What XProf logs, naming no file, when a file ends before its protobuf does (a truncated profile)."""
_HLO_PROTO_CONVERTERS = frozenset({"memory_viewer", "graph_viewer"})
"""Converters that read the HLO protos `session_dir.extract_hlo_protos` puts in the run folder, not the XSpace: their
memory is that of one HLO module, so `memory_budget` does not hold them back."""

MAX_DEVICE_PLANES = 4096
"""The most device planes a file XProf's converters read may hold. They start a thread per device plane
(group_events.cc's group_xplane_events) and abort the process when one cannot be started ("Check failed ...
pthread_create() failed", SIGABRT, no Python exception): 100,000 empty planes of a 2.6 MB file did so on the 2-core
40 GiB VM, 30,000 took 12 s and 485 MiB. A host's XSpace holds a plane per chip of that host (8 on a v5e host, 4-16
elsewhere), so no real capture comes near it."""

Plan = list[list[tuple[str, dict[str, Any]]]]
"""Conversions grouped by the process that runs them: each a converter and its fetch parameters."""


class ConversionTooLarge(NotAvailable):
    """An XProf conversion not started because it would not fit in memory (`memory_budget.refusal` says why), or
    because the files' shape would abort XProf's converters (`shape_refusal`)."""


def shape_refusal(files: Sequence[Path]) -> str | None:
    """Why XProf's converters are not started on these files though they fit in memory: a file with more device
    planes than `MAX_DEVICE_PLANES` (the converters' thread per plane would abort the process); None where none."""
    from xdiag.analysis.xprof.session_dir import DEVICE_PLANE_PREFIX
    from xdiag.errors import XdiagError
    from xdiag.profile.reader import plane_names

    for path in files:
        try:
            count = sum(name.startswith(DEVICE_PLANE_PREFIX) for name in plane_names(Path(path)))
        except (XdiagError, OSError, ValueError):  # the read meets the same problem and says what it is
            continue
        if count > MAX_DEVICE_PLANES:
            return (f"{Path(path).name} holds {count:,} device planes, more than the {MAX_DEVICE_PLANES:,} XProf's "
                    f"converters are given (they start a thread per plane and abort the process when one cannot "
                    f"start); XProf's views not made, xdiag's own analysis does not need them")
    return None


# --- routing XProf's process-wide client to each run folder's conversions ------------------------

_OWNERS: weakref.WeakValueDictionary[str, Conversions] = weakref.WeakValueDictionary()
_OWNERS_LOCK = threading.Lock()


class _SessionRouter:
    """Stands in for XProf's process-wide client: fetches for a run folder that has its `Conversions` are answered
    by them (converted once, by a local client); everything else goes to the client that was there before."""

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
        outcome = owner.converted(
            tool_name, kwargs, lambda params: self._local.fetch(tool_name, session_id, rpc_deadline_s, **params)
        )
        form = _OP_PROFILE_FORM.get()
        if form is not None and converter_name(tool_name) == "op_profile":
            return owner.op_profile_form(memo_key(tool_name, kwargs), outcome, form)
        return outcome


OP_PROFILE_FORMS = ("binary", "expressions")
_OP_PROFILE_FORM: contextvars.ContextVar[str | None] = contextvars.ContextVar("xdiag_op_profile_form", default=None)


@contextlib.contextmanager
def op_profile_as(form: str) -> Iterator[None]:
    """While in it, this thread's op_profile fetches get the converter's JSON in another form, made from the same
    parsed message (`Conversions.op_profile_form`). Each of XProf's CLI tools that read op_profile parsed its JSON
    with protobuf's pure-Python `json_format` (0.5 s of CPU a time on the 87.6 MiB TPU v5e capture); now it is parsed
    once for all of them. `binary`: the binary protobuf, for get_hlo_op_profile and get_top_hlo_ops (they
    `ParseFromString` data that does not start with `{`). `expressions`: JSON of the nodes' names, HLO expressions
    and children alone, for get_roofline_model, which reads nothing else of it (its
    `_fetch_op_profile_expressions`: `extract_expressions_from_op_profile_node` of by_program and by_category)."""
    if form not in OP_PROFILE_FORMS:
        raise ValueError(f"no op_profile form {form!r}; one of {OP_PROFILE_FORMS}")
    token = _OP_PROFILE_FORM.set(form)
    try:
        yield
    finally:
        _OP_PROFILE_FORM.reset(token)


def _owner_of(session_id: Any) -> Conversions | None:
    try:
        path = os.path.realpath(os.fspath(session_id))
    except (TypeError, ValueError):
        return None
    with _OWNERS_LOCK:
        owner = _OWNERS.get(path)
        if owner is None and path.endswith(XPLANE_SUFFIX):
            owner = _OWNERS.get(os.path.dirname(path))
    return owner


def install_router() -> None:
    """Puts the router in front of XProf's client (again, if someone replaced it since)."""
    client_module = xprof_api().client
    with _OWNERS_LOCK:
        current = client_module.get_client()
        if not isinstance(current, _SessionRouter):
            client_module.set_client(_SessionRouter(current))


def converter_name(tool_name: str) -> str:
    """The converter a fetch runs, as LocalXprofClient.fetch maps it."""
    name = tool_name.removesuffix(".json")
    return "op_profile" if name == "hlo_op_profile" else name


def memo_key(tool_name: str, params: dict[str, Any]) -> str:
    """What a conversion is kept under: its converter, and the parameters that change what it returns."""
    params = {k: v for k, v in params.items() if k not in _FETCH_PARAMS_IGNORED}
    return converter_name(tool_name) + (json.dumps(params, sort_keys=True, default=str) if params else "")


# --- conversions in other processes -------------------------------------------------------------

OP_STATS_CONVERTERS = ("overview_page", "roofline_model", "op_profile", "pod_viewer", "kernel_stats")
"""Converters that share the op_stats XProf saves in their folder: one process converts them in turn,
the first computing op_stats and the others reusing them, as they do in-process (kernel_stats is a
table of op_stats' kernel_stats_db: in a process of its own it would compute op_stats again).
smart_suggestion reads op_stats too but is not among them: it also builds a memory profile of its
own (seconds on large profiles), which would lengthen this process, and its saved result changes the
folder's op_stats signature, so a converter after it would compute op_stats again."""


def planned_conversions(
    files: Sequence[Path], counter_samples: bool, suggestions: bool
) -> Plan:
    """The conversions the views ask for, grouped by process: the op_stats group first (the first view, the
    overview, waits for it; prefetch lowers the priority of the later ones), then the rest. Parameters are
    the ones the views' fetches carry once the ignored ones are dropped, so the memo keys match.
    Without possible counter samples or suggestions the views do not ask for those conversions."""
    groups: Plan = [[(name, {}) for name in OP_STATS_CONVERTERS]]
    if suggestions:
        groups.append([("smart_suggestion", {})])
    if len(files) == 1:
        groups.append([("memory_profile", {})])
        if counter_samples:
            groups.append([("utilization_viewer", {})])
    else:  # utilization_viewer takes one trace only, so the view does not ask; memory_profile goes per host
        groups += [[("memory_profile", {"host": path.name.removesuffix(XPLANE_SUFFIX)})] for path in files]
    return groups


def _op_profile_forms(outcome: Any) -> dict[str, tuple[Any, Any]] | None:
    """Each form of `op_profile_as` of an op_profile conversion's (content type, JSON) outcome, from one strict parse
    of the JSON; None where they are not safe to hand the tools instead (see `Conversions.op_profile_form`)."""
    if not (isinstance(outcome, tuple) and len(outcome) == 2 and isinstance(outcome[1], (bytes, str)) and outcome[1]):
        return None
    from google.protobuf import json_format
    from xprof.protobuf import op_profile_pb2

    content_type, data = outcome
    profile = op_profile_pb2.Profile()
    try:
        json_format.Parse(data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data, profile)
    except Exception:  # the tools meet it themselves, as before
        return None
    binary = profile.SerializeToString()
    if not binary or binary.strip().startswith(b"{"):
        return None

    def expressions(node: Any) -> dict[str, Any]:
        kept: dict[str, Any] = {}
        if node.name:
            kept["name"] = node.name
        if node.xla.expression:
            kept["xla"] = {"expression": node.xla.expression}
        if node.children:
            kept["children"] = [expressions(child) for child in node.children]
        return kept

    trees = {key: expressions(getattr(profile, field)) for key, field in (("byProgram", "by_program"),
                                                                          ("byCategory", "by_category"))
             if profile.HasField(field)}
    text = json.dumps(trees)
    return {"binary": (content_type, binary),
            "expressions": (content_type, text.encode() if isinstance(data, bytes) else text)}


def _settle(placeholder: concurrent.futures.Future, done: concurrent.futures.Future) -> None:
    if done.cancelled():
        placeholder.set_exception(RuntimeError("cancelled"))
    elif done.exception() is not None:
        placeholder.set_exception(done.exception())
    else:
        placeholder.set_result(done.result())


# --- one folder's conversions ---------------------------------------------------------------------


class Conversions:
    """XProf's conversions of one private run folder (`session_dir`), each run at most once and kept, its result or
    its error. Shares the lock of the views that own it: their tool calls hold it while XProf fetches."""

    def __init__(self, run_dir: Path, files: Sequence[Path], originals: Sequence[Path], xspace_bytes: int,
                 lock: threading.RLock, work_while_waiting: Callable[[], None]):
        """`work_while_waiting` (a method of the owner, held weakly: the owner holds this object) is called by a
        fetch about to wait for a worker's conversion."""
        self.run_dir = run_dir
        self.files = list(files)
        self.originals = tuple(originals)
        self.xspace_bytes = xspace_bytes
        self._lock = lock
        self._owners_work = weakref.WeakMethod(work_while_waiting)
        self._results: dict[str, Any] = {}
        self._op_profile_forms: dict[str, Any] = {}  # key -> `_op_profile_forms` (None: the JSON stays)
        self._pending: dict[str, tuple[concurrent.futures.Future, int]] = {}  # key -> (worker's future, index)
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None
        self._workers = 0
        self.unreadable: str | None = None
        """XProf's reason for not reading the files, once a conversion met it."""
        self.too_large: str | None = None
        """Why conversions of this session are not started (`memory_budget.refusal`), once one was refused."""
        self.refusals = 0
        """How many times a fetch met a conversion refused for memory (a tool call tells its own fetches by it)."""
        self.counts: collections.Counter[str] = collections.Counter()
        """How often each conversion ran, keyed by converter and parameters; 1 each, by design."""
        self.worker_cpu_s: dict[str, float] = {}
        """CPU seconds of each conversion that ran in a worker process (see `prefetch`)."""
        self.worker_folders: list[str] = []
        self.worker_run_dirs: list[Path] = []
        self._shape_refusal: list[str | None] = []  # computed once, on the first conversion asked for
        with _OWNERS_LOCK:
            _OWNERS[os.path.realpath(self.run_dir)] = self

    def shape_refusal(self) -> str | None:
        """`shape_refusal` of the original files, once."""
        if not self._shape_refusal:
            self._shape_refusal.append(shape_refusal(self.originals or self.files))
        return self._shape_refusal[0]

    def holds(self, tool_name: str, params: dict[str, Any] | None = None) -> bool:
        """Whether this conversion has run (its outcome is kept)."""
        return memo_key(tool_name, params or {}) in self._results

    @property
    def workers_converting(self) -> int:
        """How many worker processes `prefetch` started whose conversions are not all taken yet (0 for none)."""
        with self._lock:
            return self._workers if self._executor is not None and self._pending else 0

    def stop(self) -> None:
        """No more fetches routed here, and the workers stopped (joined)."""
        with self._lock:
            with _OWNERS_LOCK:
                _OWNERS.pop(os.path.realpath(self.run_dir), None)
            if self._executor is not None:
                self._executor.shutdown(wait=True, cancel_futures=True)
                self._executor = None

    def prefetch(self, plan: Callable[[], Plan]) -> int:
        """Starts the conversions `plan` gives (`planned_conversions`), concurrently, and returns at once.

        In worker processes (at most `XDIAG_XPROF_PROCESSES`; by default the CPU count, or none for sessions under
        worker.PREFETCH_MIN_BYTES, whose conversions cost less than starting workers), and no more than fit in
        memory side by side: the groups handed to the workers in turn, every group after the first at a lower
        priority. Each group works in its own folder of links to the same files (converters write side files next
        to their input, and a fresh op_stats conversion clears the folder's saved results), so the only shared copy
        is the one file itself. A fetch then waits for its conversion instead of running it; a conversion that
        failed in its worker runs again in-process. Returns how many processes were started (0: off, or already
        started)."""
        allowed = worker.processes_allowed(self.xspace_bytes)
        fit = memory_budget.conversions_that_fit(self.xspace_bytes) if allowed else None
        if fit is not None and fit < allowed:
            log.debug("XProf conversions of %s: memory for %d at once, not %d", self.run_dir, fit, allowed)
            allowed = fit  # none: each view converts in-process, or answers why it cannot
        with self._lock:
            if allowed == 0 or self._executor is not None or self.unreadable or self.shape_refusal():
                return 0
            groups = [[(name, params) for name, params in group if not self.holds(name, params)] for group in plan()]
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
                    self._pending[memo_key(name, params)] = (placeholder, index)
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
        folder = scratch.make(f"xprof-{label}")
        self.worker_folders.append(str(folder))
        run_dir = folder / self.run_dir.name
        run_dir.mkdir()
        for path in self.files:
            link_private(path.resolve(), run_dir / path.name)  # the private copy's file: checked already
        self.worker_run_dirs.append(run_dir)
        return run_dir

    def converted(self, tool_name: str, params: dict[str, Any], convert: Callable[[dict[str, Any]], Any]) -> Any:
        """One conversion (a LocalXprofClient.fetch) per converter and parameters; called by the router.
        A conversion `prefetch` started in a worker is waited for (outside the lock) and taken from it."""
        params = {k: v for k, v in params.items() if k not in _FETCH_PARAMS_IGNORED}
        key = memo_key(tool_name, params)
        with self._lock:
            pending = self._pending.get(key) if key not in self._results else None
        if pending is not None:
            self._take_from_worker(key, pending[0])
        with self._lock:
            if key not in self._results:
                too_large = self.shape_refusal() or (None if converter_name(tool_name) in _HLO_PROTO_CONVERTERS else (
                    memory_budget.refusal(self.xspace_bytes)))
                if too_large is not None:  # kept too: the view answers why, and nothing is tried again
                    self.too_large = too_large
                    self._results[key] = ConversionTooLarge(too_large)
                else:
                    self.counts[key] += 1
                    with quiet() as stderr_lines:
                        try:
                            outcome: Any = convert(params)
                        except Exception as error:  # kept, so a failing conversion is not retried either
                            outcome = error
                    self._keep_conversion(key, outcome, stderr_lines)
            outcome = self._results[key]
            if isinstance(outcome, ConversionTooLarge):
                self.refusals += 1
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def op_profile_form(self, key: str, outcome: Any, form: str) -> Any:
        """The op_profile conversion `outcome` (content type, JSON) in `form` (`op_profile_as`), the forms made once
        per conversion; `outcome` itself where its JSON does not parse strictly (the tools then meet what they met
        before) or the binary would read as JSON to them (it starts with `{`)."""
        with self._lock:
            if key not in self._op_profile_forms:
                self._op_profile_forms[key] = _op_profile_forms(outcome)
            forms = self._op_profile_forms[key]
        return outcome if forms is None else forms[form]

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
                if results is None or taken in self._results:
                    continue
                outcome, stderr_text, cpu_s = results[position]
                self.counts[taken] += 1
                self.worker_cpu_s[taken] = round(cpu_s, 4)
                if stderr_text.strip():
                    log.debug("XProf stderr (%s, in a worker):\n%s", taken, stderr_text[-20_000:])
                self._keep_conversion(taken, outcome, stderr_text.splitlines())
            self._release_workers_when_done()

    def _work_while_waiting(self) -> None:
        work = self._owners_work()
        if work is not None:  # None once the owner is collected
            work()

    def _release_workers_when_done(self) -> None:
        """Lets the workers exit once no conversion of theirs is still to be taken (called under the lock): they
        free their memory while the analysis goes on, and `close()` finds them gone instead of joining them."""
        if not self._pending and self._executor is not None:
            self._executor.shutdown(wait=False)

    def _keep_conversion(self, key: str, outcome: Any, stderr_lines: Iterable[str]) -> None:
        data = outcome[1] if isinstance(outcome, tuple) and len(outcome) == 2 else outcome
        if data is None and self.unreadable is None:
            self.unreadable = self._parse_failure(stderr_lines)
        self._results[key] = outcome

    def _parse_failure(self, stderr_lines: Iterable[str]) -> str | None:
        """XProf's reason for not reading one of our files, from its error log lines."""
        names = [path.name for path in self.files]
        for line in stderr_lines:
            if line[:1] not in ("E", "F"):
                continue
            if _PARSE_ERROR.search(line) and any(name in line for name in names):
                message = line.split("] ", 1)[-1].strip()
                for run_dir in (self.run_dir, *self.worker_run_dirs):
                    for name, original in zip(names, self.originals):
                        message = message.replace(str(run_dir / name), str(original))
                return f"XProf cannot read the profile: {message}"
            if _SHORT_READ in line:
                files = ", ".join(str(original) for original in self.originals)
                return f"XProf cannot read the profile: {files}: {_SHORT_READ.lower()} (it ends early: truncated?)"
        return None
