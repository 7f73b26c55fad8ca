"""What a finding's subject must show in the program's own HLO, read from its instructions' opcodes, shapes and
custom-call targets (not by the rules' own classifiers): attention is a softmax's elementwise work over an S×S array a dot made; a
kernel is a Mosaic or Triton custom call that is neither a host callback nor one of lax.linalg's routines; a reduction is a reduce."""

from __future__ import annotations

import re
from pathlib import Path

from xdiag.profile.locate import locate_session
from xdiag.profile.session import read_session

_KERNEL_TARGET = re.compile(r"tpu_custom_call|triton")
_NOT_A_KERNEL = re.compile(r"callback|(?<![a-z])(lu|cholesky|qr|eigh|svd|triangular_solve)(?![a-z])")
HLO_NAME = re.compile(r"(?<![\w./%-])%?[A-Za-z_][\w-]*\.\d+(?:\.[\w-]+)*(?![\w(])")
"""An HLO instruction's name: an identifier, then a dot and its number (`fusion.46`, `%copy.3`,
`bitcast_dynamic-update-slice_fusion.4`, `params__w__.1`); not a file (`train.py:33`), a call (`jax.lax.scan`) or a
number (`5.49 ms`). XLA makes these names when the program compiles: no line of the user's program holds one, so no
fix and no idiom's account of what the program does may carry one (issue 71)."""
HLO_SUBJECT = {"materialised_attention": "attention", "opaque_kernel": "kernel", "widening_converts": "reduction"}


def hlo_shows(subject: str, instructions: list) -> bool:
    """Whether the instructions hold the subject ("attention", "kernel" or "reduction")."""
    if subject == "attention":  # scores q·kᵀ ([.., S, S] from a dot, or the convolution XLA:TPU makes of one), then
        # the softmax over them: its elementwise work (x - max, exp, / sum), or the fusion XLA names for it; a
        # convolution's result may hold a batch dimension after the S×S (grouped heads), so dimensions in any order
        square = lambda i: len(i.dims) >= 3 and any(a == b >= 128 for a, b in zip(i.dims, i.dims[1:]))  # noqa: E731
        scores = {tuple(sorted(i.dims)) for i in instructions if i.opcode in ("dot", "convolution") and square(i)}
        return bool(scores) and any(i.opcode in ("exponential", "subtract", "divide") and tuple(sorted(i.dims))
                                    in scores or "softmax" in i.name for i in instructions)
    if subject == "kernel":  # a Mosaic (Pallas TPU) or Triton kernel; XLA's own custom calls (AllocateBuffer,
        # LuDecompositionBlock, ...), host callbacks and lax.linalg's routines are no kernel of the user's
        return any(i.opcode == "custom-call" and _KERNEL_TARGET.search(i.custom_call_target.lower())
                   and not _NOT_A_KERNEL.search(i.op_name.lower()) for i in instructions)
    return any(i.opcode == "reduce" for i in instructions)


def instructions_of(path: Path) -> list:
    """Every HLO instruction of the capture at `path`, fusions' bodies included."""
    located = locate_session(path)
    session = read_session(located.files)
    return [i for m in session.hlo_modules for c in m.computations.values() for i in c.instructions]


def hlo_names(fixes: list[str], idioms: list[dict]) -> list[str]:
    """The HLO instruction names in findings' fixes and in what the anatomy's idioms say the program does."""
    return ([f"fix: {HLO_NAME.findall(fix)}" for fix in fixes if HLO_NAME.search(fix)]
            + [f"{m['idiom']}: {HLO_NAME.findall(m['what'])}" for m in idioms if HLO_NAME.search(m.get("what", ""))])
