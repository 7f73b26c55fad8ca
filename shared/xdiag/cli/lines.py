"""`xdiag lines`' text: the line view (get_line_view's answer) as a person reads it in a terminal, as pprof's
`top` and `list` print theirs: the lines by device time with the code under each, then the functions by their
total (callees included), then the host time the Python tracer recorded."""

from __future__ import annotations

from typing import Any

from xdiag.analysis.source_code import UNREADABLE
from xdiag.profile.confined import shown


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f}" if value >= 10 else f"{value:.3g}" if value >= 0.001 else "0"


def _rate(row: dict[str, Any]) -> str:
    """`185 TFLOP/s 94% of 16-bit roof · 222 GB/s 27%` from a line's rates; "" where none is costed."""
    tflops, text = row.get("achieved_tflops_per_s"), ""
    if tflops:  # a line of data movement does no arithmetic: its bandwidth is its rate
        text = f"{tflops:,.1f} TFLOP/s" if tflops >= 1 else f"{tflops * 1e3:,.0f} GFLOP/s"
        if row.get("flops_percent_of_roof") is not None:
            roof = f"the {'/'.join(row['precisions'])} roofs of its ops" if row.get("precisions") else \
                f"{row.get('precision', '')} roof"
            text += f" ({row['flops_percent_of_roof']:g}% of {roof})"
    if row.get("achieved_gb_per_s") is not None:
        text += f"{', ' if text else ''}{row['achieved_gb_per_s']:,.0f} GB/s"
        if row.get("hbm_percent_of_roof") is not None:
            text += f" ({row['hbm_percent_of_roof']:g}% of HBM)"
    if row.get("fed_by_async_copies_percent"):
        text += (f"{', ' if text else ''}{row['fed_by_async_copies_percent']:g}% fed by (or waiting for) async copies at "
                 f"{row['program_hbm_gb_per_s']:,.0f} GB/s ({row['program_hbm_efficiency_percent']:g}% of HBM)")
    if row.get("data_on_chip"):
        text += f"{', ' if text else ''}its data on chip (no HBM traffic)"
    if row.get("rates_are_upper_bounds"):
        text = "at most " + text
    if row.get("bound"):
        text += f"; {row['bound']}-bound"
    if row.get("measured_percent") is not None and row["measured_percent"] < 99.5:
        text += f" (over {row['measured_percent']:.2g}% of its time)"
    return text


def _line_block(row: dict[str, Any], code: bool) -> list[str]:
    name = row["line"] + (f"  {row['function']}" if row.get("function") else "")
    if row.get("library"):
        name += "  (library: no user frame)"
    out = [f"{_ms(row.get('self_ms')):>9} {row.get('self_percent', 0):6.2f}% {_ms(row.get('total_ms')):>9} "
           f"{row.get('total_percent', 0):6.2f}% {_ms(row.get('host_ms')) if row.get('host_ms') else '':>8}  {name}"]
    details = []
    if row.get("kinds"):
        details.append(", ".join(row["kinds"]))
    rate = _rate(row)
    if rate:
        details.append(rate)
    if row.get("modules"):
        details.append("in " + ", ".join(f"{m['module']} {_ms(m['ms'])} ms" for m in row["modules"]))
    if row.get("host_kinds"):
        details.append("host: " + ", ".join(f"{k} {_ms(v)} ms" for k, v in row["host_kinds"].items()))
    pad = " " * 46
    if details:
        out.append(pad + "; ".join(details))
    if code and row.get("code"):
        out.append(pad + f"| {row['code']}")
    elif code and row.get("code_not_available") and UNREADABLE not in row["code_not_available"]:
        out.append(pad + f"(code: {row['code_not_available']})")  # unreadable files are said once, at the end
    if row.get("callees"):
        out.append(pad + "calls " + ", ".join(f"{c['line']} {_ms(c['ms'])} ms" for c in row["callees"][:3])
                   + (f" and {len(row['callees']) - 3} more" if len(row["callees"]) > 3 else ""))
    return out


HEADER = f"{'self ms':>9} {'self':>7} {'total ms':>9} {'total':>7} {'host ms':>8}  line"


def render_lines(result: dict[str, Any], path: str) -> str:
    """The text of `xdiag lines` from a get_line_view result (ok or not). The names and the code are the profile's
    and its files': a control character in them (a terminal's escape, a newline) is shown as its escape, never
    sent to the terminal."""
    if result.get("status") != "ok":
        return shown(f"{path}: line view {result.get('status', 'not available')}: "
                     f"{result.get('reason') or 'no reason'}") + "\n"
    summary, detail = result["summary"], result["detail"]
    out = [f"{path}: {_ms(summary['op_time_ms'])} ms of op time over {summary['lines']} lines "
           f"(self times sum to {_ms(summary['self_sum_ms'])} ms)"]
    if summary.get("source_lines_not_available"):
        out.append(f"source lines: not available: {summary['source_lines_not_available']}")
    if summary.get("unattributed_percent"):
        out.append(f"{summary['unattributed_percent']:g}% of op time is in ops no stack names: (no source line)")
    order = (result.get("args") or {}).get("order", "self")
    out += ["", f"Lines by {'host time' if order == 'host' else 'device time'}{' (total)' if order == 'total' else ''} "
                "(self: ops whose innermost frame of your code is the line; total: with its callees)", HEADER]
    for row in detail.get("lines", []):
        out += _line_block(row, code=True)
    functions = [f for f in detail.get("functions", []) if f.get("total_ms") or f.get("host_ms")]
    if functions:
        by_host = (result.get("args") or {}).get("order") == "host"
        out += ["", "Functions by host time" if by_host else "Functions by device time (total: callees included)",
                HEADER.replace("line", "function")]
        for row in functions:
            out += _line_block(row, code=False)[:1]
    unreadable = sorted({row["code_not_available"].split(f" {UNREADABLE}")[0] for row in detail.get("lines", [])
                         if UNREADABLE in row.get("code_not_available", "")})
    if unreadable:
        where = f" under --source-root {summary['source_root']}" if summary.get("source_root") else \
            ": name the checkout that holds them with --source-root DIR"
        out += ["", f"Code not shown for {len(unreadable)} file{'s' if len(unreadable) > 1 else ''} not readable here "
                    f"({', '.join(unreadable[:3])}{' …' if len(unreadable) > 3 else ''}){where}"]
    if summary.get("host_traced"):
        out += ["", f"Host time in your frames (Python tracer): {_ms(summary.get('host_ms'))} ms; each line's host ms "
                    "is the time its frame ran with no deeper frame of your code (a frame is named by the line its "
                    "function begins on)"]
    else:
        out += ["", "Host time: the profile holds no Python tracer frames (the Python tracer was off)"]
    return "\n".join(shown(line) for line in out) + "\n"  # each entry one line of its own
