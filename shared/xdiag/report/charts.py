"""Inline SVG charts, built in Python: no scripts, no fonts, no external files.

Every piece of text that reaches an SVG goes through `Markup.format`, which escapes its
arguments, so a profile-derived label can never inject markup.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from markupsafe import Markup

from xdiag.report.format import format_number

STEP_CATEGORY_COLORS = {
    "compute": "#3b78d8",
    "collective": "#8e5bd6",
    "transfer": "#5aa469",
    "compile": "#e3a01b",
    "host_sync": "#d9534f",
    "dispatch": "#1aa3b3",
    "host_other": "#9aa6b2",
}
EXTRA_COLORS = ("#5aa469", "#c76b98", "#b5894b", "#4f6d8f", "#d17c3f", "#7a8b2f", "#6c5b7b", "#2f8f83")
BAR_COLOR = "#3b78d8"
MAX_STEP_COLUMNS = 100
MAX_BARS = 20

_RECT = Markup('<rect x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}" fill="{}"/>')
_RECT_TIP = Markup('<rect x="{:.2f}" y="{:.2f}" width="{:.2f}" height="{:.2f}" fill="{}"><title>{}</title></rect>')
_REST = Markup('<rect x="{:.2f}" y="0" width="{:.2f}" height="{:.2f}" class="rest"><title>unattributed</title></rect>')
_LINE = Markup('<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" class="{}"/>')
_TEXT = Markup('<text x="{:.1f}" y="{:.1f}" class="{}" text-anchor="{}">{}</text>')
_Y_TITLE = Markup(
    '<text x="14" y="{:.1f}" class="axis" transform="rotate(-90 14 {:.1f})" text-anchor="middle">{}</text>'
)
_GROUP = Markup("<g><title>{}</title>{}</g>")
_SVG = Markup('<svg class="{}" viewBox="0 0 1000 {:.0f}" role="img" aria-label="{}">{}</svg>')


def color_for(category: str, index: int) -> str:
    return STEP_CATEGORY_COLORS.get(category) or EXTRA_COLORS[index % len(EXTRA_COLORS)]


def _num(value: Any) -> float:
    """A number to plot; anything else (None, text) plots as 0."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _nice_ceiling(value: float) -> tuple[float, float]:
    """(axis top, tick step) for an axis from 0 to at least `value`, with 4-6 round ticks."""
    if value <= 0:
        return 1.0, 0.25
    raw = value / 5
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return step * math.ceil(value / step - 1e-9), step


def _text_width(text: str, font_px: float = 14.0) -> float:
    """A generous estimate of rendered width (bold sans-serif), in viewBox units."""
    return len(text) * font_px * 0.62


def _label(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def breakdown_bar(breakdown: Mapping[str, Any], step_ms: float | None = None) -> tuple[Markup, list]:
    """One horizontal bar split by step-time category (percent of step time), and its legend rows
    (label, colour, "percent · ms")."""
    parts = [(str(k), _num(v)) for k, v in breakdown.items() if v is not None]
    total = sum(v for _, v in parts)
    scale = 100.0 / total if total > 100.0 else 1.0
    width, height = 1000.0, 40.0
    x = 0.0
    shapes, legend = [], []
    for index, (category, percent) in enumerate(parts):
        color = color_for(category, index)
        ms_text = f" · {format_number(_num(step_ms) * percent / 100)} ms" if step_ms else ""
        legend.append((category, color, f"{format_number(percent)}%{ms_text}"))
        w = width * percent * scale / 100.0
        if w <= 0:
            continue
        shapes.append(_RECT_TIP.format(x, 0, w, height, color, f"{category}: {format_number(percent)}%{ms_text}"))
        for text in (f"{category} {format_number(percent)}%", f"{format_number(percent)}%"):
            if _text_width(text) + 14 <= w:  # a label only where it fits inside its segment
                shapes.append(_TEXT.format(x + 7, 25, "seg", "start", text))
                break
        x += w
    if x < width - 0.5:
        shapes.append(_REST.format(x, width - x, height))
    return _SVG.format("chart bar", height, "step-time breakdown", Markup("").join(shapes)), legend


def step_columns(
    steps: Sequence[Mapping[str, Any]], categories: Sequence[str], limit: int = MAX_STEP_COLUMNS
) -> tuple[Markup, list]:
    """Stacked columns, one per step (the first `limit` rows), split by category in ms; and the legend
    (label, colour, "") of the categories that occur."""
    rows = list(steps[:limit])
    categories = [c for c in categories if any(_num(r.get(c)) > 0 for r in rows)] or list(categories)
    colors = {c: color_for(c, i) for i, c in enumerate(categories)}
    width, height = 1000.0, 260.0
    left, right, top, bottom = 64.0, 10.0, 10.0, 34.0
    plot_w, plot_h = width - left - right, height - top - bottom
    base = top + plot_h
    peak = max((max(_num(r.get("step_ms")), sum(_num(r.get(c)) for c in categories)) for r in rows), default=0.0)
    axis_top, tick = _nice_ceiling(peak)
    out = []
    for k in range(round(axis_top / tick) + 1):
        y = base - plot_h * (k * tick) / axis_top
        out.append(_LINE.format(left, y, width - right, y, "grid"))
        out.append(_TEXT.format(left - 6, y + 4, "tick", "end", format_number(k * tick)))
    out.append(_Y_TITLE.format(top + plot_h / 2, top + plot_h / 2, "ms"))
    n = max(len(rows), 1)
    slot = plot_w / n
    bar = min(max(slot * 0.78, 1.0), 56.0)  # a few steps must not make slabs
    label_every = max(1, math.ceil(n / 20))
    for i, r in enumerate(rows):
        x = left + i * slot + (slot - bar) / 2
        number = format_number(r["step"]) if isinstance(r.get("step"), (int, float)) else str(i)
        tip = [f"step {number}" + (f" ({r['host']})" if r.get("host") else "")]
        if r.get("step_ms") is not None:
            tip.append(f"{format_number(_num(r['step_ms']))} ms")
        segments, y = [], base
        for c in categories:
            v = _num(r.get(c))
            if v <= 0:
                continue
            tip.append(f"{c} {format_number(v)} ms")
            h = plot_h * v / axis_top
            y -= h
            segments.append(_RECT.format(x, y, bar, h, colors[c]))
        out.append(_GROUP.format("\n".join(tip), Markup("").join(segments)))
        if i % label_every == 0:
            out.append(_TEXT.format(x + bar / 2, base + 16, "tick", "middle", number))
    out.append(_LINE.format(left, base, width - right, base, "axisline"))
    out.append(_TEXT.format(left + plot_w / 2, height - 4, "axis", "middle", "step"))
    return _SVG.format("chart", height, "time per step", Markup("").join(out)), [(c, colors[c], "") for c in categories]


def horizontal_bars(values: Mapping[str, Any], unit: str = "ms", limit: int = MAX_BARS) -> Markup:
    """One bar per key, largest first (the first `limit`), with its value at the end of the bar."""
    items = sorted(((str(k), _num(v)) for k, v in values.items() if v is not None), key=lambda kv: -kv[1])[:limit]
    row_h, left, right = 26.0, 230.0, 120.0
    height = row_h * len(items) + 8
    peak = max((v for _, v in items), default=0.0) or 1.0
    total = sum(v for _, v in items) or 1.0
    out = []
    for i, (label, v) in enumerate(items):
        y = 4 + i * row_h
        w = max((1000 - left - right) * v / peak, 1.0)
        tip = f"{label}: {format_number(v)} {unit} ({format_number(100 * v / total)}% of the total)"
        out.append(_GROUP.format(tip, Markup("").join((
            _TEXT.format(left - 8, y + 17, "lbl", "end", _label(label, 30)),
            _RECT.format(left, y + 3, w, row_h - 8, BAR_COLOR),
            _TEXT.format(left + w + 6, y + 17, "val", "start", f"{format_number(v)} {unit}"),
        ))))
    return _SVG.format("chart", height, "bar chart", Markup("").join(out))
