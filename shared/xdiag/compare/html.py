"""diff.html: the before/after comparison as one self-contained page in summary.html's style (no scripts, no
external resources; autoescaped), and diff.json beside it."""

from __future__ import annotations

from pathlib import Path

from jinja2 import Environment, FileSystemLoader, select_autoescape

from xdiag.compare.sessions import SessionDiff
from xdiag.report.format import MISSING, format_number, humanize_key
from xdiag.report.render import bytecode_cache
from xdiag.fresh_files import replace_with

TEMPLATES = Path(__file__).parent / "templates"
DIFF_FILE, DIFF_PAGE = "diff.json", "diff.html"


def _signed(value: float | None, unit: str = "") -> str:
    if value is None:
        return MISSING
    text = format_number(value)
    return f"{'+' if value > 0 else ''}{text}{' ' + unit if unit else ''}"


def _plain(value: float | None, unit: str = "") -> str:
    return MISSING if value is None else f"{format_number(value)}{' ' + unit if unit else ''}"


def render_diff_html(diff: SessionDiff) -> str:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html", "j2"]),
                      trim_blocks=True, lstrip_blocks=True, bytecode_cache=bytecode_cache())
    env.filters.update(signed=_signed, plain=_plain, label=humanize_key)
    return env.get_template("diff.html.j2").render(d=diff)


def write_diff(diff: SessionDiff, out_dir: Path) -> tuple[Path, Path]:
    """Writes diff.json and diff.html into `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out_dir / DIFF_FILE, out_dir / DIFF_PAGE
    replace_with(json_path, diff.model_dump_json(indent=2).encode())  # never through a link planted in the folder
    replace_with(html_path, render_diff_html(diff).encode())
    return json_path, html_path
