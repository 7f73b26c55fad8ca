"""The package tree keeps its layers: no module imports from a layer above its own (so no import circle).

Layers, lowest first, as the README's Layout section lists them. Every import counts, including those inside
functions (lazy imports are still dependencies); `if TYPE_CHECKING:` imports count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "shared" / "xdiag"

LAYERS = [
    {"errors", "ids", "model", "local_ports", "disk_cache", "sizes"},
    {"profile"},
    {"cost"},
    {"analysis"},
    {"tools"},
    {"investigators"},
    {"report", "compare"},
    {"pipeline"},
    {"viewer"},
    {"capture"},
    {"handlers"},
    {"cloud"},
    {"agent"},
    {"cli", "workloads"},
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}
EXCEPTIONS = {
    # The bundled workloads attach to xdiag as a user's job would: through the public workload API only.
    ("workloads", "capture"): "xdiag.capture.workload",
}


def _part(module: str) -> str:
    return module.split(".")[1] if module.startswith("xdiag.") else ""


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "xdiag" else [f"xdiag.{alias.name}" for alias in node.names]
            found += [(node.lineno, name) for name in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return [(line, name) for line, name in found if name.startswith("xdiag.")]


def test_every_package_and_top_module_has_a_layer():
    parts = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    assert parts == set(RANK), f"give {sorted(parts - set(RANK))} a layer (or drop {sorted(set(RANK) - parts)})"


def test_no_module_imports_from_a_layer_above_its_own():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        own = relative.parts[0].removesuffix(".py")
        for line, module in _imports(path):
            target = _part(module)
            if target == own or RANK[target] <= RANK[own]:
                continue
            if EXCEPTIONS.get((own, target)) == module:
                continue
            upward.append(f"{relative}:{line} ({own}) imports {module} ({target})")
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)
