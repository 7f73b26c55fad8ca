"""Imported only by the forkserver XProf's workers fork from (`worker.context` preloads it); never import it elsewhere.

multiprocessing starts each forkserver child by running the caller's main script again, as `__mp_main__`, so that
functions the script defines can be unpickled. A script without an `if __name__ == "__main__":` guard (one that calls
`analyze_session` at its top level) then ran its whole analysis again in every worker. XProf's workers need nothing
from the main script (they run `worker.convert`, an importable function), so in this forkserver, and the workers
forked from it, the step that runs the main script is a no-op. Cheaper too: a worker of `xdiag analyze` no longer
re-runs the `xdiag` script (0.1 s of CPU each), so the forkserver need not import that script's modules ahead.

The forkserver is one per process: a caller that also starts forkserver processes of its own after an analysis
gets this one, whose children do not run its main script (functions defined there cannot reach them).
"""

from __future__ import annotations

import multiprocessing.spawn


def _skip_main(_name_or_path: str) -> None:
    """The child keeps the forkserver's own `__main__`."""


multiprocessing.spawn._fixup_main_from_path = _skip_main
multiprocessing.spawn._fixup_main_from_name = _skip_main
