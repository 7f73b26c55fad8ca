"""Compiles the profile decoder (`wire.py`) ahead of time into `_wire_compiled*.so` next to it.

    python -m xdiag.profile.build_wire        # `make install` runs it; needs a C compiler

numba's pycc turns the exported functions into an extension module that needs only numpy at
run time, so reading a profile no longer imports numba and LLVM. The signatures are the ones the
reader calls with: the read-only byte view of the memory-mapped file, int64 positions and int64
id/slot arrays. Where this fails (no compiler), wire.py compiles with numba on first use instead.

The exported wrappers release the GIL around the compiled code, as `@njit(nogil=True)` does, so the
reader's threads decode lines in parallel. pycc has no option for it: the build compiles with
numba's own `release_gil` flag set (`_ReleasingTheGil`).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

MODULE = "_wire_compiled"


def build() -> Path:
    os.environ["XDIAG_WIRE_JIT"] = "1"  # the numba-decorated functions, whatever is built already
    # pycc compiles the cached helpers in an environment numba records as '<dynamic>': cached there, a later
    # numba process could not load them (ModuleNotFoundError), so this build keeps numba's cache to itself.
    if "numba" in sys.modules:
        raise RuntimeError("numba was imported before the build could give it its own cache folder")
    cache_dir = tempfile.mkdtemp(prefix="xdiag-build-wire-")
    os.environ["NUMBA_CACHE_DIR"] = cache_dir
    from numba import types
    from numba.pycc import CC
    from numba.pycc import compiler as pycc_compiler

    class _ReleasingTheGil(pycc_compiler.Flags):
        """pycc's compile flags with numba's `release_gil` on: each exported wrapper unboxes its arguments,
        releases the GIL, runs the compiled function and takes the GIL back to box the results."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.release_gil = True

    pycc_compiler.Flags = _ReleasingTheGil  # the name pycc's _cull_exports builds its flags from

    from xdiag.profile import wire

    if wire._ahead_of_time is not None:
        raise RuntimeError("wire.py was imported with the ahead-of-time module before the build")
    wire.SOURCE_STAMP.unlink(missing_ok=True)  # a failed build leaves no stamp, so no stale module is used
    buffer = types.Array(types.uint8, 1, "C", readonly=True)
    column = types.Array(types.int64, 1, "C")
    count = types.int64
    compiler = CC(MODULE)
    compiler.output_dir = str(Path(wire.__file__).parent)
    compiler.verbose = False
    compiler.export("scan_fields", types.Tuple((column,) * 5 + (count, count))(buffer, count, count))(
        wire.scan_fields.py_func
    )
    compiler.export(
        "decode_line", types.Tuple((column,) * 8 + (count, count))(buffer, count, count, column, column, column)
    )(wire.decode_line.py_func)
    compiler.export("distinct_strings", types.Tuple((column, column))(buffer, column, column))(
        wire.distinct_strings.py_func
    )
    flags = types.Array(types.uint8, 1, "C")
    compiler.export("line_without_events", types.Tuple((count,) * 4)(buffer, count, count, flags, flags))(
        wire.line_without_events.py_func
    )
    compiler.export("thinned_line", types.Tuple((count, count, types.boolean, count, count))(
        buffer, count, count, flags, count, flags))(wire.thinned_line.py_func)
    compiler.export("line_without_stat", types.Tuple((count,) * 4)(buffer, count, count, flags, flags))(
        wire.line_without_stat.py_func
    )
    try:
        compiler.compile()
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    wire.SOURCE_STAMP.write_text(wire.source_digest() + "\n")
    return Path(compiler.output_dir) / compiler.output_file


if __name__ == "__main__":
    try:
        print(f"compiled the profile decoder ahead of time: {build()}")
    except Exception as error:  # no compiler here: numba compiles on first use instead
        print(f"the profile decoder stays compiled on first use (numba): {type(error).__name__}: {error}", file=sys.stderr)
