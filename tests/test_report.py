"""summary.html rendering: status, findings in priority order, traceable evidence, honest gaps,
escaping of profile text, and a page that needs nothing from the network.

The Analysis and ToolResult values are typed in here: these tests pin down the rendering,
not the analysis of any profile.
"""

from __future__ import annotations

import re
from html import escape as html_escape
from html.parser import HTMLParser

import pytest
from xdiag.model import Analysis, Diagnosis, Evidence, Finding, FollowUpCall, Status, ToolResult, ToolStatus
from xdiag.report import render_summary_html
from xdiag.report.format import Cell, format_number, humanize_key, key_values, table
from xdiag.report.viewer_links import viewer_url

XSS = "<script>alert(1)</script>"
CPU_ROOFLINE_REASON = "a CPU profile records no peak FLOP/s or memory bandwidth, so there is no roof"
MEMORY_REASON = "CPU profiles have no device memory; and the host threads recorded no allocator events"


def _ok(tool: str, summary: dict, detail: dict | None = None, source: str = "xdiag host-plane analysis") -> ToolResult:
    return ToolResult(tool=tool, status=ToolStatus.OK, summary=summary, detail=detail or {}, source=source,
                      duration_ms=12.5)


def _results(top_op: str = "dot.3") -> dict[str, ToolResult]:
    steps = [
        {"host": "vm", "step": i, "step_ms": 10.0 + i, "compute": 8.0 + i, "collective": 0.0, "compile": 0.0,
         "host_sync": 0.5, "dispatch": 0.5, "host_other": 1.0, "ops": 8}
        for i in range(120)
    ]
    ops = [
        {"op": top_op, "module": "jit_train_step", "category": "matmul", "count": 15, "total_ms": 605.8348,
         "avg_us": 40388.984, "share_of_op_time_percent": 61.2, "shape": "f32[8,64,512,16]{1,2,3,0}",
         "arithmetic_intensity_flops_per_byte": 31.5, "achieved_gib_per_s": 0.774, "achieved_gflops_per_s": 26.2},
        {"op": "custom-call.1", "module": "jit_train_step", "category": "custom_call", "count": 15, "total_ms": 100.0,
         "avg_us": 6666.7, "share_of_op_time_percent": 10.1, "shape": "f32[1024]{0}"},
        {"op": "fusion.2", "module": "jit_train_step", "category": "elementwise", "count": 15, "total_ms": 50.0,
         "avg_us": 3333.3, "share_of_op_time_percent": 5.05, "shape": "x" * 300},
    ]
    categories = ["compute", "collective", "compile", "host_sync", "dispatch", "host_other"]
    return {
        "get_step_trace": _ok(
            "get_step_trace", {"steps": 120, "step_time_ms_mean": 69.5, "compute_percent": 90.0},
            {"categories": categories, "steps": steps},
        ),
        "get_roofline_model": ToolResult(tool="get_roofline_model", status=ToolStatus.NOT_AVAILABLE,
                                         reason=CPU_ROOFLINE_REASON),
        "get_memory_profile": ToolResult(tool="get_memory_profile", status=ToolStatus.NOT_AVAILABLE,
                                         reason=MEMORY_REASON),
        "get_peak_allocations": _ok(
            "get_peak_allocations", {"module": "jit_train_step(16)", "largest_buffer_mib": 16.0},
            {"buffers": [{"value": "x.1", "shape": "f32[8,16,512,64]", "mib": 16.0}]},
        ),
        "get_hlo_op_profile": _ok(
            "get_hlo_op_profile", {"top_op": top_op, "top_op_share_percent": 61.2},
            {"ops": ops, "categories_ms": {"matmul": 605.8, "custom_call": 100.0, "elementwise": 50.0}},
        ),
        "detect_layout_mismatch_copies": _ok(
            "detect_layout_mismatch_copies", {"count": 0, "share_of_op_time_percent": 0}, {"ops": []}
        ),
        "detect_unfused_reshapes": ToolResult(tool="detect_unfused_reshapes", status=ToolStatus.FAILED,
                                              reason="KeyError: 'shape' (at detect_unfused_reshapes.py:40)"),
        "list_hlo_modules": _ok(
            "list_hlo_modules", {"modules": 1},
            {"modules": [{"module": "jit_train_step(16)", "instructions": 35, "op_time_ms": 2389.4}]},
        ),
        "get_hosts": _ok(
            "get_hosts", {"hosts": 1}, {"hosts": [{"host": "vm", "planes": ["/host:CPU"], "events": 1203}]}
        ),
    }


def _health(**overrides) -> dict:
    health = {
        "platform": "CPU", "steps": 120, "step_source": "step annotations", "step_time_ms": 69.5,
        "breakdown_percent": {"compute": 90.0, "collective": 0.0, "compile": 0.0, "host_sync": 2.0, "dispatch": 3.0,
                              "host_other": 5.0},
        "device_idle_percent": 10.0, "utilization_percent": 90.0, "achieved_gflops_per_s": 3.397,
        "roofline_efficiency_percent": None, "peak_memory_gib": None, "memory_capacity_gib": None,
        "memory_headroom_percent": None, "oom_risk": None, "top_op": "dot.3", "top_op_share_percent": 61.2,
        "top_category": "matmul", "low_intensity_op_percent": 3.0,
        "compiler": {"layout_copies_percent": 0.0, "unfused_data_movement_percent": None,
                     "widening_converts_percent": 0.0},
    }
    health.update(overrides)
    return health


def _analysis(**fields) -> Analysis:
    base = {
        "analysis_id": "a1b2c3", "run_id": "run-7", "session_id": "2026_01_12_00_26_20",
        "profile_uris": ["gs://bucket/run-7/plugins/profile/2026_01_12_00_26_20/vm.xplane.pb"],
        "output_uri": "gs://bucket/run-7/plugins/profile/2026_01_12_00_26_20/xdiag", "status": "DONE",
        "profile": {"platform": "CPU", "hosts": ["vm"], "files": ["vm.xplane.pb"], "devices": None,
                    "size_bytes": 179097, "events": 1203},
    }
    base.update(fields)
    return Analysis(**base)


def _finding(priority: str, title: str, tool: str, verified: bool = True, op: str = "dot.3") -> Finding:
    return Finding(
        priority=priority, key=title.lower().replace(" ", "_"), title=title,
        whats_happening=f"{op} takes most of the step.",
        evidence=[Evidence(tool=tool, metric=f"{op} share_of_op_time_percent", value=61.2, note="of op time"),
                  Evidence(tool="get_step_trace", metric="step_time_ms_mean", value=69.5)],
        expected_impact="up to 60% shorter steps", fix="Fuse the op.", verified=verified,
    )


def _needs_attention(op: str = "dot.3") -> Analysis:
    diagnosis = Diagnosis(
        status=Status.NEEDS_ATTENTION,
        summary="Two issues found. The biggest is the layout copy. Steps take 69.5 ms.",
        # P1 listed first on purpose: the page must put P0 first.
        findings=[_finding("P1", "Host syncs inside the step", "aggregate_xplane_events", verified=False, op=op),
                  _finding("P0", "Layout copies dominate", "detect_layout_mismatch_copies", op=op)],
        hypotheses=["Layout copies dominate (score 74.4)", "Host syncs inside the step (score 20.0)"],
        follow_up_calls=[FollowUpCall(tool="get_hlo_neighborhood", args={"op": op}, hypothesis="Layout copies dominate",
                                      status=ToolStatus.OK)],
        investigator="rules", investigator_note="rule engine; Gemini unavailable: no Vertex project configured",
    )
    return _analysis(result=Status.NEEDS_ATTENTION, diagnosis=diagnosis, health=_health(top_op=op))


class _Structure(HTMLParser):
    """Counts opened and closed tags, and records where void tags were closed wrongly."""

    VOID = frozenset({"meta", "br", "wbr", "img", "hr", "input", "link", "area", "base", "col", "embed", "source"})

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.counts: dict[str, int] = {}

    def handle_starttag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
            if tag in self.stack:
                while self.stack and self.stack.pop() != tag:
                    pass
            return
        self.stack.pop()


def _parse(html: str) -> _Structure:
    parser = _Structure()
    parser.feed(html)
    parser.close()
    return parser


def _assert_self_contained(html: str) -> None:
    # Links to the session in the XProf viewer are navigation the reader chooses, not resources: they load nothing.
    html = re.sub(rf'<a href="{re.escape(html_escape(viewer_url()))}/\?[^"]*">', "<a>", html)
    # One script, the template's own inline one (the line view's sorting and opening): none loaded, none that
    # reaches the network or runs text it builds.
    scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", html, re.IGNORECASE | re.DOTALL)
    assert len(scripts) <= 1 and len(re.findall(r"<script\b", html, re.IGNORECASE)) == len(scripts)
    assert all(re.search(r"<script>", html) for _ in scripts)  # no src, no attributes
    for script in scripts:
        assert not re.search(r"\bfetch\(|XMLHttpRequest|WebSocket|import\(|eval\(|Function\(|innerHTML|\.src\b|"
                             r"sendBeacon|location", script), script
    network_ref = re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, re.IGNORECASE)
    assert network_ref is None, "a resource from the network"
    assert "http://" not in html and "https://" not in html
    assert "@import" not in html and "url(" not in html
    assert "<link" not in html.lower() and "<img" not in html.lower()


def _assert_well_formed(html: str) -> _Structure:
    s = _parse(html)
    assert s.errors == []
    assert s.stack == []
    for tag in ("html", "head", "body", "main", "style"):
        assert s.counts.get(tag) == 1, tag
    return s


def test_the_summary_keeps_a_lever_fix_whole_and_says_first_once():
    """A lever's fix opens with "First," and its figures sit in parentheses that hold ';': the summary's "Do first"
    said "Do first: first, raise …" and cut the sentence inside the parenthesis, leaving it open."""
    from xdiag.report.summary import summary_sentences

    top = _finding("P0", "Copies of arguments", "get_program_anatomy").model_copy(update={
        "whats_happening": "12 copies (k_cache_0_ and 11 more; each bf16[8,16]) take 47% of op time. More.",
        "fix": "First, raise pages_per_compute_block to 32 (16 → 64 realized 32%; it must divide the pages). Then."})
    sentences = summary_sentences(_needs_attention(), "NEEDS_ATTENTION", [top])
    do_first = next(s for s in sentences if s.startswith("Do first:"))
    assert do_first == ("Do first: raise pages_per_compute_block to 32 (16 → 64 realized 32%; it must divide the "
                        "pages)."), do_first
    biggest = next(s for s in sentences if s.startswith("The biggest cost"))
    assert biggest.count("(") == biggest.count(")") and "take 47% of op time." in biggest, biggest


def test_needs_attention_page_shows_status_and_findings_p0_first():
    html = render_summary_html(_needs_attention(), _results())

    assert "NEEDS_ATTENTION" in html
    summary = html[html.index('id="summary"'):html.index('id="metrics"')]
    assert "Needs attention: 2 findings (1 P0, 1 P1)" in summary
    assert "The biggest cost (P0): layout copies dominate — dot.3 takes most" in summary
    assert "Do first: fuse the op." in summary
    assert "(s)" not in html  # counts are plural-aware, never "finding(s)"
    p0, p1 = html.index("Layout copies dominate</span>"), html.index("Host syncs inside the step</span>")
    assert p0 < p1
    for label in ("What's happening", "Evidence", "Expected impact", "Fix"):
        assert label in html
    _assert_self_contained(html)
    _assert_well_formed(html)


def test_evidence_names_the_tool_of_every_number():
    html = render_summary_html(_needs_attention(), _results())
    evidence = re.findall(r'<table class="data evidence">(.*?)</table>', html, re.DOTALL)
    assert len(evidence) == 2
    assert "detect_layout_mismatch_copies" in evidence[0] and "aggregate_xplane_events" in evidence[1]
    assert all("get_step_trace" in e and "61.2" in e for e in evidence)


def test_unverified_finding_gets_a_badge():
    html = render_summary_html(_needs_attention(), _results())
    finding_p1 = html[html.index("Host syncs inside the step") - 400: html.index("Host syncs inside the step")]
    assert "unverified" in finding_p1
    finding_p0 = html[html.index("Layout copies dominate</span>") - 400: html.index("Layout copies dominate</span>")]
    assert "unverified" not in finding_p0


def test_investigator_and_follow_ups_are_shown():
    html = render_summary_html(_needs_attention(), _results())
    assert "rule engine; Gemini unavailable: no Vertex project configured" in html
    follow_up = html[html.index('id="follow-up"'):html.index('id="tools"')]
    assert "Host syncs inside the step (score 20.0)" in follow_up
    assert "get_hlo_neighborhood" in follow_up and "op: dot.3" in follow_up


def test_missing_metric_says_not_available_with_the_tools_reason():
    html = render_summary_html(_needs_attention(), _results())
    metrics = html[html.index('id="metrics"'):html.index('id="findings"')]
    roofline_card = metrics[metrics.index("Roofline efficiency"):][:800]
    assert "not available" in roofline_card
    assert CPU_ROOFLINE_REASON in roofline_card
    memory_card = metrics[metrics.index("Peak memory"):][:800]
    assert "not available" in memory_card and "CPU profiles have no device memory" in memory_card
    failed_card = metrics[metrics.index("Unfused data movement"):][:800]
    assert "failed" in failed_card and "KeyError" in failed_card
    # Never a made-up number where the snapshot has None.
    assert not re.search(r"Roofline efficiency</div>\s*<div class=\"value[^>]*>\d", metrics)


def test_unavailable_tool_sections_say_why_in_one_line():
    html = render_summary_html(_needs_attention(), _results())
    roofline = html[html.index('id="roofline"'):html.index('id="hlo-op-profile"')]
    assert f"not available: {CPU_ROOFLINE_REASON}" in roofline
    assert "No roofs: the device&#39;s peaks are unknown" in roofline and "<svg" in roofline  # intensity, no roofs
    assert "<table" not in roofline  # the op table is in the op-profile section only
    compiler = html[html.index('id="compiler-checks"'):html.index('id="memory"')]
    assert "failed: KeyError" in compiler
    assert "none found" in compiler
    kernels = html[html.index('id="kernel-stats"'):html.index('id="custom-kernels"')]
    assert "not run: get_kernel_stats was not called" in kernels


def test_detail_sections_render_tables_and_charts():
    html = render_summary_html(_needs_attention(), _results())
    steps = html[html.index('id="step-time"'):html.index('id="roofline"')]
    assert steps.count("<svg") == 1
    assert steps.count("<g><title>step ") == 100  # capped at 100 columns of 120 steps
    assert "first 100 of 120 steps" in steps
    assert "all 120 rows</summary>" in steps  # the first rows shown, the rest folded
    ops = html[html.index('id="hlo-op-profile"'):html.index('id="kernel-stats"')]
    assert "<svg" in ops and ">intensity</th>" in ops and ">bandwidth</th>" in ops
    assert ops.count('<tr class="group">') == 3  # each category heads its ops
    assert "606 ms" in ops and "40.4 ms" in ops and "31.5 FLOP/B" in ops  # each number in its unit
    tools = html[html.index('id="tools"'):]
    for name in _results():
        assert name in tools


def test_long_values_are_cut_with_the_full_text_in_a_title():
    html = render_summary_html(_needs_attention(), _results())
    assert f'title="{"x" * 300}"' in html
    assert "x" * 301 not in html


def test_profile_text_is_escaped_everywhere():
    results = _results(top_op=XSS)
    results["get_hlo_op_profile"].detail["categories_ms"][XSS] = 1.0  # reaches an SVG label and its <title>
    analysis = _needs_attention(op=XSS)
    analysis.health["breakdown_percent"][XSS] = 1.0  # reaches the breakdown bar and its legend
    analysis.diagnosis.investigator_note = XSS
    html = render_summary_html(analysis, results)
    assert XSS not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    _assert_self_contained(html)
    _assert_well_formed(html)


def test_optimal_page():
    diagnosis = Diagnosis(status=Status.OPTIMAL, summary="The workload is healthy: devices compute 95% of the time.",
                          investigator="rules")
    html = render_summary_html(_analysis(result=Status.OPTIMAL, diagnosis=diagnosis,
                                         health=_health(breakdown_percent={"compute": 95.0, "host_other": 5.0})),
                               _results())
    assert 'class="banner OPTIMAL"' in html
    assert "Optimal: no bottleneck needs attention in this CPU profile." in html
    assert "It covers 120 steps of 69.5 ms on average; the devices compute 95% of that time." in html
    assert "No findings: the workload passed the health check." in html
    assert "banner NEEDS_ATTENTION" not in html
    _assert_self_contained(html)
    _assert_well_formed(html)


def test_failed_analysis_without_diagnosis_health_or_results_still_renders():
    analysis = _analysis(status="FAILED", result=Status.FAILED, profile={},
                         failure_reason="vm.xplane.pb: truncated: field 'planes' declares 28501368332271 bytes")
    html = render_summary_html(analysis, {})
    assert 'class="banner FAILED"' in html
    assert "truncated: field &#39;planes&#39; declares 28501368332271 bytes" in html
    assert "The raw profile was kept at" in html
    assert "gs://bucket/run-7/plugins/profile/2026_01_12_00_26_20/vm.xplane.pb" in html
    assert "No tool ran" in html
    _assert_self_contained(html)
    _assert_well_formed(html)


def test_failed_status_alone_marks_the_page_failed():
    html = render_summary_html(_analysis(status="FAILED", failure_reason="profile object missing"), None)
    assert 'class="banner FAILED"' in html and "profile object missing" in html


@pytest.mark.parametrize(
    ("value", "text"),
    [(1234567, "1,234,567"), (0.000012345, "1.23e-05"), (3.14159, "3.14"), (105.3891, "105"),
     (12345.678, "12,346"), (0.0, "0"), (True, "yes"), (-0.5, "-0.5")],
)
def test_numbers_are_formatted_for_reading(value, text):
    assert format_number(value) == text


def test_tables_take_any_flat_dicts_and_stay_bounded():
    rows = [{"op": f"op{i}", "total_ms": i * 1.5, "new_field_added_later": i} for i in range(45)]
    t = table(rows, preferred=("total_ms",))
    assert [c.key for c in t.columns] == ["total_ms", "op", "new_field_added_later"]
    assert len(t.rows) == 30 and t.total == 45 and t.truncated
    assert table([{"program_id": 4642, "events": 4642}]).rows[0][0].text == "4642"
    assert table([{"program_id": 4642, "events": 4642}]).rows[0][1].text == "4,642"
    assert humanize_key("achieved_gib_per_s") == "achieved GiB/s"
    assert humanize_key("share_of_op_time_percent") == "share of op time %"


# ------------------------------------------------------------------ numbers checked, charts, new sections

from xdiag.report.format import Limits, format_measure, humanize_numbers, measured_cell  # noqa: E402

TPU_PEAKS = {"platform": "TPU", "device_type": "TPU v6 Lite", "peak_teraflops_per_second": 918.0,
             "peak_hbm_bw_gigabytes_per_second": 1637.99}


def test_a_column_named_by_its_unit_is_headed_by_what_it_measures():
    # A buffer of 5,120 MiB reads "5 GiB": a column headed "MiB" would hold GiB.
    t = table([{"value": "copy-done", "mib": 5120.0}, {"value": "param", "mib": 0.5}])
    assert [c.label for c in t.columns] == ["value", "size"]
    assert [r[1].text for r in t.rows] == ["5 GiB", "512 KiB"]


def test_a_name_and_its_measure_read_apart():
    rows = key_values({"largest_buffer": "copy-done", "largest_buffer_mib": 5120.0, "top_buffer_mib": 128.0})
    assert [r.label for r in rows] == ["largest buffer", "largest buffer size", "top buffer"]


def test_long_names_wrap_at_their_separators_never_inside_a_word():
    assert Cell(text="tensorflow::functor::FillKernel").segments == ["tensorflow::", "functor::", "FillKernel"]
    assert Cell(text="top kernel void tensorflow::functor::FillPhiloxRandomKernelLaunch").segments == [
        "top kernel void tensorflow::", "functor::", "FillPhiloxRandomKernelLaunch"]
    assert Cell(text="library GEMM (cuBLAS/hipBLASLt)").segments == ["library GEMM (cuBLAS/hipBLASLt)"]


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [("avg_us", 219894.575, "220 ms"), ("step_time_ms_mean", 1310.2, "1.31 s"), ("total_ms", 0.0007, "700 ns"),
     ("peak_hbm_bw_gibs", 2479.55, "2.66 TB/s"), ("peak_flop_rate_gflops", 918000.0, "918 TFLOP/s"),
     ("peak_hbm_bytes", 21492671104, "20 GiB"), ("share_percent", 27.91, "27.9%"),
     ("operational_intensity_flop_per_byte", 34.2961, "34.3 FLOP/B"), ("memory_bandwidth", 898048000000, "898 GB/s"),
     ("clock_rate", 1530000, "1.53 GHz"), ("flops_per_run", 1342177280.0, "1.34 GFLOP"), ("program_id", 4642, "4642")],
)
def test_every_number_is_shown_in_a_human_unit(key, value, text):
    assert measured_cell(key, value).text == text


def test_values_outside_physical_range_are_flagged_not_shown():
    efficiency = measured_cell("roofline_efficiency_percent", 54626898.28)
    assert efficiency.text == "out of range" and efficiency.flagged and "54,626,898%" in efficiency.full
    rate = measured_cell("achieved_gib_per_s", 3068793135.7, Limits(peak_bytes_per_s=1.64e12))
    assert rate.text == "out of range" and "above the device's peak bandwidth" in rate.full
    assert measured_cell("achieved_gib_per_s", 1223.8, Limits(peak_bytes_per_s=1.64e12)).text == "1.31 TB/s"
    assert measured_cell("step_time_spread_percent", 140.0).text == "140%"  # not a share: may pass 100


def test_numbers_in_prose_are_brought_to_human_precision():
    assert humanize_numbers("10462.4908 ms in total, mean 528714.873 µs") == "10.5 s in total, mean 529 ms"
    assert humanize_numbers("1.31e+03 ms → about 1.3e+03 ms") == "1.31 s → about 1.3 s"
    assert humanize_numbers("shape f32[5,1024]{1,0} at x.py:2479") == "shape f32[5,1024]{1,0} at x.py:2479"
    assert format_measure(96.55, "%") == "96.5%"


def _device_results(**extra) -> dict[str, ToolResult]:
    results = _results()
    results["get_device_information"] = _ok("get_device_information", dict(TPU_PEAKS))
    ops = results["get_hlo_op_profile"].detail["ops"]
    ops.append({"op": "copy-start.3", "module": "jit_f", "category": "async_copy", "count": 400, "total_ms": 0.0007,
                "avg_us": 0.002, "share_of_op_time_percent": 0.0, "arithmetic_intensity_flops_per_byte": 0.0,
                "achieved_gflops_per_s": 0.0, "achieved_gib_per_s": 3068793135.724,
                "source": "&lt;embedded module &#39;_launcher&#39;&gt;:153"})
    results["get_roofline_model"] = _ok("get_roofline_model", {
        "roofline_efficiency_percent": 4.35, "bound_by": "HBM", "peak_flop_rate_gflops": 918000.0,
        "peak_hbm_bw_gibs": 1525.5, "worst_op_efficiency_percent": 192447054.51})
    results.update(extra)
    return results


def test_roofline_chart_has_both_roofs_the_ridge_and_the_ops():
    html = render_summary_html(_needs_attention(), _device_results())
    roofline = html[html.index('id="roofline"'):html.index('id="hlo-op-profile"')]
    assert 'class="roof"' in roofline and 'class="ridge"' in roofline and "ridge 560" in roofline
    assert roofline.count('class="pt"') == 1  # dot.3; the copy with 0 FLOPs is listed, not plotted
    assert "compute 918 TFLOP/s, memory bandwidth 1.64 TB/s, ridge point 560 FLOP/B" in roofline
    assert "192,447,054" not in roofline.split("title=")[0] and "out of range" in roofline


def test_source_lines_escaped_by_the_converter_are_escaped_once():
    html = render_summary_html(_needs_attention(), _device_results())
    assert "&lt;embedded module &#39;_launcher&#39;&gt;:153" in html
    assert "&amp;lt;" not in html and "&amp;#39;" not in html


def test_kernel_statistics_show_launch_facts_and_the_op():
    kernels = _ok("get_kernel_stats", {"kernels": 1, "launches": 194, "total_kernel_ms": 7.9,
                                       "tensor_core_time_percent": 0.0},
                  {"kernels": [{"kernel": "void ns::Fill<Eigen::half, 3>(unsigned long long const*, long long)",
                                "op": "dropout/RandomUniform", "launches": 194, "total_ms": 7.9083, "mean_us": 40.764,
                                "share_percent": 26.64, "registers_per_thread": 38, "shared_memory_bytes": 0,
                                "occupancy_percent": 50.0, "tensor_core": False}]}, source="GPU device planes")
    html = render_summary_html(_needs_attention(), _device_results(get_kernel_stats=kernels))
    section = html[html.index('id="kernel-stats"'):html.index('id="custom-kernels"')]
    for text in ("ns::Fill&lt;half, 3&gt;", "RandomUniform", ">38<", "50%", "7.91 ms", "40.8 µs", ">no<"):
        assert text in section, text


def test_custom_kernels_and_the_reason_low_level_data_is_absent():
    custom = _ok("get_custom_kernels", {"custom_kernels": 1, "total_ms": 3.2189, "share_of_op_time_percent": 92.62},
                 {"kernels": [{"op": "custom-call.1", "kind": "library GEMM (cuBLAS/hipBLASLt)", "count": 15,
                               "total_ms": 3.2189, "share_of_op_time_percent": 92.62, "flops_per_run": None,
                               "flops_unknown_because": "custom calls run code whose FLOPs the HLO does not say"}],
                  "low_level": {"available": False, "reason": "LLO traces exist only in TPU captures"}})
    html = render_summary_html(_needs_attention(), _device_results(get_custom_kernels=custom))
    section = html[html.index('id="custom-kernels"'):html.index('id="compiler-checks"')]
    assert "custom-call.1" in section and "library GEMM (cuBLAS/hipBLASLt)" in section and "92.6%" in section
    assert "FLOPs unknown for custom-call.1" in section
    assert "LLO and counter data: not available: LLO traces exist only in TPU captures" in section


def test_hosts_side_by_side_with_the_straggler_aligned():
    hosts = _ok("get_hosts", {"hosts": 2, "straggler_host": "hostB"}, {
        "hosts": [{"host": "hostA", "steps": 15, "step_time_ms_mean": 104.2, "compute_percent": 99.5,
                   "breakdown_percent": {"compute": 60.0, "collective": 38.0, "host_other": 2.0}},
                  {"host": "hostB", "steps": 15, "step_time_ms_mean": 104.4, "compute_percent": 57.0,
                   "breakdown_percent": {"compute": 57.0, "host_other": 41.0, "collective": 2.0}}],
        "straggler_timeline": {"step": 7, "collective": "all-reduce.3", "participants": [
            {"participant": "hostA", "step_start_ms": 0.0, "step_end_ms": 104.0, "collective_start_ms": 61.0,
             "collective_end_ms": 103.0},
            {"participant": "hostB", "step_start_ms": 0.5, "step_end_ms": 104.2, "collective_start_ms": 101.0,
             "collective_end_ms": 103.0}]}})
    html = render_summary_html(_needs_attention(), _device_results(get_hosts=hosts))
    section = html[html.index('id="hosts"'):html.index('id="step-time"')]
    assert section.count('<div class="rowbar">') == 2  # one breakdown bar per host
    assert "aligned on the end of all-reduce.3 (step 7): hostB arrives last" in section
    assert section.count('class="coll last"') == 1 and "arrives last" in section


def test_compiled_templates_are_cached_by_source_and_a_broken_cache_never_fails_a_render(tmp_path, monkeypatch):
    """summary.html's template is compiled once and loaded after (Jinja's cache, keyed by the template's source):
    the page must be the same either way, and a cache that cannot be written or holds garbage costs a compile,
    never the report."""
    from xdiag.report import render

    analysis, results = _needs_attention(), _results()

    def page_with(cache) -> str:
        monkeypatch.setattr(render, "bytecode_cache", lambda: cache)
        render._environment.cache_clear()
        try:
            return render_summary_html(analysis, results)
        finally:
            render._environment.cache_clear()

    uncached = page_with(None)
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    cache = render._BestEffortBytecodeCache(str(folder))
    assert page_with(cache) == uncached and len(list(folder.iterdir())) == 1  # compiled, then stored
    assert page_with(cache) == uncached  # loaded
    for stored in folder.iterdir():
        stored.write_bytes(b"not a compiled template")
    assert page_with(cache) == uncached
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    assert page_with(render._BestEffortBytecodeCache(str(not_a_folder))) == uncached  # neither read nor written
