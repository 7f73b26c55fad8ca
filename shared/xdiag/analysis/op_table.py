"""Which XLA ops ran, on which device, when? One row per op execution (an HLO instruction, or a GPU kernel, run on
a device), with its real end and its category; and what the profiler recorded of each op's cost. Works the same on
host planes (XLA:CPU ops run as events on the CPU client's threads) and device planes (GPU streams, TPU `XLA Ops`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np

from xdiag.analysis.categories import _category_from_name, categorize
from xdiag.analysis.intervals import covered
from xdiag.analysis.session_cache import cached
from xdiag.cost.custom_calls import is_gemm_call
from xdiag.profile.columns import distinct_values, factorize_rows, isin_ids, unique_with_inverse
from xdiag.profile.space import NO_VALUE, HloModule, Line, Plane, Session
from xdiag.text_numbers import whole_number

_KERNEL_SUFFIX = re.compile(r"_(\d+)$")


class OpTable:
    """One row per XLA op execution (an HLO instruction run on a device).

    Stored per row: start_ps; end_ps, the op's real end (its `end: <op>` event's end where it has one, XLA:CPU
    async ops); event_end_ps, the end of its own event (before any `end:` pairing); op, the row's index in op_keys
    (the distinct (module, program_id, name) rows, with op_categories beside them); device_code, its index in
    device_labels. name, module, program_id (NO_VALUE when unknown), category (see categorize()) and device
    ("<host> CPU:<ordinal>", "<host> /device:GPU:0") are functions of the codes: columns gathered from them on
    first use and kept, so a table (or a selection of its rows) whose names are never read never holds them.
    """

    STORED = ("start_ps", "end_ps", "event_end_ps", "op", "device_code")
    CODED = ("name", "module", "program_id", "category", "device")
    KEYS = ("op_keys", "op_categories", "device_labels")

    def __init__(self, *, start_ps: np.ndarray, end_ps: np.ndarray, event_end_ps: np.ndarray, op: np.ndarray,
                 device_code: np.ndarray, op_keys: tuple[tuple[str, int, str, str], ...] = (),
                 op_categories: tuple[str, ...] = (), device_labels: tuple[str, ...] = (),
                 _per_code: dict[str, np.ndarray] | None = None):
        self.start_ps, self.end_ps, self.event_end_ps = start_ps, end_ps, event_end_ps
        self.op, self.device_code = op, device_code
        self.op_keys, self.op_categories = tuple(op_keys), tuple(op_categories)
        self.device_labels = tuple(device_labels)
        self._per_code = {} if _per_code is None else _per_code  # a coded column's value per code, shared by selections
        self._columns: dict[str, np.ndarray] = {}

    def _values_per_code(self, name: str) -> np.ndarray:
        if name == "device":
            return np.array(self.device_labels or ("",), dtype=object)
        if name == "category":
            return np.array(self.op_categories or ("",), dtype=object)
        if name == "program_id":
            return np.array([key[1] for key in self.op_keys] or [NO_VALUE], dtype=np.int64)
        index = {"module": 0, "name": 2}[name]
        return np.array([key[index] for key in self.op_keys] or [""], dtype=object)

    def _coded(self, name: str) -> np.ndarray:
        column = self._columns.get(name)
        if column is None:
            if name not in self._per_code:
                self._per_code[name] = self._values_per_code(name)
            codes = self.device_code if name == "device" else self.op
            column = self._columns[name] = self._per_code[name][codes]
        return column

    name = property(lambda self: self._coded("name"))
    module = property(lambda self: self._coded("module"))
    program_id = property(lambda self: self._coded("program_id"))
    category = property(lambda self: self._coded("category"))
    device = property(lambda self: self._coded("device"))

    def __len__(self) -> int:
        return len(self.op)

    @property
    def duration_ps(self) -> np.ndarray:
        return self.end_ps - self.start_ps

    def self_duration_ps(self) -> np.ndarray:
        """Each op's own time: a control-flow op (while, conditional, call: a `fori_loop`, a `scan`) encloses its
        body's ops on the device's line, so its own time is its span less the time of the ops it encloses (those
        ops, and the own time of loops nested in it); every other op's is its duration."""
        durations = self.duration_ps
        containers = np.flatnonzero(self.in_categories(["control_flow"]))
        if not len(containers):
            return durations
        own = durations.copy()
        for device in np.unique(self.device_code[containers]).tolist():
            on_device = self.device_code == device
            loops = containers[self.device_code[containers] == device]
            loops = loops[np.lexsort((-self.end_ps[loops], self.start_ps[loops]))]  # outer before inner at one start
            body = on_device & ~self.in_categories(["control_flow"])
            starts, ends = self.start_ps[loops], self.end_ps[loops]
            enclosed = covered(self.start_ps[body], self.end_ps[body], starts, ends)
            # Innermost first: a loop's own time is known before the loops around it subtract it.
            inner_end = np.searchsorted(starts, ends, side="left")
            for k in range(len(loops) - 1, -1, -1):
                nested = own[loops[k + 1 : inner_end[k]]].sum() if inner_end[k] > k + 1 else 0
                own[loops[k]] = max(int(durations[loops[k]] - enclosed[k] - nested), 0)
        return own

    def take(self, mask: np.ndarray) -> OpTable:
        """The rows of a boolean mask; the table itself where the mask selects every row (nothing writes into
        a table's columns, and on large profiles a copy is hundreds of MB)."""
        if mask.dtype == bool and len(mask) == len(self) and mask.all():
            return self
        columns = {f: getattr(self, f)[mask] for f in self.STORED if f != "event_end_ps"}
        columns["event_end_ps"] = columns["end_ps"] if self.ends_are_events_ends else self.event_end_ps[mask]
        return OpTable(**columns, **self.keys(), _per_code=self._per_code)

    @property
    def ends_are_events_ends(self) -> bool:
        """Whether no op's real end differs from its event's (no `end:` pairing): one array holds both."""
        return self.event_end_ps is self.end_ps

    def on_device(self, device: str) -> np.ndarray:
        """The rows on `device`, as a boolean mask: its code compared, not a string per row."""
        if device not in self.device_labels:
            return np.zeros(len(self), dtype=bool)
        return self.device_code == self.device_labels.index(device)

    def in_categories(self, categories: Iterable[str]) -> np.ndarray:
        """The rows whose category is one of `categories`, as a boolean mask: each op's category tested once."""
        wanted = set(categories)
        per_code = np.array([c in wanted for c in self.op_categories], dtype=bool)
        if not len(self) or not per_code.any():  # no op of them (most categories on most profiles): no gather
            return np.zeros(len(self), dtype=bool)
        return per_code[self.op]

    def rows_where(self, match: Callable[[tuple[str, int, str, str]], bool]) -> np.ndarray:
        """The rows whose op key (module, program_id, name, kernel) `match` accepts, as a boolean mask: each key
        tested once, no text gathered per row."""
        if not len(self):
            return np.zeros(0, dtype=bool)
        return np.array([match(key) for key in self.op_keys], dtype=bool)[self.op]

    def grouped_by(self, part: Callable[[tuple[str, int, str, str]], object]) -> tuple[np.ndarray, list]:
        """Each op code's group by `part` of its op key (its program: module and program_id), an int32 array indexed
        by op code, and the groups' values in first-seen order: `group[ops.op]` labels rows with integers, no text
        gathered per row."""
        position: dict = {}
        group = np.array([position.setdefault(part(key), len(position)) for key in self.op_keys], dtype=np.int32)
        return group, list(position)

    def devices(self, mask: np.ndarray | None = None) -> list[str]:
        """The devices the rows (those of `mask`, a boolean mask, where given) are on, sorted."""
        codes = self.device_code if mask is None else self.device_code[mask]
        present = np.flatnonzero(np.bincount(codes, minlength=len(self.device_labels)))
        return sorted(self.device_labels[i] for i in present.tolist())

    def keys(self) -> dict[str, tuple]:
        """What the codes index: op_keys, op_categories, device_labels."""
        return {f: getattr(self, f) for f in self.KEYS}


def empty_op_table() -> OpTable:
    times, codes = np.empty(0, np.int64), np.empty(0, np.int32)
    return OpTable(start_ps=times, end_ps=times, event_end_ps=times, op=codes, device_code=codes)


def _strings_of(plane: Plane, column: np.ndarray) -> np.ndarray:
    table = np.array(plane.strings + [""], dtype=object)
    return table[np.where(column >= 0, column, len(plane.strings))]


class _Text(NamedTuple):
    """A text column of op rows as each row's index among its distinct values: an int32 a row, not an object
    pointer a row, and rows grouped by integers rather than by hashing strings (a TPU host's 2 GB file holds
    ~40 million op executions)."""

    codes: np.ndarray
    values: list[str]

    def at(self, rows: np.ndarray) -> list[str]:
        return [self.values[code] for code in self.codes[rows].tolist()]

    def assign(self, rows: np.ndarray, texts: list[str]) -> None:
        position = {value: code for code, value in enumerate(self.values)}
        for text in texts:
            if text not in position:
                position[text] = len(self.values)
                self.values.append(text)
        self.codes[rows] = [position[text] for text in texts]


def _text_of_ids(ids: np.ndarray, value_of: Callable[[int], str]) -> _Text:
    distinct, codes = unique_with_inverse(ids)
    return _Text(codes.astype(np.int32), [value_of(i) for i in distinct.tolist()])


def _text_of_objects(objects: np.ndarray) -> _Text:
    distinct, codes = unique_with_inverse(objects)
    return _Text(codes.astype(np.int32), distinct.tolist())


def _plane_text(plane: Plane, string_ids: np.ndarray) -> _Text:
    return _text_of_ids(string_ids, lambda i: plane.strings[i] if i >= 0 else "")


def _blank_text(count: int) -> _Text:
    return _Text(np.zeros(count, np.int32), [""])


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _concatenated(texts: list[_Text]) -> _Text:
    """One column of the parts' rows, their codes made codes of one list of values."""
    position: dict[str, int] = {}
    codes = []
    for text in texts:
        remap = np.array([position.setdefault(value, len(position)) for value in text.values], dtype=np.int32)
        unchanged = not len(remap) or (remap[0] == 0 and (np.diff(remap) == 1).all())  # its codes already are
        codes.append(text.codes if unchanged else remap[text.codes])
    joined = codes[0] if len(codes) == 1 else np.concatenate(codes) if codes else np.zeros(0, np.int32)
    return _Text(joined, list(position))


def _tpu_op_name(text: str) -> str:
    # TPU 'XLA Ops' events are named by HLO text: "%copy-start.2 = (f32[...]) copy-start(...)".
    if text.startswith("%"):
        return text[1:].split(" ", 1)[0]
    return text


_SKIP_DEVICE_LINES = {"XLA Modules", "Steps", "TensorFlow Ops", "TensorFlow Name Scope", "XLA TraceMe", "Async XLA Ops", "Overlay"}


def module_spans(plane: Plane) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(starts, ends, names) of the plane's 'XLA Modules' line, sorted by start."""
    for line in plane.lines:
        if line.name == "XLA Modules" and len(line):
            names = np.array([_module_name(n) for n in plane.names_of(line)], dtype=object)
            order = np.argsort(line.start_ps, kind="stable")
            return line.start_ps[order], line.end_ps[order], names[order]
    return None


def _module_name(text: str) -> str:
    # 'XLA Modules' events are named "jit_f(12190760917235803885)": the module name and a fingerprint.
    return text.split("(", 1)[0]


def _modules_at(spans: tuple[np.ndarray, np.ndarray, np.ndarray], starts: np.ndarray) -> _Text:
    """Each op's module: the 'XLA Modules' span it starts in, "" outside every span."""
    span_starts, span_ends, span_names = spans
    names = _text_of_objects(span_names)
    outside = len(names.values)
    if len(starts) > 1 and (starts[1:] >= starts[:-1]).all():
        # One line's ops in time order: each span's ops are a run of rows, found by a search per span, not per op
        first = np.searchsorted(starts, span_starts, side="left")  # the span's first op
        past = np.append(first[1:], len(starts))  # where the next span's ops begin
        inside = np.clip(np.minimum(np.searchsorted(starts, span_ends, side="left"), past) - first, 0, None)
        runs = np.empty(2 * len(first) + 1, np.int64)
        runs[0], runs[1::2], runs[2::2] = first[0] if len(first) else len(starts), inside, past - first - inside
        values = np.full(len(runs), outside, dtype=names.codes.dtype)
        values[1::2] = names.codes
        return _Text(np.repeat(values, runs), names.values + [""])
    span = np.searchsorted(span_starts, starts, side="right") - 1
    before_first = span < 0
    np.clip(span, 0, None, out=span)
    codes = names.codes[span]
    codes[before_first | (starts >= span_ends[span])] = outside
    return _Text(codes, names.values + [""])


_LAYOUT = re.compile(r"\{[^{}]*\}")


def _tpu_program_ids(session: Session, plane: Plane) -> dict[int, int]:
    """A TPU plane's program fingerprints (its 'XLA Ops' events' program_id) -> the id of the HLO module each ran,
    for the modules whose name several programs share (a jitted loss and the jitted gradient of it are both
    `jit_loss`): the module that holds every op the fingerprint ran, by name and by shape. A fingerprint no module
    fits alone is left out (its ops are named by the module's name alone, as before)."""
    shared: dict[str, list[HloModule]] = {}
    for module in session.hlo_modules:
        shared.setdefault(module.name, []).append(module)
    shared = {name: modules for name, modules in shared.items() if len(modules) > 1}
    modules_line = next((ln for ln in plane.lines if ln.name == "XLA Modules" and len(ln)), None) if shared else None
    if modules_line is None:
        return {}
    named: dict[int, str] = {}
    for text in set(plane.names_of(modules_line)):
        module, _, rest = text.partition("(")
        fingerprint = whole_number(rest.rstrip(")"))
        if fingerprint is not None and module in shared:
            named[fingerprint] = module
    ran: dict[int, dict[str, str]] = {}  # fingerprint -> {op: its shape, without layouts}
    for line in plane.lines:
        if line.name != "XLA Ops":
            continue
        for key in distinct_values(line.metadata_id).tolist():
            stats = plane.event_metadata_stats.get(key) or {}
            fingerprint = stats.get("program_id")
            if fingerprint in named:
                op = _tpu_op_name(plane.event_display_names.get(key) or plane.event_names.get(key, ""))
                ran.setdefault(fingerprint, {})[op] = _LAYOUT.sub("", str(stats.get("shape_with_layout", "")))
    out = {}
    for fingerprint, ops in ran.items():
        scores = []
        for module in shared[named[fingerprint]]:
            found = [module.find(op) for op in ops]
            if all(found):
                scores.append((sum(_LAYOUT.sub("", f[1].shape_text) == ops[op] for op, f in zip(ops, found)),
                               module.program_id))
        scores.sort(reverse=True)
        if scores and (len(scores) == 1 or scores[0][0] > scores[1][0]):
            out[fingerprint] = scores[0][1]
    return out


def _line_ops(plane: Plane, line: Line, host: str, has_xla_ops_line: bool,
              tpu_programs: dict[int, int] | None = None) -> dict[str, np.ndarray] | None:
    """The XLA op (or GPU kernel) executions one line holds, or None when it holds none. `tpu_programs` names the
    program of a TPU op whose module's name several programs share (`_tpu_program_ids`)."""
    hlo_op = line.strings.get("hlo_op")
    count = len(line)
    starts = None
    program = line.numeric.get("program_id")
    gpu: dict[str, np.ndarray] = {}  # GPU kernels: their own names, whether a CUDA graph ran them, their launch
    if plane.is_device:
        if line.name in _SKIP_DEVICE_LINES or not count:
            return None
        mask = np.ones(count, dtype=bool)  # a device line's ops are all its events
        if line.name == "XLA Ops":
            display = plane.event_display_names
            names = _text_of_ids(line.metadata_id,
                                 lambda k: _tpu_op_name(display.get(k) or plane.event_names.get(k, "")))
            starts = line.starts.at(mask)
            spans = module_spans(plane)
            modules = _modules_at(spans, starts) if spans is not None else _blank_text(count)
            if tpu_programs and program is None:
                ids, inverse = unique_with_inverse(line.metadata_id)
                fingerprints = [(plane.event_metadata_stats.get(k) or {}).get("program_id") for k in ids.tolist()]
                program = np.array([tpu_programs.get(f, NO_VALUE) for f in fingerprints], np.int64)[inverse]
        elif line.name.startswith("Stream") and not has_xla_ops_line:
            names = kernels = plane.names_of(line)
            in_graph = np.zeros(count, dtype=bool)
            if hlo_op is not None:
                # Kernels run inside a CUDA graph carry the command buffer's name as hlo_op: keep the kernel's.
                op_names = _strings_of(plane, hlo_op)
                ids, inverse = unique_with_inverse(hlo_op)  # each distinct name tested once, not once per kernel
                buffer_ids = [i >= 0 and plane.strings[i].startswith("command_buffer") for i in ids.tolist()]
                in_graph = np.array(buffer_ids, dtype=bool)[inverse]
                names = np.where((hlo_op >= 0) & ~in_graph, op_names, names)
            elif "tf_op" in line.strings:
                names = np.where(line.strings["tf_op"] >= 0, _strings_of(plane, line.strings["tf_op"]), names)
            names = _text_of_objects(names)
            modules = _plane_text(plane, line.strings["hlo_module"]) if "hlo_module" in line.strings else _blank_text(count)
            launch = line.numeric.get("correlation_id")
            gpu = {"kernel": _text_of_objects(kernels), "in_graph": in_graph,
                   "launch": launch if launch is not None else np.full(count, NO_VALUE, np.int64)}
        else:
            return None
        labels, device = [f"{host} {plane.name}"], np.zeros(count, np.int32)
    else:
        if hlo_op is None or not (hlo_op >= 0).any():
            return None
        mask = hlo_op >= 0
        names = _plane_text(plane, hlo_op[mask])
        modules = _plane_text(plane, line.strings["hlo_module"][mask]) if "hlo_module" in line.strings else _blank_text(int(mask.sum()))
        ordinal = line.numeric.get("device_ordinal")
        if ordinal is not None:
            # One label per ordinal, shared by its rows (a string per row is ~60 bytes on millions of ops).
            ordinals, device = unique_with_inverse(ordinal[mask])
            labels = [f"{host} CPU:{o}" if o != NO_VALUE else f"{host} CPU" for o in ordinals.tolist()]
        else:
            labels, device = [f"{host} CPU"], np.zeros(mask.sum(), np.int32)
    if starts is None:
        starts = line.starts.at(mask)
    ends = starts + line.durations.at(mask)
    flow = line.numeric.get("_p")  # XLA:CPU async ops: the flow their `end:` event closes
    return {
        "name": names,
        "module": modules,
        "program_id": program[mask] if program is not None else np.full(mask.sum(), NO_VALUE, np.int64),
        "device_code": device,  # an index in device_labels, made the table's own index by op_table
        "device_labels": labels,
        "start_ps": starts,
        "end_ps": ends,
        "event_end_ps": ends,  # the same array: the flow pairing replaces end_ps, never writes into it
        **({"flow": flow[mask]} if flow is not None else {}),
        **gpu,  # a device line's mask selects every row
    }


def _flow_ends(plane: Plane) -> tuple[np.ndarray, np.ndarray]:
    """Flow ids and end times of the `end: <op>` events that finish async XLA:CPU ops, ordered by (id, end)."""
    ids, ends = [], []
    end_ids = np.array([k for k, n in plane.event_names.items() if n.startswith("end: ")], dtype=np.int64)
    for line in plane.lines:
        consumer = line.numeric.get("_c")
        if consumer is None:
            continue
        mask = isin_ids(line.metadata_id, end_ids) & (consumer != NO_VALUE)
        ids.append(consumer[mask])
        ends.append(line.end_ps_at(mask))
    if not ids:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    ids_all, ends_all = np.concatenate(ids), np.concatenate(ends)
    order = np.lexsort((ends_all, ids_all))
    return ids_all[order], ends_all[order]


def _flow_finish(
    flow_ids: np.ndarray, flow_ends: np.ndarray, flow: np.ndarray, start_ps: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each op, whether a flow's `end:` event finishes it and when: the first end of its flow id at or after the
    op's start (`flow_ids`, `flow_ends` ordered by id, then end). A flow id is normally unique, but a long capture
    may reuse one (its counter restarting), and pairing with another op's end would stretch an op over seconds."""
    lo, hi = np.searchsorted(flow_ids, flow, "left"), np.searchsorted(flow_ids, flow, "right")
    last = hi.copy()
    # Each op's ends are in time order: bisect every op's range at once until it closes on the first end that is
    # not before the op's start (one round where its id is unique).
    while True:
        open_ = np.flatnonzero(lo < hi)
        if not len(open_):
            break
        mid = (lo[open_] + hi[open_]) // 2
        later = flow_ends[mid] >= start_ps[open_]
        hi[open_[later]] = mid[later]
        lo[open_[~later]] = mid[~later] + 1
    hit = (lo < last) & (flow != NO_VALUE)
    finish = np.where(hit, flow_ends[np.minimum(lo, len(flow_ends) - 1)], 0)
    return hit, finish


def _pair_ends_by_name(plane: Plane, parts: list[dict]) -> None:
    """Async XLA:CPU ops' real ends where the flows that pair them are gone: XProf's Chrome trace (trace.json) keeps
    each async op's `end: <op>` event but not the flow ids (`_p`, `_c`) that name its op. Each end goes to the op of
    its name that started last before it, across the plane's threads (a CPU device runs its programs' executions one
    after another, so an end falls after its own op's start and before the next one of that name); an op left
    without an end keeps its event's."""
    end_names = {k: n[len("end: "):] for k, n in plane.event_names.items() if n.startswith("end: ")}
    if not end_names:
        return
    ids = np.array(list(end_names), dtype=np.int64)
    metadata, times = [], []
    for line in plane.lines:
        mask = isin_ids(line.metadata_id, ids)
        metadata.append(line.metadata_id[mask])
        times.append(line.end_ps_at(mask))
    key_of = {name: k for k, name in enumerate(sorted(set(end_names.values())))}
    distinct, inverse = unique_with_inverse(np.concatenate(metadata))
    end_keys = np.array([key_of[end_names[m]] for m in distinct.tolist()], dtype=np.int64)[inverse]
    end_times = np.concatenate(times)
    keys = np.concatenate([np.array([key_of.get(v, -1) for v in part["name"].values], dtype=np.int64)[
        part["name"].codes] for part in parts])
    starts = np.concatenate([part["start_ps"] for part in parts])
    rows = np.lexsort((starts, keys))  # by name, then start
    row_keys, row_starts = keys[rows], starts[rows]
    ends_order = np.lexsort((end_times, end_keys))
    end_keys, end_times = end_keys[ends_order], end_times[ends_order]
    finish = np.zeros(len(keys), np.int64)
    for key in np.unique(end_keys).tolist():  # one round per op name with ends: hundreds, not one per event
        first, last = np.searchsorted(row_keys, key, "left"), np.searchsorted(row_keys, key, "right")
        at_ends = slice(np.searchsorted(end_keys, key, "left"), np.searchsorted(end_keys, key, "right"))
        owner = np.searchsorted(row_starts[first:last], end_times[at_ends], "right") - 1
        found = owner >= 0
        np.maximum.at(finish, rows[first + owner[found]], end_times[at_ends][found])
    offset = 0
    for part in parts:
        size = len(part["start_ps"])
        paired = finish[offset:offset + size]
        offset += size
        if paired.any():  # a new array: the events' ends stay as they were (event_end_ps)
            part["end_ps"] = np.maximum(part["end_ps"], paired)


def _name_graph_gemms(session: Session, cols: dict[str, np.ndarray | _Text]) -> None:
    """Names the library GEMM kernels a CUDA graph ran after the custom calls that launched them.

    Inside a graph a kernel's hlo_op names the command buffer, not its instruction, and a cuBLAS kernel is named
    by the library, not after an instruction as XLA's own kernels are. One graph launch (one correlation id on one
    device) runs its commands in the module's schedule order, so where a launch holds exactly as many such GEMM
    kernels as the module has GEMM custom calls, the k-th kernel is the k-th call. Launches that hold another
    number stay unnamed (their FLOPs unknown)."""
    candidates = np.flatnonzero(cols["in_graph"] & (cols["launch"] != NO_VALUE))
    if not len(candidates):
        return
    groups: dict[tuple, list[int]] = {}
    for row, key in zip(candidates.tolist(), zip(cols["device_code"][candidates].tolist(),
                                                  cols["module"].at(candidates),
                                                  cols["program_id"][candidates].tolist(),
                                                  cols["launch"][candidates].tolist())):
        groups.setdefault(key, []).append(row)
    calls: dict[tuple[str, int], tuple[HloModule | None, list[str]]] = {}
    library_gemm: dict[tuple[str, int, str], bool] = {}
    for (_, module_name, pid, _), rows in groups.items():
        if (module_name, pid) not in calls:
            module = session.module_for(module_name, None if pid == NO_VALUE else pid) if module_name else None
            calls[(module_name, pid)] = module, [i.name for i in module.entry_computation.instructions
                                                 if is_gemm_call(i)] if module is not None else []
        module, scheduled = calls[(module_name, pid)]
        if not scheduled:
            continue
        gemm_rows = []
        for row, kernel in zip(rows, cols["kernel"].at(np.array(rows))):
            if (module_name, pid, kernel) not in library_gemm:
                named = module.find(kernel) or module.find(_KERNEL_SUFFIX.sub(r".\1", kernel))
                library_gemm[(module_name, pid, kernel)] = named is None and _category_from_name(kernel) == "matmul"
            if library_gemm[(module_name, pid, kernel)]:
                gemm_rows.append(row)
        if len(gemm_rows) == len(scheduled):
            ordered = np.array(gemm_rows)[np.argsort(cols["start_ps"][gemm_rows], kind="stable")]
            cols["name"].assign(ordered, scheduled)


def op_table(session: Session) -> OpTable:
    """Every XLA op execution in the session, with its real end and its category."""

    def build() -> OpTable:
        parts: list[dict[str, np.ndarray]] = []
        # With device planes, XLA ops are the device's events; host threads only launch them.
        use_devices = bool(session.device_planes(with_events=True))
        for host in session.hosts:
            for plane in host.planes:
                if plane.is_device != use_devices or not (plane.is_device or plane.name == "/host:CPU"):
                    continue
                flow_ids, flow_ends = _flow_ends(plane) if not plane.is_device else (np.empty(0, np.int64),) * 2
                has_xla_ops_line = any(line.name == "XLA Ops" and len(line) for line in plane.lines)
                tpu_programs = _tpu_program_ids(session, plane) if has_xla_ops_line and plane.is_device else None
                plane_parts, with_flows = [], bool(len(flow_ids))
                for line in plane.lines:
                    ops = _line_ops(plane, line, host.hostname, has_xla_ops_line, tpu_programs)
                    if ops is None:
                        continue
                    flow = ops.pop("flow", None)
                    with_flows = with_flows or flow is not None
                    if flow is not None and len(flow_ids):
                        hit, finish = _flow_finish(flow_ids, flow_ends, flow, ops["start_ps"])
                        ops["end_ps"] = np.where(hit, np.maximum(ops["end_ps"], finish), ops["end_ps"])
                    plane_parts.append(ops)
                if not plane.is_device and not with_flows and plane_parts:
                    _pair_ends_by_name(plane, plane_parts)
                parts += plane_parts
            host.release_pages()  # its rows are taken: a many-host session holds one host's columns at a time
        if not parts:
            return empty_op_table()
        devices: dict[str, int] = {}  # label -> the table's device code, in first-seen order
        for part in parts:
            codes = [devices.setdefault(label, len(devices)) for label in part.pop("device_labels")]
            part["device_code"] = np.array(codes, np.int32)[part["device_code"]]
        if any("kernel" in p for p in parts):
            for part in parts:
                size = len(part["start_ps"])
                part.setdefault("kernel", _blank_text(size))
                part.setdefault("in_graph", np.zeros(size, dtype=bool))
                part.setdefault("launch", np.full(size, NO_VALUE, np.int64))
        # Where no op's end was paired with an `end:` event, one array holds the ends and the events' ends.
        ends_are_events_ends = all(p["event_end_ps"] is p["end_ps"] for p in parts)
        texts = {k: _concatenated([p.pop(k) for p in parts]) for k in ("name", "module", "kernel") if k in parts[0]}
        cols = {k: _joined([p.pop(k) for p in parts]) for k in list(parts[0])
                if not (k == "event_end_ps" and ends_are_events_ends)}
        cols.update(texts)
        del parts
        kernel_columns = ()
        if "kernel" in cols:
            _name_graph_gemms(session, cols)
            del cols["in_graph"], cols["launch"]
            kernel_columns = (cols.pop("kernel"),)
        # Resolve each distinct (op, module, program[, kernel]) once; a row keeps only its index among them.
        name_text, module_text = cols.pop("name"), cols.pop("module")
        coded, inverse = factorize_rows(name_text.codes, module_text.codes, cols.pop("program_id"),
                                        *(k.codes for k in kernel_columns))
        distinct = [(name_text.values[n], module_text.values[m], pid,
                     *(kernel_columns[0].values[k] for k in kernel)) for n, m, pid, *kernel in coded]
        del name_text, module_text, kernel_columns, coded
        resolved_names = np.empty(len(distinct), dtype=object)
        resolved_categories = np.empty(len(distinct), dtype=object)
        for k, (name, module_name, pid, *_) in enumerate(distinct):
            module = session.module_for(module_name, None if pid == NO_VALUE else pid) if module_name else None
            hlo_name = name
            found = module.find(name) if module else None
            if found is None and module is not None:
                # GPU kernels are named after their HLO instruction with '.N' written '_N'.
                hlo_name = _KERNEL_SUFFIX.sub(r".\1", name)
                found = module.find(hlo_name)
                hlo_name = hlo_name if found else name
            resolved_names[k] = hlo_name
            resolved_categories[k] = categorize(found[1] if found else None, module, name)
        cols["op"] = inverse.astype(np.int32, copy=False)  # per-op sums need not factorise millions of rows again
        op_keys = tuple((module_name, int(pid), resolved_names[k], kernel[0] if kernel else "")
                        for k, (_, module_name, pid, *kernel) in enumerate(distinct))
        del inverse
        starts = cols["start_ps"]
        if len(starts) and (starts[1:] >= starts[:-1]).all():  # one line's ops, in the order they ran
            ordered = {f: cols.pop(f) for f in OpTable.STORED if f in cols}
        else:
            order = np.argsort(starts, kind="stable")
            # In time order, one column at a time: the unordered column goes as soon as its ordered copy exists.
            ordered = {f: cols.pop(f)[order] for f in OpTable.STORED if f in cols}
        del starts
        if ends_are_events_ends:
            ordered["event_end_ps"] = ordered["end_ps"]
        return OpTable(**ordered, op_keys=op_keys, op_categories=tuple(resolved_categories.tolist()),
                       device_labels=tuple(devices))

    return cached(session, "op_table", build)


def device_op_counts(session: Session) -> dict[str, int]:
    """Device label -> its op executions, for every device with one, sorted by label; cached (a session assembled
    from host summaries carries it: xdiag.analysis.host_summary)."""

    def build() -> dict[str, int]:
        ops = op_table(session)
        counts = np.bincount(ops.device_code, minlength=len(ops.device_labels)).tolist() if len(ops) else []
        return {label: count for label, count in sorted(zip(ops.device_labels, counts)) if count}

    return cached(session, "device_op_counts", build)


def callback_call_ops(session: Session) -> np.ndarray:
    """Per op code (an index in op_table's op_keys): whether the op begins a host callback call. A TPU runs one
    callback as a chain of host send/recv ops (send, send-done, recv, recv-done, each reading the one before):
    only the chain's first op begins the call; every other callback op (e.g. a custom-call callback) is one call."""

    def build() -> np.ndarray:
        ops = op_table(session)
        begins = np.zeros(len(ops.op_keys), dtype=bool)
        for code, ((module_name, pid, name, *_), category) in enumerate(zip(ops.op_keys, ops.op_categories)):
            if category != "host_callback":
                continue
            module = session.module_for(module_name, None if pid == NO_VALUE else pid) if module_name else None
            found = module.find(name) if module else None
            if found is None or not found[1].is_host_transfer:
                begins[code] = True
                continue
            computation, instruction = found
            begins[code] = not any(computation.by_name[o].is_host_transfer
                                   for o in instruction.operands if o in computation.by_name)
        return begins

    return cached(session, "callback_call_ops", build)


def profile_op_costs(session: Session) -> dict[tuple[str, str], dict]:
    """(module, op) -> the cost the profiler recorded for it: FLOPs, bytes accessed, category, shape.

    TPU (and newer GPU) 'XLA Ops' lines carry XLA's own cost model in their event metadata; where it
    exists it is more exact than counting from HLO shapes.
    """

    def build() -> dict[tuple[str, str], dict]:
        costs: dict[tuple[str, str], dict] = {}
        for plane in session.host_by_host(session.device_planes(with_events=True)):
            spans = module_spans(plane)
            fingerprints = {}
            if spans is not None:
                for line in plane.lines:
                    if line.name == "XLA Modules":
                        for name in set(plane.names_of(line)):
                            module, _, rest = name.partition("(")
                            fingerprint = whole_number(rest.rstrip(")"))
                            if fingerprint is not None:
                                fingerprints[fingerprint] = module
            for line in plane.lines:
                if line.name != "XLA Ops":
                    continue
                for key in distinct_values(line.metadata_id).tolist():  # np.unique's, by a count per id: no sort
                    stats = plane.event_metadata_stats.get(key) or {}
                    if "flops" not in stats and "bytes_accessed" not in stats:
                        continue
                    op = _tpu_op_name(plane.event_display_names.get(key) or plane.event_names.get(key, ""))
                    module = fingerprints.get(stats.get("program_id"), "")
                    costs.setdefault((module, op), {
                        "flops": float(stats.get("flops") or 0),
                        "bytes": float(stats.get("bytes_accessed") or 0),
                        "hlo_category": stats.get("hlo_category", ""),
                        "shape": stats.get("shape_with_layout", ""),
                        "source": str(stats.get("source", "")),
                    })
        return costs

    return cached(session, "profile_op_costs", build)
