"""Which line of the user's program an op comes from: the op's Python stack (the HLO module's stack frame index, or
its OpMetadata's source file and line), walked past the frames of installed libraries to the first frame of the
user's own code, with the library frame beside it where a library made the op (a Pallas kernel's own file).

"Library" is read from the path alone: installed packages (site-packages, dist-packages), the Python standard
library, frozen modules, and the source trees of the ML frameworks (a `jax/`, `flax/`, `torch/`… folder on the
path), wherever they are installed. Everything else is the user's.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from xdiag.analysis.intervals import ends_past_earlier, frame_parents, open_frame
from xdiag.profile.space import HloInstruction, HloModule, Session
from xdiag.profile.trace_json import KINETO, XPROF_CHROME, trace_format

FRAMEWORK_PACKAGES = frozenset({
    "jax", "jaxlib", "flax", "optax", "orbax", "chex", "haiku", "equinox", "keras", "tensorflow", "tf_keras",
    "transformers", "torch", "torchvision", "torch_xla", "triton", "numpy", "scipy", "tpu_inference",
    "vllm", "sglang", "accelerate", "deepspeed", "apex",
    # What runs beside a training loop on threads of its own: progress bars, logging, flags, metrics writers.
    "tqdm", "absl", "tensorboard", "wandb", "hydra", "click", "typer", "rich",
})
"""Packages whose source trees count as library code wherever they sit (a JAX checkout under /opt, a framework
installed in development mode, or a path relative to site-packages as PyTorch's profiler names frames): a folder of
one of these names on the path, with the file below it."""

_INSTALLED = re.compile(r"(^|/)(site-packages|dist-packages)/")
_STDLIB = re.compile(r"(^|/)lib(64)?/python\d+(\.\d+)?/")  # /usr/lib/python3.11/threading.py; not its site-packages

NO_SOURCE_HINT = (
    "the profile's HLO names no source line for any op. JAX records each op's Python stack in the HLO it compiles "
    "(the module's stack frame index) unless told not to: re-capture with jax_include_full_tracebacks_in_locations "
    "at its default (True; env JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS) and jax_traceback_in_locations_limit "
    "above 0 (default 100)"
)
"""Said once where a profile's modules record no source line for any op, with how to get them."""
NO_HLO_NOTE = (
    "the profile carries no HLO modules, whose Python stacks name each op's line (a framework that runs its ops "
    "without XLA records none)"
)
"""Said once where a profile holds ops but no HLO (TensorFlow without XLA) and is no trace file."""
NO_HLO_IN_TRACE_NOTE = (
    "an XProf Chrome trace carries no HLO, whose Python stacks name each op's line: the .xplane.pb captured beside "
    "it does"
)
"""Said once for a JAX run read from its Chrome trace (trace.json.gz, perfetto_trace.json.gz)."""
NO_TORCH_STACKS_HINT = (
    "the trace records no Python stacks: profile with torch.profiler.profile(..., with_stack=True, "
    "with_modules=True) to record each op's file and line and the nn.Module it runs in"
)
"""Said once where a PyTorch trace holds no Python-frame events."""


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    @property
    def short(self) -> str:
        """`file.py:LINE` with the folder it sits in (`examples/train.py:33`); a library file by its package and
        its last folder (`jax/…/paged_attention/paged_attention_kernel.py:628`): short enough for every op row."""
        return f"{short_path(self.file)}:{self.line}"


@functools.lru_cache(maxsize=1 << 16)  # a profile names a few hundred files over thousands of frames
def short_path(path: str) -> str:
    parts = path.split("/")
    installed = [i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages")]
    framework = [i for i, p in enumerate(parts[:-1]) if p in FRAMEWORK_PACKAGES]
    if installed or framework:
        inside = parts[installed[-1] + 1:] if installed else parts[framework[0]:]
        return "/".join(inside) if len(inside) <= 3 else "/".join([inside[0], "…", *inside[-2:]])
    return "/".join(parts[-2:])


@functools.lru_cache(maxsize=1 << 16)
def is_library(path: str) -> bool:
    if not path or path.startswith("<frozen"):
        return True
    if _INSTALLED.search(path) or (_STDLIB.search(path) and "-packages/" not in path):
        return True
    parts = path.split("/")
    if not path.startswith("/") and parts[0].removesuffix(".py") in sys.stdlib_module_names:
        return True  # a path relative to its sys.path entry, as PyTorch's profiler names frames: `threading.py`
    return any(part in FRAMEWORK_PACKAGES for part in parts[:-1])


PYTHON_FRAME = re.compile(r"^(?P<file>[^()]+\.py)\((?P<line>\d+)\): (?P<function>.+)$")
"""A Python frame as PyTorch's profiler names its `python_function` events: `torch/nn/modules/module.py(1743): _call_impl`
(the path relative to its sys.path entry)."""
TRACER_FRAME = re.compile(r"^\$(?P<file>[^\s:/]+\.py):(?P<line>\d+) (?P<function>.+)$")
"""A Python frame as JAX's Python tracer names its events: `$api.py:2479 block_until_ready` (the file's name only)."""
MODULE_EVENT = "nn.Module: "
"""The prefix of PyTorch's profiler's events for an nn.Module's forward call (`nn.Module: Linear_0`)."""


def python_frame(name: str) -> Frame | None:
    found = PYTHON_FRAME.match(name) or TRACER_FRAME.match(name)
    return Frame(found["file"], int(found["line"]), found["function"]) if found else None


def user_files(modules: list[HloModule]) -> frozenset[str]:
    """The names of the user's files the HLO's stacks record (`train.py`): JAX's Python tracer names a frame by its
    file's name alone, which says nothing of where it lies; a file the HLO names as the user's is the user's."""
    return frozenset(file.rsplit("/", 1)[-1] for m in modules for file, *_ in m.stack_frames
                     if file and not is_library(file))


def frame_kinds(known_user_files: frozenset[str]) -> Callable[[str], str]:
    """event name -> "user" (a frame of the user's code), "module" (an nn.Module call) or "" (anything else). A frame
    named by its path (PyTorch) is the user's unless the path is a library's; one named by its file's name alone (JAX's
    Python tracer) is the user's where the HLO's stacks name that file as the user's."""
    kinds: dict[str, str] = {}

    def kind_of(name: str) -> str:
        kind = kinds.get(name)
        if kind is None:
            if name.startswith(MODULE_EVENT):
                kind = "module"
            elif (found := PYTHON_FRAME.match(name)) is not None:
                kind = "" if is_library(found["file"]) else "user"
            elif (found := TRACER_FRAME.match(name)) is not None:
                kind = "user" if found["file"] in known_user_files else ""
            else:
                kind = ""
            kinds[name] = kind
        return kind
    return kind_of


def innermost_user_frames(starts: np.ndarray, ends: np.ndarray, names: Sequence[str], codes: np.ndarray,
                          kind_of: Callable[[str], str] | None = None) -> tuple[dict[str, int], dict[str, int]]:
    """Of nested Python-frame events of one line (event i: [starts[i], ends[i]), named names[codes[i]]), the time of
    each user frame that encloses no other user frame (the user's line that called into the libraries below it, not
    `threading.py` or the script's main), and of each nn.Module call that encloses no other: name -> summed duration.
    Other events are skipped. `kind_of`: frame_kinds' (by default, paths alone decide)."""
    kind_of = kind_of or frame_kinds(frozenset())
    kinds = np.array([kind_of(name) for name in names], dtype=object)
    out: tuple[dict[str, int], dict[str, int]] = ({}, {})
    if not len(codes):
        return out
    event_kinds = kinds[codes]
    for kind, totals in zip(("user", "module"), out):
        # A frame with one of its kind open inside it is not innermost: the frames no frame of its kind names as
        # its parent are (each kind its own stack).
        of_kind = np.flatnonzero(event_kinds == kind)
        if not len(of_kind):
            continue
        of_kind = of_kind[np.lexsort((-ends[of_kind], starts[of_kind]))]
        parents = frame_parents(starts[of_kind], ends[of_kind])
        leaf = np.ones(len(of_kind), dtype=bool)
        leaf[parents[parents >= 0]] = False
        leaves = of_kind[leaf]
        _sum_by_name(totals, codes[leaves], ends[leaves] - starts[leaves], names)
    return out


def enclosing_user_frames(frame_starts: np.ndarray, frame_ends: np.ndarray, frame_names: Sequence[str],
                          starts: np.ndarray, ends: np.ndarray) -> dict[str, int]:
    """Of the user's Python-frame events of one line ([frame_starts[i], frame_ends[i]), named frame_names[i]) and
    events on that line that are not user frames (a host wait, a dispatch, a compile: [starts, ends)), the innermost
    user frame that encloses each such event whole: name -> the summed time of the events it encloses, each counted
    once (one nested in an earlier one, `__array__` in `np.asarray`, is not). An event no recorded user frame encloses
    (its frame began before the trace did, or the tracer was off) is counted under no line."""
    out: dict[str, int] = {}
    if not len(starts) or not len(frame_starts):
        return out
    # One walk of frames and events: start ascending, the longer first, frames before events where they tie, and
    # frames of one span in their names' order.
    distinct = sorted(set(frame_names))
    code_of = {name: i for i, name in enumerate(distinct)}
    name_codes = np.array([code_of[name] for name in frame_names], dtype=np.int64)
    all_starts = np.concatenate([frame_starts, starts])
    all_ends = np.concatenate([frame_ends, ends])
    is_frame = np.arange(len(all_starts)) < len(frame_starts)
    tie = np.concatenate([name_codes, np.zeros(len(starts), dtype=np.int64)])
    walk = np.lexsort((tie, ~is_frame, -all_ends, all_starts))
    in_walk = is_frame[walk]
    frames = walk[in_walk]
    parents = frame_parents(all_starts[frames], all_ends[frames])
    at = np.flatnonzero(~in_walk)
    events = walk[at]
    inner = open_frame(parents, all_ends[frames], np.cumsum(in_walk)[at], all_starts[events], all_ends[events])
    counted = ends_past_earlier(np.zeros(len(events), dtype=np.int64), all_ends[events]) & (inner >= 0)
    events, inner = events[counted], inner[counted]
    _sum_by_name(out, name_codes[frames[inner]], all_ends[events] - all_starts[events], distinct)
    return out


def _sum_by_name(totals: dict[str, int], codes: np.ndarray, durations: np.ndarray, names: Sequence[str]) -> None:
    """totals[name] += the durations of its events, the names in the order their first event comes."""
    if not len(codes):
        return
    found, first, inverse = np.unique(codes, return_index=True, return_inverse=True)
    sums = np.zeros(len(found), dtype=np.int64)
    np.add.at(sums, inverse, durations.astype(np.int64))
    for k in np.argsort(first, kind="stable").tolist():
        name = names[int(found[k])]
        totals[name] = totals.get(name, 0) + int(sums[k])


@dataclass(frozen=True)
class OpSource:
    """Where an op comes from: the user's frame (None where every frame is a library's) and, where the innermost
    frame is a library's, that library frame (the kernel or layer that emitted the op); for a fusion, the other user
    lines its fused ops come from (a widening `astype` fused into the reduction that reads it)."""

    user: Frame | None
    library: Frame | None
    fused: tuple[Frame, ...] = ()
    of_operand: str = ""  # a copy XLA inserted records no stack: the line is that of the operand it moves

    def record(self) -> dict:
        """Compact, for op tables: {"line": "train.py:33", "function": "train_step", "library": …, "fused_lines": …,
        "line_of_operand": …}."""
        out: dict = {}
        if self.user is not None:
            out.update(line=self.user.short, function=self.user.function)
        if self.library is not None:
            out["library"] = self.library.short
        if self.fused:
            out["fused_lines"] = [f.short for f in self.fused]
        if self.of_operand:
            out["line_of_operand"] = self.of_operand
        return out

    @property
    def key(self) -> str:
        """The line an op's time is summed under: the user's, else the library's."""
        frame = self.user or self.library
        return frame.short if frame else ""


def source_of_stack(stack: list[tuple[str, int, str]]) -> OpSource | None:
    """The user's and the library's frame of a stack given innermost first; None for an empty stack."""
    if not stack:
        return None
    return _source_of_frames(tuple(stack))


@functools.lru_cache(maxsize=1 << 14)  # the fused ops of a program share a few hundred stacks: each walked once
def _source_of_frames(stack: tuple[tuple[str, int, str], ...]) -> OpSource | None:
    frames = [Frame(f, line, fn) for f, line, fn in stack]
    user = next((f for f in frames if not is_library(f.file)), None)
    library = frames[0] if is_library(frames[0].file) and frames[0].file and not frames[0].file.startswith("<") else None
    if library is None and user is None:
        return None
    return OpSource(user=user, library=library)


MAX_FUSED_LINES = 3
_NO_CODE = ("parameter", "constant", "tuple", "get-tuple-element", "bitcast")
MOVES = frozenset({"copy", "transpose", "bitcast", "reshape", "copy-start", "copy-done", "get-tuple-element"})
"""Ops that move or re-lay an array without computing: where XLA inserted one (a layout copy, a prefetch), it records
no stack, and the line that matters is the one that made the array it moves."""
OPERAND_HOPS = 4


def _moved_operand_source(module: HloModule, instruction: HloInstruction) -> OpSource | None:
    """The source of the nearest operand (through other moves, at most OPERAND_HOPS) that records one, naming it."""
    found = module.find(instruction.name)
    if found is None:
        return None
    by_name, current = found[0].by_name, instruction
    for _ in range(OPERAND_HOPS):
        operand = by_name.get(current.operands[0]) if current.operands else None
        if operand is None or operand.opcode == "parameter":
            return None
        source = source_of_stack(module.stack(operand))
        if source is not None:
            return OpSource(user=source.user, library=source.library, of_operand=operand.name)
        if operand.opcode not in MOVES:
            return None
        current = operand
    return None


def instruction_source(module: HloModule, instruction: HloInstruction) -> OpSource | None:
    """An instruction's source. A fusion takes its own stack (XLA keeps the root's), else the one most of its fused
    ops name, and lists the other user lines its fused ops come from (most ops first, at most MAX_FUSED_LINES). A
    move XLA inserted (no stack of its own) takes the line of the array it moves."""
    own = source_of_stack(module.stack(instruction))
    if own is None and instruction.opcode in MOVES:
        return _moved_operand_source(module, instruction)
    if instruction.opcode != "fusion" or not instruction.called:
        return own
    votes: dict[OpSource, int] = {}
    for name in instruction.called:
        computation = module.computations.get(name)
        for inner in computation.instructions if computation else ():
            source = None if inner.opcode in _NO_CODE else source_of_stack(module.stack(inner))
            if source is not None:
                votes[source] = votes.get(source, 0) + 1
    if own is None and not votes:
        return None
    own = own or max(votes, key=votes.get)
    lines: dict[Frame, int] = {}
    for source, count in votes.items():
        if source.user is not None and source.user.short != (own.user.short if own.user else ""):
            lines[source.user] = lines.get(source.user, 0) + count
    by_line: dict[str, Frame] = {}
    for frame in sorted(lines, key=lambda f: (-lines[f], f.line)):
        by_line.setdefault(frame.short, frame)
    return OpSource(user=own.user, library=own.library, fused=tuple(list(by_line.values())[:MAX_FUSED_LINES]))


def op_source(module: HloModule | None, name: str) -> OpSource | None:
    if module is None:
        return None
    found = module.find(name)
    return instruction_source(module, found[1]) if found else None


def has_python_frames(session: Session) -> bool:
    """Whether any host plane holds Python-frame events (PyTorch's `python_function`s, JAX's Python tracer's)."""
    return any(PYTHON_FRAME.match(name) or TRACER_FRAME.match(name)
               for plane in session.host_planes() for name in plane.event_names.values())


def source_lines_missing(session: Session) -> str | None:
    """Why the session's ops name no source line, and how to record them (NO_SOURCE_HINT, NO_TORCH_STACKS_HINT,
    NO_HLO_IN_TRACE_NOTE, NO_HLO_NOTE); None where they may."""
    if session.hlo_modules and not has_source_metadata(session.hlo_modules):
        return NO_SOURCE_HINT
    if trace_format(session) == KINETO:
        return None if has_python_frames(session) else NO_TORCH_STACKS_HINT
    if not session.hlo_modules:
        return NO_HLO_IN_TRACE_NOTE if trace_format(session) == XPROF_CHROME else NO_HLO_NOTE
    return None


def has_source_metadata(modules: list[HloModule]) -> bool:
    """Whether any module records a Python stack or a source line for any of its ops."""
    return any(m.stack_frames or any(i.source for c in m.computations.values() for i in c.instructions)
               for m in modules)


OP_KINDS = (
    ("matmul", ("matmul", "convolution")),
    ("attention", ()),
    ("collectives", ("collective",)),
    ("elementwise and reductions", ("elementwise", "reduction", "convert")),
    ("data movement", ("data_movement", "prefetch")),
    ("custom kernels", ("custom_call",)),
    ("host transfers", ("async_copy", "memcpy", "host_callback")),
)
"""The kinds op time is told in, each from the op categories it gathers (xdiag.analysis.categories); "attention" is
any op whose name, kernel or library frame says attention (a fused or Pallas attention kernel), whatever its
category. The rest (loops' own time, other ops) is "other"."""
_ATTENTION = re.compile(r"attention|fmha|flash_(?:fwd|bwd|attn)|mha_", re.IGNORECASE)


def op_kind(name: str, category: str, source: OpSource | None) -> str:
    library = source.library.file if source is not None and source.library is not None else ""
    if _ATTENTION.search(name) or _ATTENTION.search(library.rsplit("/", 1)[-1]):
        return "attention"
    return next((kind for kind, categories in OP_KINDS if category in categories), "other")


def time_by_kind(stats: list, lines_per_kind: int = 3) -> list[dict]:
    """Op time by kind, busiest first: each {kind, ms, share_percent, lines: the 1-`lines_per_kind` source lines that
    hold most of it, each {line, function, library, share_percent: this kind's ops at the line, line_share_percent:
    every op at the line (time_by_line's figure)}, both of all op time}; ops whose HLO names no line are
    counted in the kind, not in its lines. `stats` are xdiag.analysis.op_stats rows (name, category, total_ps,
    source)."""
    total = sum(s.total_ps for s in stats)
    if not total:
        return []
    at_line = {key: entry[0] for key, entry in _line_totals(stats).items()}
    kinds: dict[str, dict] = {}
    for s in stats:
        kind = kinds.setdefault(op_kind(s.name, s.category, s.source), {"ps": 0, "lines": {}})
        kind["ps"] += s.total_ps
        if s.source is not None and s.source.key:
            entry = kind["lines"].setdefault(s.source.key, [0, s.source])
            entry[0] += s.total_ps
    out = []
    for name, kind in sorted(kinds.items(), key=lambda item: -item[1]["ps"]):
        lines = [entry for entry in sorted(kind["lines"].values(), key=lambda entry: -entry[0])[:lines_per_kind]
                 if round(100 * entry[0] / total, 2) > 0]
        out.append({"kind": name, "ms": round(kind["ps"] / 1e9, 4),
                    "share_percent": round(100 * kind["ps"] / total, 2),
                    "lines": [{**source.record(), "share_percent": round(100 * ps / total, 2),
                               "line_share_percent": round(100 * at_line[source.key] / total, 2)}
                              for ps, source in lines]})
    return out


def time_by_line(stats: list, top: int = 20) -> list[dict]:
    """Op time by source line, busiest first (the first `top`): each {line, function, library, ms, share_percent,
    ops}: every op whose HLO names that line (the user's, else the library's), whatever its kind, its share of all
    op time. The one figure for a line: a finding that names the line and the op profile give this same share."""
    total = sum(s.total_ps for s in stats)
    if not total:
        return []
    lines = _line_totals(stats)
    return [{**source.record(), "ms": round(ps / 1e9, 4), "share_percent": round(100 * ps / total, 2), "ops": ops}
            for ps, ops, source in sorted(lines.values(), key=lambda entry: -entry[0])[:top]
            if round(100 * ps / total, 2) > 0]


def _line_totals(stats: list) -> dict[str, list]:
    """Per source line (the user's, else the library's): [op time in ps, ops, the line's source]."""
    lines: dict[str, list] = {}
    for s in stats:
        if s.source is not None and s.source.key:
            entry = lines.setdefault(s.source.key, [0, 0, s.source])
            entry[0] += s.total_ps
            entry[1] += 1
    return lines
