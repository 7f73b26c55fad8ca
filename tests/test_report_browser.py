"""summary.html in a real browser: headless Chromium (the system's, driven by Playwright) opens the report of a real
TPU, GPU and multi-host CPU session and of a failed analysis, as a reader would, at 1400 px and at phone width.

Nothing may be fetched, nothing may log an error, every section is there with content or a reason, nothing
scrolls sideways at 1400 px, and no NaN, undefined or escaped markup reaches the text. A full-page screenshot
of each report is kept under tests/artifacts/ (gitignored) for a person to look at.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import shared_profile
from xdiag.cloud.embedded import analyze_session
from xdiag.profile.locate import locate_session

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
DESKTOP, PHONE = 1400, 390
SECTIONS = ("summary", "metrics", "findings", "hosts", "step-time", "roofline", "source-lines", "lines", "hlo-op-profile",
            "kernel-stats", "custom-kernels", "compiler-checks", "memory", "xprof", "modules", "devices", "follow-up", "tools")
FAILED_SECTIONS = ("summary", "metrics", "findings", "details", "follow-up", "tools")
# What a section says when it has no data: the page must say it, not leave the section empty.
REASON_WORDS = ("not available", "not run", "failed", "none", "one host", "no ")
BAD_TEXT = re.compile(r"\bNaN\b|\bundefined\b|&lt;|&gt;|&amp;|&#39;|&quot;|\[object Object\]|\binf\b")
DECIMAL = re.compile(r"(?<![\w.:/-])\d[\d,]*\.\d+(?![\w.])")


def _raw_numbers(text: str) -> list[str]:
    """Decimals with more than 4 significant digits (10462.4908, 5.4366): numbers not brought to human precision."""
    return [n for n in DECIMAL.findall(text) if len(n.replace(",", "").replace(".", "").lstrip("0")) > 4]


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail("the browser tests need Chromium: `make test` installs it (apt-get install chromium)", pytrace=False)
    return found


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    executable = _chromium()
    with sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
        chromium = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


def _analyse(files: list[Path], folder: Path) -> Path:
    folder.mkdir(parents=True)
    for f in files:
        shutil.copyfile(f, folder / f.name)
    analysis = analyze_session(locate_session(folder if len(files) > 1 else folder / files[0].name), folder / "xdiag")
    return Path(analysis.output_uri) / "summary.html"


@pytest.fixture(scope="module")
def reports(tmp_path_factory, cpu_profiles) -> dict[str, Path]:
    """platform -> summary.html of a real session."""
    root = tmp_path_factory.mktemp("browser-reports")
    # A real multi-process jax.distributed session (one file per process), one process slowed by its input.
    hosts = cpu_profiles["straggler_input"]
    return {
        "tpu": _analyse([shared_profile("tpu/tpu_v6e_inference.xplane.pb")], root / "tpu"),
        "gpu": _analyse([shared_profile("gpu/v100x8_tf_bert_worker.xplane.pb")], root / "gpu"),
        "gpu-gemm": _analyse([shared_profile("gpu/mi300x_jax_gemm.xplane.pb")], root / "gpu-gemm"),
        "gpu-conv": _analyse([shared_profile("gpu/mi300x_jax_conv_8gpu.xplane.pb")], root / "gpu-conv"),
        "multihost-cpu": _analyse(sorted(hosts.glob("*.xplane.pb")), root / "multihost-cpu"),
        "failed": _analyse([shared_profile("bad/tpu_v6e_inference_text_mangled.xplane.pb")], root / "failed"),
    }


def _open(browser, path: Path, width: int):
    """The page at `width`, with every console error, page error and request it made."""
    page = browser.new_page(viewport={"width": width, "height": 900})
    seen = {"errors": [], "requests": []}
    page.on("console", lambda m: seen["errors"].append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))
    page.on("request", lambda r: seen["requests"].append(r.url))
    page.goto(path.as_uri(), wait_until="load")
    return page, seen


def _overflowing(page) -> list[str]:
    """Elements wider than their box (a table cut inside its scroller) and the page itself scrolling sideways."""
    return page.evaluate("""() => {
        const out = [];
        const doc = document.documentElement;
        if (doc.scrollWidth > doc.clientWidth + 1) out.push(`page ${doc.scrollWidth} > ${doc.clientWidth}`);
        for (const el of document.querySelectorAll('main *')) {
            if (el.closest('details:not([open])')) continue;
            const style = getComputedStyle(el);
            if (el.scrollWidth > el.clientWidth + 1 && ['auto', 'scroll', 'hidden'].includes(style.overflowX)
                && el.tagName !== 'svg') {
                out.push(`${el.tagName.toLowerCase()}.${el.className} ${el.scrollWidth} > ${el.clientWidth}: `
                         + el.innerText.slice(0, 60));
            }
        }
        return out;
    }""")


@pytest.mark.parametrize("platform", ["tpu", "gpu", "gpu-gemm", "multihost-cpu", "failed"])
def test_report_reads_cleanly_in_chromium(browser, reports, platform):
    path = reports[platform]
    page, seen = _open(browser, path, DESKTOP)
    try:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"report-{platform}-{DESKTOP}.png"), full_page=True)
        assert seen["errors"] == []
        assert seen["requests"] == [path.as_uri()], "the report fetched something besides itself"
        text = page.inner_text("body")
        assert not BAD_TEXT.search(text), BAD_TEXT.search(text).group(0)
        assert _raw_numbers(text) == []
        for anchor in FAILED_SECTIONS if platform == "failed" else SECTIONS:
            assert page.locator(f"section#{anchor}").count() == 1, f"section {anchor} is missing"
            body = page.inner_text(f"section#{anchor}").split("\n", 1)[-1].strip()
            assert body, f"section {anchor} is empty"
            has_content = page.locator(f"section#{anchor} :is(table, svg, dl, .metric, article, p)").count() > 0
            assert has_content or any(w in body.lower() for w in REASON_WORDS), f"section {anchor}: {body[:200]}"
        assert _overflowing(page) == []
    finally:
        page.close()


@pytest.mark.parametrize("platform", ["tpu", "gpu", "multihost-cpu"])
def test_report_fits_a_phone_and_prints(browser, reports, platform):
    page, seen = _open(browser, reports[platform], PHONE)
    try:
        page.screenshot(path=str(ARTIFACTS / f"report-{platform}-{PHONE}.png"), full_page=True)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE + 1, f"the page scrolls sideways on a phone: {width} px wide"
        page.emulate_media(media="print")
        assert page.pdf(format="A4")[:4] == b"%PDF"
        assert seen["errors"] == []
    finally:
        page.close()


MIN_CHART_TEXT_PX = 9.0

# The words of the elements `selector` finds that the reader sees cut across lines ("comp ute"): a run of letters
# and digits has no line-break opportunity (Unicode line breaking), so only a forced break can split it; breaks
# at punctuation ("f32[5,1024]" / "{1,0}") and at the template's <wbr> are the text's own.
_BROKEN_WORDS = r"""(selector) => {
    const broken = [];
    for (const el of document.querySelectorAll(selector)) {
        if (el.closest('details:not([open])') || !el.getClientRects().length) continue;
        const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            for (const m of node.textContent.matchAll(/[A-Za-z0-9]+/g)) {
                const range = document.createRange();
                range.setStart(node, m.index);
                range.setEnd(node, m.index + m[0].length);
                const lines = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
                if (lines.size > 1) broken.push(m[0]);
            }
        }
    }
    return broken;
}"""


def _chart_text_px(page) -> list[tuple[str, float]]:
    """Each visible text of the page's charts with the size it is drawn at, in CSS pixels (an SVG drawn 1000
    units wide in a 305 px box draws 12-unit text at 3.7 px; an axis title is turned, not scaled, by its rotation)."""
    return page.evaluate("""() => [...document.querySelectorAll('svg.chart text')]
        .filter(t => t.getClientRects().length && !t.closest('details:not([open])'))
        .map(t => [t.textContent, parseFloat(getComputedStyle(t).fontSize) * Math.hypot(t.getScreenCTM().a, t.getScreenCTM().b)])""")


def _evidence_tables(page) -> list[dict]:
    """Each evidence table's width against its box's, and whether the box scrolls sideways."""
    return page.evaluate("""() => [...document.querySelectorAll('table.evidence')].map(t => ({
        table: t.scrollWidth, box: t.parentElement.clientWidth,
        scrolls: ['auto', 'scroll'].includes(getComputedStyle(t.parentElement).overflowX)}))""")


@pytest.mark.parametrize("width", [DESKTOP, PHONE])
@pytest.mark.parametrize("platform", ["tpu", "gpu", "gpu-gemm", "gpu-conv", "multihost-cpu"])
def test_charts_legends_and_evidence_stay_readable(browser, reports, platform, width):
    """At 1400 and at 390 px: chart text at least 9 px (the chart scrolls rather than shrinks), no legend or
    evidence word broken across lines, an evidence table wider than its box scrolls in it, the page does not."""
    page, seen = _open(browser, reports[platform], width)
    try:
        sizes = _chart_text_px(page)
        assert sizes, "the page draws no chart text"
        small = [(text, round(px, 1)) for text, px in sizes if px < MIN_CHART_TEXT_PX]
        assert small == [], f"chart text under {MIN_CHART_TEXT_PX} px at {width} px: {small[:5]}"
        assert page.evaluate(_BROKEN_WORDS, ".legend li") == []
        assert page.evaluate(_BROKEN_WORDS, "table.evidence td") == []
        tables = _evidence_tables(page)
        assert platform == "multihost-cpu" or tables, "no finding with evidence to measure"
        for t in tables:
            assert t["table"] <= t["box"] + 1 or t["scrolls"], f"an evidence table is cut at {width} px: {t}"
        assert page.evaluate("document.documentElement.scrollWidth") <= width + 1
        assert seen["errors"] == []
    finally:
        page.close()


_PAGE_FACTS = """() => {
    const card = label => [...document.querySelectorAll('.metric')].find(m => m.querySelector('.label').textContent === label);
    const pair = label => [...document.querySelectorAll('section#xprof tr')].find(r => r.cells[0].textContent === label);
    const idle = card('Device idle'), busy = pair('Device busy');
    return {
        cards: [...document.querySelectorAll('.metric .label')].map(l => l.textContent),
        idle: idle ? idle.querySelector('.value').textContent : null,
        busy: busy ? busy.cells[1].textContent : null,
        why: [...document.querySelectorAll('ul.why li')].map(li => li.textContent),
        kv_labels: [...document.querySelectorAll('dl.kv')].map(dl => [...dl.querySelectorAll('dt')].map(dt => dt.textContent)),
        headers: [...document.querySelectorAll('th')].map(th => th.textContent),
        peak_card: card('Peak memory') ? card('Peak memory').innerText : '',
        memory: document.querySelector('section#memory') ? document.querySelector('section#memory').innerText : '',
    };
}"""


@pytest.mark.parametrize("platform", ["tpu", "gpu", "gpu-gemm", "gpu-conv", "multihost-cpu"])
def test_each_fact_has_one_value_on_the_page(browser, reports, platform):
    """Busy and idle are one fact (busy in the steps is 100% less idle, wherever it is stated); the health check
    names a figure once (MI300X conv: layout copies, unfused data movement and data movement are the same 53.4%);
    no two rows of a block read alike, no column is headed by a unit; the memory card's capacity is the memory
    section's, and an allocator limit below the device's memory is named as such (MI300X: 144 of 192 GiB)."""
    page, _ = _open(browser, reports[platform], DESKTOP)
    try:
        facts = page.evaluate(_PAGE_FACTS)
        assert "Utilization" not in facts["cards"] and "Device busy" not in facts["cards"]
        if facts["idle"] and facts["busy"]:
            idle, busy = float(facts["idle"].rstrip("%")), float(facts["busy"].rstrip("%"))
            assert busy == pytest.approx(100 - idle, abs=0.06), (facts["idle"], facts["busy"])
        figures = [f for line in facts["why"] for f in set(re.findall(r"\d[\d.]*%", line))]
        assert len(figures) == len(set(figures)), facts["why"]
        for labels in facts["kv_labels"]:
            assert len(labels) == len(set(labels)), labels
        assert not {"B", "KiB", "MiB", "GiB", "ms", "µs"} & set(facts["headers"])
        capacity = re.search(r"capacity\n([\d.]+ [GMT]iB)", facts["memory"])
        if capacity:
            assert capacity.group(1) in facts["peak_card"], (capacity.group(1), facts["peak_card"])
            limit = re.search(r"allocator limit\n([\d.]+ [GMT]iB)", facts["memory"])
            assert (limit is not None) == ("allocator's" in facts["peak_card"])
            if limit:
                assert f"allocator's {limit.group(1)} limit" in facts["peak_card"]
        if platform == "gpu-gemm":
            assert "allocator's 144 GiB limit (device memory 192 GiB)" in facts["peak_card"]
        if platform == "tpu":
            assert re.search(r"HLO values live at once\n20 GiB", facts["memory"]), "the offload's buffers live together"
    finally:
        page.close()


def test_multi_host_page_names_the_straggler_on_an_aligned_step(browser, reports):
    page, _ = _open(browser, reports["multihost-cpu"], DESKTOP)
    try:
        hosts = page.inner_text("section#hosts")
        assert "One row per host" in hosts and "arrives last" in hosts
        assert page.locator("section#hosts svg .coll.last").count() == 1  # the straggler's bar, outlined
        assert page.locator("section#hosts .rowbar").count() == 2  # one breakdown bar per host
    finally:
        page.close()


def test_impossible_numbers_are_flagged_not_shown(browser, reports):
    """XProf's per-op rows on the TPU profile say up to 192,447,054% of roofline (async copies counted as HBM
    traffic): the page names them as not measurements and shows no share or efficiency above 100%."""
    page, _ = _open(browser, reports["tpu"], DESKTOP)
    try:
        text = page.inner_text("body")
        percents = [float(p.replace(",", "")) for p in re.findall(r"(\d[\d,]*(?:\.\d+)?)%", text)]
        assert percents and max(percents) <= 100.0
        roofline = page.inner_text("section#roofline")
        assert "above 100% of the roofline: not measurements, so not shown" in roofline
        assert "&lt;" not in text and "&#39;" not in text  # XProf's escaped source lines read as plain text
    finally:
        page.close()


def test_the_page_shows_the_source_lines_that_hold_the_time(browser, tmp_path):
    """A real TPU v5e paged-attention decode: the top finding names the user's line with the Pallas kernel's file
    beside it, and op time by kind names the same line, as a reader sees them (rendered text, not the markup)."""
    capture = Path(__file__).resolve().parent / "profiles" / "tpu_v5e" / "paged_attention_decode.xplane.pb"
    report = _analyse([capture], tmp_path / "paged")
    page, seen = _open(browser, report, DESKTOP)
    try:
        finding = page.inner_text("#findings article.finding >> nth=0")
        lines = page.inner_text("#findings article.finding >> nth=0 >> ul.source-lines")
        assert "workloads/paged_attention_decode.py:" in lines and "paged_attention_kernel.py:" in lines
        assert "(setup.<locals>.decode)" in lines and "of op time" in lines
        assert "Where: workloads/paged_attention_decode.py:" in finding
        kinds = page.inner_text("section#source-lines")
        assert "attention" in kinds and "paged_attention_decode.py:" in kinds
        assert not seen["errors"] and all(url.startswith("file:") for url in seen["requests"])
        assert _overflowing(page) == []
    finally:
        page.close()


def test_the_line_view_sorts_and_opens(browser, tmp_path):
    """A real TPU v5e GPT training step: the line view lists the busiest line first by self time; a column's header
    sorts the rows by it (the step's own lines, which hold all the time below them, come first by total, and a
    second click turns the order); a row opens onto the code around its line, its ops and its rate, and closes
    again. Nothing fetched, no error, nothing scrolls sideways."""
    capture = Path(__file__).resolve().parent / "profiles" / "tpu_v5e" / "gpt_train.xplane.pb"
    report = _analyse([capture], tmp_path / "gpt")
    page, seen = _open(browser, report, DESKTOP)
    try:
        table = page.locator("section#lines table.lines >> nth=0")
        first = lambda column: table.locator("tbody >> nth=0 >> tr.head >> td").nth(column).get_attribute("data-key")
        column = lambda n: [float(table.locator("tbody").nth(i).locator("tr.head td").nth(n).get_attribute("data-key"))
                            for i in range(table.locator("tbody").count())]
        assert first(0).startswith("workloads/gpt_train.py:")
        assert column(2) == sorted(column(2), reverse=True)  # self time, busiest first
        total = table.locator("thead th").nth(4)
        total.click()
        assert total.get_attribute("aria-sort") == "descending" and column(4) == sorted(column(4), reverse=True)
        assert column(4)[0] > column(2)[0]  # a caller holds more than the busiest line's own ops
        total.click()
        assert total.get_attribute("aria-sort") == "ascending" and column(4) == sorted(column(4))
        table.locator("thead th").nth(2).click()  # back to self time, busiest first
        row = table.locator("tbody >> nth=0")
        detail = row.locator("tr.detail")
        assert detail.is_hidden()
        row.locator("tr.head").click()
        assert detail.is_visible() and row.locator("tr.head").get_attribute("aria-expanded") == "true"
        text = detail.inner_text()
        assert "Rate:" in text and "TFLOP/s" in text and "Ops: fusion" in text and "roof" in text
        row.locator("tr.head").click()
        assert detail.is_hidden()
        functions = page.locator("section#lines table.lines >> nth=1")
        assert functions.locator("thead th").nth(3).get_attribute("aria-sort") == "descending"
        assert not seen["errors"] and all(url.startswith("file:") for url in seen["requests"])
        assert _overflowing(page) == []
    finally:
        page.close()
