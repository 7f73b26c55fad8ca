"""The package tree keeps its layers and has no import circle, as the import contracts in pyproject.toml
(`[tool.importlinter]`) state them, checked by import-linter's `lint-imports`:

- layers, lowest first as docs/architecture.md (Layers) lists them: no module imports from a layer above its own, and
  every package and top-level module of xdiag has a layer (`exhaustive`);
- the examples reach xdiag only through the in-job SDK, as a user's job would;
- no circle between the modules of any package, at any depth (`acyclic_siblings`).

Every import counts, including those inside functions (lazy imports are still dependencies) and those under
`if TYPE_CHECKING:`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold():
    lint_imports = Path(sys.executable).parent / "lint-imports"
    assert lint_imports.exists(), "no lint-imports beside this Python: `pip install -e '.[test]'` installs it"
    # This checkout's package, whatever else the environment has installed as `xdiag`.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "shared"),
                                                                     os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([str(lint_imports), "--config", str(REPO / "pyproject.toml"), "--no-cache", "--no-logo"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert ", 0 broken." in result.stdout, result.stdout[-3000:]  # and it did check contracts
