"""The `peak_allocations` view. HLO modules by peak HBM and their largest buffers (memory_viewer, via get_peak_allocations).

Built once per session by XprofViews (views.py), which memoises it.
"""

from __future__ import annotations

from xdiag.analysis.xprof.common import DEFAULT_TOP_N, ViewSource, as_number, rounded, xprof_api
from xdiag.errors import NotAvailable


def _resolve_module(modules: list[dict], wanted: str) -> dict:
    """A module by full name (`jit_f(123)`), unique base name (`jit_f`) or unique prefix."""
    names = [str(m.get("module_name")) for m in modules]
    for matcher in (
        lambda name: name == wanted,
        lambda name: name.split("(")[0] == wanted,
        lambda name: name.startswith(wanted),
    ):
        matches = [m for m, name in zip(modules, names) if matcher(name)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise NotAvailable(
                f"HLO module {wanted!r} is ambiguous: {', '.join(str(m.get('module_name')) for m in matches[:10])}"
            )
    raise NotAvailable(f"no HLO module {wanted!r} in this profile; modules: {', '.join(names[:10])}")


def every_module(views: ViewSource) -> dict:
    """XProf's peak-allocation table of every HLO module (one memory_viewer conversion per module), memoised by
    `views`: needs no op_stats, so XprofViews also computes it while the views wait for a worker's conversion."""
    views.extract_hlo_protos()
    try:
        return views.tool("get_peak_allocations", xprof_api().peak_allocations, limit=0)
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        raise NotAvailable(
            "the profile has no XLA HLO modules with a buffer assignment, so XProf's memory_viewer "
            f"has nothing to show ({error})"
        ) from error


def build(views: ViewSource, module: str | None) -> dict:
    data = every_module(views)
    modules = data.get("modules", [])
    if not modules:
        raise NotAvailable("XProf's memory_viewer returned no HLO module buffers for this profile")
    if module is not None:
        modules = [_resolve_module(modules, module)]
    rows = [
        {
            "module": m.get("module_name"),
            "total_hbm_mib": rounded(as_number(m.get("total_hbm_mib")), 3),
            "buffer_count": len(m.get("top_buffers", [])),
            "top_buffers": [
                {"instruction": b.get("instruction"), "size_mib": rounded(as_number(b.get("size_mib")), 3)}
                for b in m.get("top_buffers", [])[:DEFAULT_TOP_N]
            ],
        }
        for m in modules[:DEFAULT_TOP_N]
    ]
    first = rows[0]
    top_buffer = first["top_buffers"][0] if first["top_buffers"] else {}
    hbm_gib = rounded((first["total_hbm_mib"] or 0) / 1024, 3)
    if module is None:
        result = {
            "module_count": len(modules),
            "peak_module": first["module"],
            "peak_module_hbm_gib": hbm_gib,
        }
    else:
        result = {"module": first["module"], "module_hbm_gib": hbm_gib, "buffer_count": first["buffer_count"]}
    result["top_buffer"] = top_buffer.get("instruction")
    result["top_buffer_mib"] = top_buffer.get("size_mib")
    result["detail"] = {
        "modules": rows,
        "note": (
            "buffers under 1 MiB are summed into 'Others'; same-size buffers of one base name are summed "
            "into 'name.*'"
        ),
    }
    return result
