"""Inline SVG charts, built in Python: no scripts, no fonts, no external files.

Every piece of text that reaches an SVG goes through `Markup.format`, which escapes its
arguments, so a profile-derived label can never inject markup.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from markupsafe import Markup

from xdiag.report.format import format_duration_ms as format_duration
from xdiag.report.format import format_number

STEP_CATEGORY_COLORS = {
    "compute": "#3b78d8",
    "collective": "#8e5bd6",
    "transfer": "#5aa469",
    "compile": "#e3a01b",
    "warm_up": "#b5894b",
    "host_sync": "#d9534f",
    "dispatch": "#1aa3b3",
    "host_other": "#9aa6b2",
}
CATEGORY_WORDS = {"host_sync": "host sync", "host_other": "other host work", "warm_up": "warm-up"}
"""Step-time categories as a reader reads them (the rest read as they are named)."""


def category_words(category: str) -> str:
    return CATEGORY_WORDS.get(category, category)


EXTRA_COLORS = ("#5aa469", "#c76b98", "#b5894b", "#4f6d8f", "#d17c3f", "#7a8b2f", "#6c5b7b", "#2f8f83")
BAR_COLOR = "#3b78d8"
MAX_STEP_COLUMNS = 100
MAX_BARS = 20

_RECT = Markup('<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="%s"/>')
_RECT_TIP = Markup('<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="%s"><title>%s</title></rect>')
_REST = Markup('<rect x="%.2f" y="0" width="%.2f" height="%.2f" class="rest"><title>%s</title></rect>')
_LINE = Markup('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" class="%s"/>')
_TEXT = Markup('<text x="%.1f" y="%.1f" class="%s" text-anchor="%s">%s</text>')
_Y_TITLE = Markup(
    '<text x="14" y="%.1f" class="axis" transform="rotate(-90 14 %.1f)" text-anchor="middle">%s</text>'
)
_GROUP = Markup("<g><title>%s</title>%s</g>")
_SVG = Markup('<svg class="%s" viewBox="0 0 1000 %.0f" role="img" aria-label="%s">%s</svg>')


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


REST_COLOR = "#dfe3e8"


def breakdown_bar(breakdown: Mapping[str, Any], step_ms: float | None = None, height: float = 40.0,
                  labels: bool = True) -> tuple[Markup, list]:
    """One horizontal bar split by step-time category (percent of step time), and its legend rows
    (label, colour, "percent · ms"). Time no category covers is drawn and listed as "unattributed"."""
    parts = [(str(k), _num(v)) for k, v in breakdown.items() if v is not None]
    total = sum(v for _, v in parts)
    scale = 100.0 / total if total > 100.0 else 1.0
    width = 1000.0
    x = 0.0
    shapes, legend = [], []

    def ms_text(percent: float) -> str:
        return f" · {format_duration(_num(step_ms) * percent / 100)}" if step_ms else ""

    for index, (category, percent) in enumerate(parts):
        color = color_for(category, index)
        if percent > 0:  # a category that took no time is not worth a legend entry
            legend.append((category_words(category), color, f"{format_number(percent)}%{ms_text(percent)}"))
        w = width * percent * scale / 100.0
        if w <= 0:
            continue
        shapes.append(_RECT_TIP % (x, 0, w, height, color,
                                       f"{category_words(category)}: {format_number(percent)}%{ms_text(percent)}"))
        if labels:
            for text in (f"{category_words(category)} {format_number(percent)}%", f"{format_number(percent)}%"):
                if _text_width(text) + 14 <= w:  # a label only where it fits inside its segment
                    shapes.append(_TEXT % (x + 7, height / 2 + 5, "seg", "start", text))
                    break
        x += w
    rest = 100.0 - total
    if x < width - 0.5 and rest > 0.05:
        shapes.append(_REST % (x, width - x, height, f"unattributed: {format_number(rest)}%{ms_text(rest)}"))
        text = f"unattributed {format_number(rest)}%"
        if labels and _text_width(text) + 14 <= width - x:
            shapes.append(_TEXT % (x + 7, height / 2 + 5, "segdark", "start", text))
        legend.append(("unattributed", REST_COLOR,
                       f"{format_number(rest)}%{ms_text(rest)} — step time no category covers"))
    return _SVG % ("chart bar", height, "step-time breakdown", Markup("").join(shapes)), legend


def step_columns(
    steps: Sequence[Mapping[str, Any]], categories: Sequence[str], limit: int = MAX_STEP_COLUMNS,
    duration_text=format_duration,
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
        out.append(_LINE % (left, y, width - right, y, "grid"))
        out.append(_TEXT % (left - 6, y + 4, "tick", "end", format_number(k * tick)))
    out.append(_Y_TITLE % (top + plot_h / 2, top + plot_h / 2, "ms"))
    n = max(len(rows), 1)
    slot = plot_w / n
    bar = min(max(slot * 0.78, 1.0), 56.0)  # a few steps must not make slabs
    label_every = max(1, math.ceil(n / 20))
    for i, r in enumerate(rows):
        x = left + i * slot + (slot - bar) / 2
        number = format_number(r["step"]) if isinstance(r.get("step"), (int, float)) else str(i)
        tip = [f"step {number}" + (f" ({r['host']})" if r.get("host") else "")]
        if r.get("step_ms") is not None:
            tip.append(duration_text(_num(r["step_ms"])))
        segments, y = [], base
        for c in categories:
            v = _num(r.get(c))
            if v <= 0:
                continue
            tip.append(f"{category_words(c)} {duration_text(v)}")
            h = plot_h * v / axis_top
            y -= h
            segments.append(_RECT % (x, y, bar, h, colors[c]))
        out.append(_GROUP % ("\n".join(tip), Markup("").join(segments)))
        if i % label_every == 0:
            out.append(_TEXT % (x + bar / 2, base + 16, "tick", "middle", number))
    out.append(_LINE % (left, base, width - right, base, "axisline"))
    out.append(_TEXT % (left + plot_w / 2, height - 4, "axis", "middle", "step"))
    return (_SVG % ("chart", height, "time per step", Markup("").join(out)),
            [(category_words(c), colors[c], "") for c in categories])


def horizontal_bars(values: Mapping[str, Any], value_text=format_duration, limit: int = MAX_BARS) -> Markup:
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
        tip = f"{label}: {value_text(v)} ({format_number(100 * v / total)}% of the total)"
        out.append(_GROUP % (tip, Markup("").join((
            _TEXT % (left - 8, y + 17, "lbl", "end", _label(label, 30)),
            _RECT % (left, y + 3, w, row_h - 8, BAR_COLOR),
            _TEXT % (left + w + 6, y + 17, "val", "start", value_text(v)),
        ))))
    return _SVG % ("chart", height, "bar chart", Markup("").join(out))


# ------------------------------------------------------------------------------------------------ roofline

CATEGORY_COLORS = {
    "matmul": "#3b78d8", "convolution": "#1f4e9c", "custom_call": "#8e5bd6", "elementwise": "#5aa469",
    "reduction": "#b5894b", "collective": "#d9534f", "async_copy": "#e3a01b", "memcpy": "#e3a01b",
    "data_movement": "#d17c3f", "host_callback": "#c76b98", "other": "#9aa6b2",
}
_CIRCLE = Markup('<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s" class="pt"><title>%s</title></circle>')
_PATH = Markup('<path d="%s" class="%s"/>')
_RIDGE = Markup('<circle cx="%.1f" cy="%.1f" r="4" class="ridge"><title>%s</title></circle>')


def category_color(category: str, index: int = 0) -> str:
    return CATEGORY_COLORS.get(category) or EXTRA_COLORS[index % len(EXTRA_COLORS)]


def _decades(low: float, high: float) -> tuple[int, int]:
    """Whole powers of ten that enclose [low, high]."""
    return math.floor(math.log10(low)), math.ceil(math.log10(high))


def roofline_chart(
    points: Sequence[Mapping[str, Any]],
    peak_flops_per_s: float | None,
    peak_bytes_per_s: float | None,
    rate_text,
    intensity_text,
) -> tuple[Markup, list]:
    """A log-log roofline: x = arithmetic intensity (FLOP/byte), y = achieved FLOP/s. Each point is
    {label, intensity, flops_per_s, time_share, category, tip}; its area follows its share of op time.
    With both peaks, the bandwidth roof (y = bandwidth·x) meets the compute roof at the ridge point; without
    them only the points are drawn. `rate_text`/`intensity_text` format tick labels. Returns the SVG and the
    legend of the categories shown (label, colour, '')."""
    roofs = bool(peak_flops_per_s and peak_bytes_per_s)
    ridge = peak_flops_per_s / peak_bytes_per_s if roofs else None
    xs = [p["intensity"] for p in points] + ([ridge / 30, ridge * 30] if ridge else [])
    ys = [p["flops_per_s"] for p in points] + ([peak_flops_per_s * 1.5, peak_flops_per_s / 1e4] if roofs else [])
    x0, x1 = _decades(min(xs), max(xs)) if xs else (-2, 3)
    y0, y1 = _decades(min(ys), max(ys)) if ys else (6, 12)
    x1, y1 = max(x1, x0 + 1), max(y1, y0 + 1)
    width, height = 1000.0, 440.0
    left, right, top, bottom = 96.0, 20.0, 16.0, 44.0
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(x: float) -> float:
        return left + plot_w * (math.log10(x) - x0) / (x1 - x0)

    def py(y: float) -> float:
        return top + plot_h * (1 - (math.log10(y) - y0) / (y1 - y0))

    out = []
    for k in range(x0, x1 + 1):
        x = px(10.0**k)
        out.append(_LINE % (x, top, x, top + plot_h, "grid"))
        anchor = "end" if k == x1 else "middle"  # the last label inside the chart, not cut at its edge
        out.append(_TEXT % (x, top + plot_h + 16, "tick", anchor, intensity_text(10.0**k)))
    for k in range(y0, y1 + 1):
        y = py(10.0**k)
        out.append(_LINE % (left, y, width - right, y, "grid"))
        out.append(_TEXT % (left - 6, y + 4, "tick", "end", rate_text(10.0**k)))
    out.append(_TEXT % (left + plot_w / 2, height - 6, "axis", "middle", "arithmetic intensity (FLOP per byte)"))
    out.append(_Y_TITLE % (top + plot_h / 2, top + plot_h / 2, "achieved FLOP/s"))
    if roofs:
        x_start = 10.0**x0
        y_start = max(peak_bytes_per_s * x_start, 10.0**y0)
        x_start = y_start / peak_bytes_per_s
        path = (f"M{px(x_start):.1f},{py(y_start):.1f} L{px(ridge):.1f},{py(peak_flops_per_s):.1f} "
                f"L{px(10.0**x1):.1f},{py(peak_flops_per_s):.1f}")
        out.append(_PATH % (path, "roof"))
        rx, ry = px(ridge), py(peak_flops_per_s)
        out.append(_LINE % (rx, ry, rx, top + plot_h, "ridgeline"))
        out.append(_RIDGE % (rx, ry, f"ridge point: {intensity_text(ridge)}"))
        out.append(_TEXT % (rx - 8, ry - 8, "note", "end", f"ridge {intensity_text(ridge)}"))
        out.append(_TEXT % (width - right - 4, ry - 6, "note", "end",
                                f"compute roof {rate_text(peak_flops_per_s)}"))
        out.append(_TEXT % (max(left + 8, rx - 8), top + plot_h - 8, "region", "end", "← memory-bound"))
        out.append(_TEXT % (min(width - right - 8, rx + 8), top + plot_h - 8, "region", "start", "compute-bound →"))
    categories: dict[str, str] = {}
    ordered = sorted(points, key=lambda p: -p["time_share"])  # small points drawn last stay visible
    placed: list[tuple[float, float, float, float]] = []  # label boxes already drawn: the roof's own first
    if roofs:
        rx, ry = px(ridge), py(peak_flops_per_s)
        ridge_w = _text_width(f"ridge {intensity_text(ridge)}", 12.0)
        roof_w = _text_width(f"compute roof {rate_text(peak_flops_per_s)}", 12.0)
        placed += [(rx - 8 - ridge_w, ry - 20, rx - 8, ry - 4), (width - right - 4 - roof_w, ry - 18, width - right, ry - 2)]
    circles = []
    for p in ordered:
        color = categories.setdefault(p["category"], category_color(p["category"], len(categories)))
        radius = 4 + 18 * math.sqrt(max(min(p["time_share"], 1.0), 0.0))
        cx, cy = px(p["intensity"]), py(p["flops_per_s"])
        out.append(_CIRCLE % (cx, cy, radius, color, p["tip"]))
        circles.append((p, cx, cy, radius))
    # Names after every point, and only where they cover no other point or name (the tooltips have them all).
    for i, (p, cx, cy, radius) in enumerate(circles[:6]):
        text = _label(p["label"], 28)
        w = _text_width(text, 12.0)
        others = [(x2 - r2, y2 - r2, x2 + r2, y2 + r2) for j, (_, x2, y2, r2) in enumerate(circles) if j != i]
        # Right of the point, left of it, under it: the first place that covers nothing.
        for anchor, x, y in (("start", cx + radius + 4, cy + 4), ("end", cx - radius - 4, cy + 4),
                             ("middle", cx, cy + radius + 14)):
            x0 = {"start": x, "end": x - w, "middle": x - w / 2}[anchor]
            box = (x0, y - 14, x0 + w, y + 2)
            inside = left <= box[0] and box[2] <= width - right and box[3] <= top + plot_h
            if inside and not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3]
                                  for b in placed + others):
                placed.append(box)
                out.append(_TEXT % (x, y, "ptlabel", anchor, text))
                break
    svg = _SVG % ("chart roofline", height, "roofline chart", Markup("").join(out))
    return svg, [(c, color, "") for c, color in categories.items()]


# ------------------------------------------------------------------------------------- hosts, aligned

_HOST_ROW = Markup('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" class="%s"><title>%s</title></rect>')


ALIGNED_ROWS = 16
"""Participants drawn on the aligned step at most: beyond it the first and the last to arrive, half each."""


def _aligned_rows(rows: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """All the participants where they fit; else, in the order they arrive at the collective, the first and the last
    ALIGNED_ROWS / 2 (the last to arrive, the straggler, is always among them)."""
    if len(rows) <= ALIGNED_ROWS:
        return rows
    arrival = sorted(rows, key=lambda p: _num(p.get("collective_start_ms")) if p.get("collective_start_ms") is not None
                     else math.inf)
    return arrival[:ALIGNED_ROWS // 2] + arrival[-(ALIGNED_ROWS // 2):]


def host_timeline(timeline: Mapping[str, Any], duration_text=format_duration) -> Markup:
    """One step on every participant on one time axis: the step window, what ran in it (where the tool gives
    segments), and the collective from each participant's arrival to the common end. The participant that
    arrives last is outlined and named."""
    rows = _aligned_rows([p for p in timeline.get("participants") or [] if isinstance(p, Mapping)])
    starts = [_num(p.get(k)) for p in rows for k in ("step_start_ms", "collective_start_ms") if p.get(k) is not None]
    ends = [_num(p.get(k)) for p in rows for k in ("step_end_ms", "collective_end_ms") if p.get(k) is not None]
    if not rows or not starts or not ends:
        return Markup("")
    t0, t1 = min(starts), max(ends)
    span = (t1 - t0) or 1.0
    left, right, row_h, top = 190.0, 20.0, 30.0, 8.0
    width = 1000.0
    plot_w = width - left - right
    height = top + row_h * len(rows) + 26

    def px(t: float) -> float:
        return left + plot_w * (t - t0) / span

    last = max(rows, key=lambda p: _num(p.get("collective_start_ms")) if p.get("collective_start_ms") is not None else -math.inf)
    out = []
    for i, p in enumerate(rows):
        name = str(p.get("participant") or p.get("host") or f"#{i}")
        y = top + i * row_h
        out.append(_TEXT % (left - 8, y + 19, "lbl", "end", _label(name, 24)))
        if p.get("step_start_ms") is not None and p.get("step_end_ms") is not None:
            s, e = _num(p["step_start_ms"]), _num(p["step_end_ms"])
            out.append(_HOST_ROW % (px(s), y + 6, max(px(e) - px(s), 1.0), row_h - 12, "stepwin",
                                        f"{name}: step {duration_text(e - s)}"))
        for seg in p.get("segments") or []:
            if not isinstance(seg, Mapping) or seg.get("start_ms") is None or seg.get("end_ms") is None:
                continue
            s, e = _num(seg["start_ms"]), _num(seg["end_ms"])
            category = str(seg.get("category") or "other")
            out.append(_RECT_TIP % (px(s), y + 6, max(px(e) - px(s), 1.0), row_h - 12, color_for(category, 0),
                                        f"{name}: {category} {duration_text(e - s)}"))
        if p.get("collective_start_ms") is not None and p.get("collective_end_ms") is not None:
            s, e = _num(p["collective_start_ms"]), _num(p["collective_end_ms"])
            cls = "coll last" if p is last else "coll"
            out.append(_HOST_ROW % (px(s), y + 3, max(px(e) - px(s), 1.0), row_h - 6, cls,
                                        f"{name}: in {timeline.get('collective') or 'the collective'} for "
                                        f"{duration_text(e - s)}" + (" (arrives last)" if p is last else "")))
            if p is last:
                out.append(_TEXT % (px(s) - 4, y + 19, "note", "end", "arrives last"))
    end = max(_num(p.get("collective_end_ms")) for p in rows if p.get("collective_end_ms") is not None) \
        if any(p.get("collective_end_ms") is not None for p in rows) else None
    base = top + row_h * len(rows)
    if end is not None:
        out.append(_LINE % (px(end), top, px(end), base, "ridgeline"))
    out.append(_LINE % (left, base, width - right, base, "axisline"))
    if end is not None:  # times read back from the collective's end, which every participant leaves together
        out.append(_TEXT % (left, base + 16, "tick", "start", f"{duration_text(end - t0)} before"))
        out.append(_TEXT % (px(end), base + 16, "tick", "end", "the collective ends"))
    else:
        out.append(_TEXT % (left, base + 16, "tick", "start", "0"))
        out.append(_TEXT % (width - right, base + 16, "tick", "end", duration_text(span)))
    return _SVG % ("chart", height, "one step per host", Markup("").join(out))
