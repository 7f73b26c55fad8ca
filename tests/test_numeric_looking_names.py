"""Names from a profile that only look numeric ('²'.isdigit() is true, int('²') fails) read as names (issue 72,
item 4): every number read out of outside text goes through xdiag.text_numbers, and "bad arguments" is said of
arguments only."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from tests.fuzzing import _kineto, with_hlo_edited, with_space_edited
from tests.test_fuzz_shapes import _analyze, _broad_tools
from xdiag.text_numbers import plain_number, whole_number


def test_only_ascii_digits_of_a_uint64_read_as_a_number():
    assert [whole_number(t) for t in ("36", "0", "9" * 20)] == [36, 0, int("9" * 20)]  # a uint64 fingerprint: 20
    assert [whole_number(t) for t in ("²", "①", "٣", "", "-1", " 7", "1.5", "9" * 21, "9" * 5000)] == [None] * 9
    assert whole_number("²", 0) == 0
    assert [plain_number(t) for t in ("38", "12.5", "²", "1.²", "1.2.3", ".", "")] == [38, 12.5, None, None, None,
                                                                                     None, None]


def _functions_named(name: str):
    def edit(proto):
        names = proto.hlo_module.stack_frame_index.function_names
        for index in range(len(names)):
            names[index] = name
    return edit


def test_a_function_named_like_a_line_number_ends_analyze_in_a_report(tmp_path):
    # Before: the report's lines section did int('²') on `_loss:²` and analyze ended in a traceback with no report.
    profile = with_hlo_edited(tmp_path / "fn.xplane.pb", _functions_named("_loss:²"))
    done = _analyze(profile, tmp_path / "out")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "_loss:²" in (tmp_path / "out" / "summary.html").read_text()


def _program_ids_named(text: str):
    def edit(space):
        for plane in space.planes:
            for line in plane.lines:
                if line.name == "XLA Modules":
                    for key in {event.metadata_id for event in line.events}:
                        metadata = plane.event_metadata[key]
                        metadata.name = metadata.name.partition("(")[0] + f"({text})"
    return edit


def test_a_module_whose_program_id_is_not_a_number_fails_no_tool(tmp_path):
    # Before: `jit_normalised_running_sum(²)` failed 12 of the broad tools, each "bad arguments: invalid literal".
    profile = with_space_edited(tmp_path / "module.xplane.pb", _program_ids_named("²"))
    _, failed = _broad_tools(profile)
    assert failed == {}


def test_registers_that_are_not_a_number_are_left_out_of_kernel_stats(tmp_path):
    # Before: `regs:²` in a kernel's launch facts failed get_kernel_stats ("bad arguments: invalid literal").
    from xdiag.profile.reader import read_session_in_process
    from xdiag.tools.registry import run_tool

    trace = json.loads(_kineto())
    trace["traceEvents"][1]["args"].update({"registers per thread": "²", "shared memory": 4096})
    profile = tmp_path / "regs.pt.trace.json"
    profile.write_text(json.dumps(trace))
    result = run_tool(read_session_in_process([profile]), "get_kernel_stats")
    assert result.status.value == "ok", result.reason
    kernel = json.dumps(result.detail)
    assert '"shared_memory_bytes": 4096' in kernel and "registers_per_thread" not in kernel


def test_a_value_error_inside_a_tool_is_its_failure_not_bad_arguments(monkeypatch):
    from xdiag.profile.reader import read_session_in_process
    from xdiag.tools import registry

    spec = registry.REGISTRY["get_hosts"]

    def failing(session, **args):
        return int("²")

    monkeypatch.setitem(registry.REGISTRY, "get_hosts", dataclasses.replace(spec, func=failing))
    session = read_session_in_process([Path(__file__).parent / "profiles" / "tpu_v5e" / "running_sum.xplane.pb"])
    result = registry.run_tool(session, "get_hosts")
    assert result.status.value == "failed" and not result.reason.startswith("bad arguments"), result.reason
    assert re.fullmatch(r"ValueError: invalid literal .*\(at test_numeric_looking_names\.py:\d+\)", result.reason)
    refused = registry.run_tool(session, "get_hosts", {"bogus": 1})
    assert refused.reason.startswith("bad arguments: get_hosts takes no argument(s) ['bogus']"), refused.reason


def test_a_content_length_that_only_looks_numeric_is_refused_not_a_server_error():
    import io

    from xdiag.cloud.body_limit import BodyLimit

    answered = []
    limited = BodyLimit(lambda environ, start_response: [b"reached"], max_bytes=10)
    environ = {"CONTENT_LENGTH": "²", "wsgi.input": io.BytesIO(b"")}  # WSGI headers are Latin-1: '²' is one
    body = limited(environ, lambda status, headers: answered.append(status))
    assert answered == ["413 Request Entity Too Large"] and b"reached" not in b"".join(body)


def _peaks_written_as(text: str):
    def edit(space):
        for plane in space.planes:
            names = {key: metadata.name for key, metadata in plane.stat_metadata.items()}
            for stat in plane.stats:
                if names.get(stat.metadata_id) in ("peak_teraflops_per_second", "peak_hbm_bw_gigabytes_per_second"):
                    stat.str_value = text
    return edit


def test_recorded_peaks_that_are_no_number_are_absent_and_the_datasheet_is_used(tmp_path):
    # Before: peaks written as the text '²' failed 5 broad tools ("could not convert string to float: '²'").
    from xdiag.analysis.device_peaks import checked_peaks, recorded_peaks

    assert recorded_peaks({"peak_teraflops_per_second": "197", "peak_hbm_bw_gigabytes_per_second": 819.0}) == (
        197e12, 819e9)
    for text in ("²", "nan", "1e999", "-1"):
        assert recorded_peaks({"peak_teraflops_per_second": text, "peak_hbm_bw_gigabytes_per_second": text}) == (
            None, None)
    assert recorded_peaks({"peak_teraflops_per_second": float("nan"), "memory_bandwidth": float("inf")}) == (
        None, None)
    profile = with_space_edited(tmp_path / "peaks.xplane.pb", _peaks_written_as("²"))
    _, failed = _broad_tools(profile)
    assert failed == {}
    assert checked_peaks({"device_type_string": "TPU v5 lite", "peak_teraflops_per_second": "²"})["flops_source"] \
        .startswith("datasheet")
