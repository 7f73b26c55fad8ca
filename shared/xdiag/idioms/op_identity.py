"""Idioms of what an op really is: ops whose category or shape would misread them, named from the primitive and the
library function their HLO records.

- linear_algebra: JAX's own linear-algebra routines (an LU or Cholesky factorisation, triangular solves, an explicit
  inverse): library custom calls and matmuls, not a kernel of the user's nor attention. Where the program forms an
  inverse, or factors the same matrix again for a determinant or for each right-hand side, one factorisation reused
  does the work.
"""

from __future__ import annotations

import re

from xdiag.idioms.catalogue import Match, idiom
from xdiag.idioms.program import Program, calls_per_step_of

ROUTINES = re.compile(r"(?:^|/)(?:jit\()?(inv|solve|slogdet|det|cholesky|lu|qr|eigh|svd|triangular_solve|"
                      r"lu_pivots_to_permutation|cho_solve|lu_solve)\)?(?=/|$)")
"""The jax.numpy.linalg / jax.scipy.linalg functions and lax.linalg primitives an op's framework path names."""
PRIMITIVES = frozenset({"cholesky", "lu", "qr", "eigh", "svd", "triangular_solve", "lu_pivots_to_permutation"})
"""lax.linalg's primitives: an op whose path names one is JAX's linear algebra, whatever the user's functions are
called (a user's own `solve` names no primitive)."""
MIN_STAKE_PERCENT = 2.0


def routines_of(op_name: str) -> set[str]:
    return set(ROUTINES.findall(op_name or ""))


@idiom("linear_algebra", "op_identity",
       "JAX's linear-algebra routines hold the time, factoring more than once",
       "{change}",
       "an explicit inverse costs a factorisation and n more solves, and a determinant or each separate solve of the "
       "same matrix factors it again; one factorisation, kept and reused, does all of it",
       gain=(0.5, 0.95),
       alternatives=("for a matrix that changes every call, jnp.linalg.solve(a, b) with every right-hand side as a "
                     "column of b (one factorisation per matrix)",))
def linear_algebra(program: Program) -> list[Match]:
    routines: dict[str, float] = {}
    ops: list[str] = []
    lines: dict[tuple[str, str], float] = {}
    module = ""
    for graph in program.graphs:
        key = program.module_key(graph.module)
        for site in graph.sites():
            found = routines_of(site.instruction.op_name)
            if not found & PRIMITIVES:
                continue
            timed = graph.timed_op(site)
            if timed in ops or (key, timed) not in program.op_ms:
                continue
            ms = program.op_ms[(key, timed)]
            ops.append(timed)
            module = module or key
            for routine in found:
                routines[routine] = routines.get(routine, 0.0) + ms
            line = program.line_of(graph, site)
            if line[0]:
                lines[line] = lines.get(line, 0.0) + ms
    stake = program.step_percent(sum(program.op_ms[(module, op)] for op in ops if (module, op) in program.op_ms)) \
        if ops else 0.0
    if stake < MIN_STAKE_PERCENT:
        return []
    ops_share = stake
    line, function = max(lines, key=lines.get) if lines else ("", "")
    named = sorted(routines, key=lambda r: -routines[r])
    calls_per_step = next((n for m, n in calls_per_step_of(program) if m == module), 0.0)
    if "inv" in routines and ("slogdet" in routines or "det" in routines):
        change = (f"factor the matrix once at {line or 'the line that inverts it'} and reuse it for both the solve and "
                  "the determinant: for a symmetric positive-definite matrix, c = jax.scipy.linalg.cho_factor(a); "
                  "x = jax.scipy.linalg.cho_solve(c, b); logdet = 2 * jnp.sum(jnp.log(jnp.diag(c[0]))), instead of "
                  "jnp.linalg.inv(a) @ b and jnp.linalg.slogdet(a) (lu = jax.scipy.linalg.lu_factor(a) and "
                  "lu_solve for a general one)")
    elif "inv" in routines:
        change = (f"solve instead of inverting at {line or 'the line that inverts'}: jnp.linalg.solve(a, b) (for a "
                  "symmetric positive-definite a, jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(a), b)) "
                  "instead of jnp.linalg.inv(a) @ b")
    elif "slogdet" in routines or "det" in routines:
        change = (f"read the determinant from the factorisation the solve makes at {line or 'its line'}: "
                  "c = jax.scipy.linalg.cho_factor(a) (symmetric positive-definite), logdet = 2 * "
                  "jnp.sum(jnp.log(jnp.diag(c[0]))), x = jax.scipy.linalg.cho_solve(c, b), instead of a separate "
                  "jnp.linalg.slogdet and jnp.linalg.solve")
    elif "solve" in routines and calls_per_step > 1.5:  # jnp.linalg.solve factors its matrix on every call
        # ... and each call is dispatched on its own: one solve of all right-hand sides also ends the device's idle
        # time between the calls
        idle = float(program.step.get("device_idle_percent") or 0.0)
        stake = min(stake + idle, 100.0)
        change = (f"factor the matrix once and solve every right-hand side with that factorisation at "
                  f"{line or 'the line that solves'}: lu = jax.scipy.linalg.lu_factor(a) outside the loop (or "
                  "c = jax.scipy.linalg.cho_factor(a) for a symmetric positive-definite a), then "
                  "jax.scipy.linalg.lu_solve(lu, B) (cho_solve(c, B)) with the right-hand sides as the columns of B, "
                  "instead of jnp.linalg.solve(a, b) per right-hand side")
    else:
        return []  # one factorisation per step, used once: nothing factored twice
    return [Match(
        "linear_algebra", stake,
        f"{len(ops)} ops of JAX's linear-algebra routines ({', '.join(named[:5])}: library custom calls and matmuls "
        f"for LU/Cholesky factorisation and triangular solves, not a kernel of the program's own) hold {ops_share:g}% of "
        f"the step" + (f", in {calls_per_step:.3g} calls of {module.split('(')[0]} per step, the device idle "
                       f"{program.step.get('device_idle_percent')}% of it between them" if calls_per_step > 1.5
                       else "") + (f", from {line}" if line else ""),
        module=module, ops=ops[:16], line=line, function=function,
        params={"change": change, "routines": named},
        facts={"routines_ms": {r: round(v, 3) for r, v in routines.items()}, "op_count": len(ops)})]
