"""Check that a program's variants compute the same result: build each, run STEPS steps, compare the carries.

A variant changes how the work is done, never what it computes; this runs on the CPU at the programs' tiny sizes.
Each leaf is compared relative to its largest value, and so is what the steps changed in it (a training step moves
its parameters little, so a wrong gradient shows only in the change). A program may define result(carry) (the part
of the carry to compare, where variants keep different state) and RTOL (where a variant changes precision on
purpose). Usage: python same_result.py PROGRAM [PROGRAM ...]; exit 1 on a mismatch.
"""
import sys

import jax
import numpy as np

from driver import load

STEPS = 3


def outputs(mod, variant):
    """The compared leaves after STEPS steps, and what the steps changed in each (None where the shape changed)."""
    pick = getattr(mod, "result", lambda c: c)
    step, carry, _ = mod.build(variant)
    first = [np.asarray(x, np.float64) for x in jax.tree.leaves(pick(carry))]
    for _ in range(STEPS):
        carry = step(carry)
    last = [np.asarray(x, np.float64) for x in jax.tree.leaves(pick(jax.block_until_ready(carry)))]
    if len(first) != len(last) or any(a.shape != b.shape for a, b in zip(first, last)):
        return last, None
    return last, [b - a for a, b in zip(first, last)]


def close(got, ref, tol):
    """Every leaf within tol of ref's, relative to ref's largest magnitude."""
    if got is None or ref is None:
        return got is ref
    return len(got) == len(ref) and all(
        a.shape == b.shape and np.max(np.abs(a - b), initial=0) <= tol * np.max(np.abs(b), initial=1e-30)
        for a, b in zip(got, ref))


def main(names):
    bad = 0
    for name in names:
        mod = load(name)
        tol = getattr(mod, "RTOL", 1e-3)
        ref, ref_change = outputs(mod, "before")
        for variant in mod.VARIANTS[1:]:
            got, change = outputs(mod, variant)
            ok = close(got, ref, tol) and close(change, ref_change, tol)
            bad += not ok
            print(f"{name}:{variant} {'same as' if ok else 'DIFFERS from'} before (rtol {tol:g})", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
