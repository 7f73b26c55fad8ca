"""The documents say what the code is: the tool reference is the registry's own, docs/architecture.md names modules
that exist and every tool and Cloud Function, links resolve, and the settings the documents name are read by code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from xdiag.pipeline.topics import MESSAGE_TYPES
from xdiag.tools import REGISTRY
from xdiag.tools.describe import markdown

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO / "shared"
DOCS = REPO / "docs"
ARCHITECTURE = DOCS / "architecture.md"
# a path in the package (`shared/xdiag/…` or `xdiag/…`), not a bucket's `…/<session>/xdiag/…`
_IN_TREE = r"(?:(?<=shared/)|(?<![\w/.<>…-]))"
DOCUMENTS = [REPO / "README.md", REPO / "bench" / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_tool_reference_is_generated_from_the_registry():
    committed = (DOCS / "reference" / "tools.md").read_text()
    assert committed == markdown(), (
        "docs/reference/tools.md differs from the registry: run "
        "`python -m xdiag.tools.describe --markdown > docs/reference/tools.md`")


def _defines(module_file: Path, name: str) -> bool:
    source = module_file.read_text()
    return re.search(rf"^(?:def|class|async def)\s+{name}\b|^{name}\s*[:=]", source, re.MULTILINE) is not None


def _module_file(dotted: str) -> Path | None:
    path = SHARED / Path(*dotted.split("."))
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    return None


def _missing_modules(text: str) -> list[str]:
    missing = []
    for path in set(re.findall(rf"{_IN_TREE}xdiag/[\w/]+\.(?:py|md)\b", text)):
        if not (SHARED / path).is_file():
            missing.append(path)
    for folder in set(re.findall(rf"{_IN_TREE}xdiag/[\w/]*\w/(?=[`\s,)])", text)):
        if not (SHARED / folder).is_dir():
            missing.append(folder)
    for path in set(re.findall(r"\bfunctions/\w+\.py\b", text)):
        if not (REPO / path).is_file():
            missing.append(path)
    for dotted in set(re.findall(r"(?<![\w/.])xdiag(?:\.\w+)+", text)):
        parts = dotted.split(".")
        # the longest prefix that is a module; what follows it must be a name that module defines
        for cut in range(len(parts), 1, -1):
            module_file = _module_file(".".join(parts[:cut]))
            if module_file is not None:
                if cut < len(parts) and not _defines(module_file, parts[cut]):
                    missing.append(dotted)
                break
        else:
            missing.append(dotted)
    return sorted(missing)


def test_architecture_names_only_modules_that_exist():
    assert _missing_modules(ARCHITECTURE.read_text()) == []


def test_every_document_names_only_modules_that_exist():
    missing = {doc.relative_to(REPO).as_posix(): _missing_modules(doc.read_text()) for doc in DOCUMENTS}
    assert {doc: names for doc, names in missing.items() if names} == {}


def test_architecture_names_every_tool_port_topic_and_cloud_function():
    text = ARCHITECTURE.read_text()
    assert [name for name in sorted(REGISTRY) if f"`{name}`" not in text] == []
    ports = [node.name for node in ast.walk(ast.parse((SHARED / "xdiag" / "pipeline" / "ports.py").read_text()))
             if isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") == "Protocol" for b in node.bases)]
    assert ports and [port for port in ports if f"`{port}`" not in text] == []
    assert [topic for topic in MESSAGE_TYPES if f"`{topic}`" not in text] == []
    functions = sorted(p.name for p in (REPO / "functions").glob("*.py"))
    assert functions
    assert [name for name in functions if f"functions/{name}" not in text] == []


def test_links_between_documents_resolve():
    broken = []
    for doc in DOCUMENTS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(REPO)} -> {target}")
    assert broken == []


def test_settings_the_documents_name_are_read_by_the_code():
    code = "\n".join(p.read_text() for root in (SHARED / "xdiag", REPO / "functions", REPO / "infra")
                     for p in root.rglob("*") if p.suffix in (".py", ".tf"))
    code += (REPO / "tests" / "conftest.py").read_text()  # the test suite's own settings (XDIAG_ALLOW_MISSING_SHARED)
    named = set()
    for doc in DOCUMENTS:
        named |= set(re.findall(r"\b(?:XDIAG|VERTEX)_[A-Z0-9_]*[A-Z0-9]\b", doc.read_text()))
    assert sorted(name for name in named if name not in code) == []


def test_readme_is_for_users_and_its_two_commands_are_the_makefiles():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 300
    targets = set(re.findall(r"^([a-z]+):", (REPO / "Makefile").read_text(), re.MULTILINE))
    for command in ("make demo", "make test"):
        assert command in readme
        assert command.split()[1] in targets
    assert not re.search(r"\b(?:first|second|third|\w+th) round\b", readme, re.IGNORECASE)


def test_every_finding_the_readme_lists_is_one_the_investigators_make():
    listed = re.findall(r"^\| `(\w+)` \|", (REPO / "README.md").read_text(), re.MULTILINE)
    assert len(listed) >= 10
    source = "\n".join(p.read_text() for p in (SHARED / "xdiag" / "investigators").rglob("*.py"))
    assert [key for key in listed if f'"{key}"' not in source] == []
