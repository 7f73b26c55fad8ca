"""Structural mutants of a real profile (issue 62, item 3: inputs that abort or exhaust): shapes no bit flip reaches,
built with the real protos from tests/profiles/tpu_v5e/running_sum.xplane.pb (tests/fuzzing.py), each run in a child
process so that an abort is seen as the signal it is. Every one ends in an answer or one line of reason, within
~30 s."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.fuzzing import (SHAPE_SEED, deep_shape, event_offset, fusion_calls_its_own_computation, fusion_dims,
                           lines_far_apart, many_operand_ids,
                           negative_device_durations,
                           with_device_planes, with_hlo_edited, with_space_edited)

TESTS = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "shared"), str(TESTS.parent)])}


def _child(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], cwd=TESTS.parent, env=ENV, capture_output=True,
                          text=True, timeout=timeout)


_OVERVIEW = """
import sys
from pathlib import Path
from xdiag.analysis.xprof.views import XprofViews
from xdiag.errors import NotAvailable
try:
    XprofViews([Path(sys.argv[1])]).overview_tool()
    print("converted")
except NotAvailable as error:
    print("not available:", error)
"""


def test_100k_empty_device_planes_are_refused_before_xprofs_converter_aborts_the_process(tmp_path):
    # Before: XProf's converter starts a thread per device plane; pthread_create fails and it aborts the process
    # (rc -6, SIGABRT) with its reason on the fd 2 `quiet` had swallowed.
    profile = with_device_planes(tmp_path / "planes.xplane.pb", 100_000)
    done = _child(_OVERVIEW, str(profile))
    assert done.returncode == 0, (done.returncode, done.stderr[-800:])
    assert "not available: planes.xplane.pb holds 100,002 device planes, more than the 4,096" in done.stdout


def test_a_few_thousand_device_planes_are_still_converted(tmp_path):
    profile = with_device_planes(tmp_path / "planes.xplane.pb", 4_000)
    done = _child(_OVERVIEW, str(profile))
    assert done.returncode == 0, (done.returncode, done.stderr[-800:])
    assert "device planes" not in done.stdout


def _broad_tools(profile: Path) -> tuple[list[str], dict[str, str]]:
    """The host's warnings, and the broad tools' failures (tool: reason), on `profile` read in this process."""
    from xdiag.profile.reader import read_session_in_process
    from xdiag.tools.registry import BROAD_TOOLS, run_tool

    session = read_session_in_process([profile])
    failed = {}
    for name in BROAD_TOOLS:
        result = run_tool(session, name)
        if result.status.value == "failed":
            failed[name] = result.reason
    return [w for host in session.hosts for w in host.warnings], failed


def test_a_fusion_calling_its_own_computation_is_cut_and_said_in_one_line(tmp_path):
    # Before: RecursionError in 10 tools (get_roofline_model, get_kpi_metrics, get_custom_kernels, ...).
    profile = with_hlo_edited(tmp_path / "cycle.xplane.pb", fusion_calls_its_own_computation)
    warnings, failed = _broad_tools(profile)
    assert failed == {}
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert "1 call(s) back into a computation they are called from (a cycle: fusion." in warnings[0]


def test_a_5000_deep_shape_leaves_that_field_out_and_keeps_the_module(tmp_path):
    # Before: protobuf refused the whole HloProto (past 100 levels) and the profile read as carrying no HLO modules.
    from xdiag.profile.reader import read_session_in_process

    profile = with_hlo_edited(tmp_path / "deep.xplane.pb", deep_shape(5_000))
    session = read_session_in_process([profile])
    assert [m.name for m in session.hlo_modules] == ["jit_normalised_running_sum"]
    assert sum(len(c.instructions) for c in session.hlo_modules[0].computations.values()) > 10
    warnings = [w for host in session.hosts for w in host.warnings]
    assert warnings == ["HLO module jit_normalised_running_sum: 1 field(s) nested more than 90 messages deep left "
                        "out (protobuf decodes 100 at most); the rest of the module kept"]


def test_a_5000_long_chain_of_calls_is_cut_at_the_depth_followed(tmp_path):
    def chain(proto):
        module = proto.hlo_module
        first = module.computations[0]
        previous = first
        top = max(c.id for c in module.computations)
        for index in range(5_000):
            computation = module.computations.add(name=f"chain.{index}", id=top + 1 + index)
            call = computation.instructions.add(name=f"call.{index}", opcode="call", id=1)
            call.shape.element_type = 11
            previous.instructions[0].called_computation_ids.append(computation.id)
            previous = computation

    profile = with_hlo_edited(tmp_path / "chain.xplane.pb", chain)
    warnings, failed = _broad_tools(profile)
    assert failed == {}
    assert any("call(s) nested more than 64 computations deep left out" in w for w in warnings), warnings


def _analyze(profile: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xdiag.cli", "analyze", str(profile), "--out", str(out),
                           "--no-xprof-views"], cwd=TESTS.parent, env=ENV, capture_output=True, text=True, timeout=120)


def test_negative_durations_read_as_0_and_said_never_a_share_past_the_whole(tmp_path):
    # Before: a P0 finding at "3,967,826,530,993%" of the step.
    profile = with_space_edited(tmp_path / "negative.xplane.pb", negative_device_durations)
    done = _analyze(profile, tmp_path / "out")
    assert done.returncode == 0, done.stderr[-2000:]
    text = (tmp_path / "out" / "analysis.json").read_text()
    shares = [float(m.replace(",", "")) for m in re.findall(r"(\d[\d,]*(?:\.\d+)?)%", text)]
    assert shares and max(shares) <= 100, sorted(shares)[-3:]
    warnings = re.findall(r'"([^"]*negative duration[^"]*)"', text)
    assert warnings and re.search(r"negative.xplane.pb: [\d,]+ events of plane /device:TPU:0 have a negative "
                                  r"duration, read as 0 ps", warnings[0]), warnings


def test_lines_10_to_the_16_ns_apart_end_in_one_line_of_reason(tmp_path):
    # Before: OverflowError (Python int too large to convert to C long) and a traceback, exit 1.
    profile = with_space_edited(tmp_path / "far.xplane.pb", lines_far_apart)
    done = _analyze(profile, tmp_path / "out")
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr
    assert re.match(r"xdiag: far.xplane.pb: line '.*' of /device:TPU:0 starts 9,999,999,999,9[\d,]+ ns \(116 days\) "
                    r"after the session's first line, past the 4,611,686,018,427,387 ns a time in ps is read with; its "
                    r"clocks do not agree", last), last


def test_an_event_offset_that_wraps_int64_once_its_line_is_moved_ends_in_one_line_of_reason(tmp_path):
    # Before: the offset 2^63-1 plus its line's start wrapped to -9.2e18 ps without a word, and analyze said ok.
    for offset in (2**63 - 1, -2**63):
        profile = with_space_edited(tmp_path / "offset.xplane.pb", event_offset(offset))
        done = _analyze(profile, tmp_path / "out")
        assert done.returncode == 2 and "Traceback" not in done.stderr, (offset, done.stderr[-2000:])
        last = done.stderr.strip().splitlines()[-1]
        assert re.match(r"xdiag: offset.xplane.pb: line 'main/3277' of /host:CPU holds events 9,223,37[\d,]+ ns "
                        r"from the session's first line \(their offsets and lengths added\), past the "
                        r"4,611,686,018,427,387 ns a time in ps is read with; not a profiler's times", last), last


def test_the_read_deadline_is_checked_per_plane_not_only_per_line(tmp_path, monkeypatch):
    # Before: planes of no lines never met the deadline (3M planes read past 120 s); here 30,000 planes read to the
    # end (4 s on the 2-core VM, unloaded) past a deadline of 1 s.
    import time

    import pytest

    from xdiag.errors import ProfileError
    from xdiag.profile import reader

    profile = with_device_planes(tmp_path / "planes.xplane.pb", 30_000)
    monkeypatch.setattr(reader, "read_deadline", lambda size: time.monotonic() + 1.0)
    started = time.monotonic()
    with pytest.raises(ProfileError, match=r"planes.xplane.pb: the read took longer than its bound \(30 s \+ 1 s a "
                                           r"MiB\) and stopped at byte \d+; not read"):
        reader.read_host(profile)
    assert time.monotonic() - started < 3.0


_TRUNCATED_WHILE_READ = """
import os, sys
from pathlib import Path
from xdiag.errors import ProfileError
from xdiag.profile import reader
path, in_memory = sys.argv[1], int(sys.argv[2])
reader.READ_INTO_MEMORY_BYTES = in_memory
decode = reader._decode_plane
def truncating(*args, **kwargs):
    plane = decode(*args, **kwargs)
    os.truncate(path, 100)  # another process cuts the file short after the first plane is read
    return plane
reader._decode_plane = truncating
try:
    host, _ = reader.read_host(Path(path))
    print("read", len(host.planes), "planes")
except ProfileError as error:
    print("refused:", error)
"""


def test_a_small_profile_truncated_while_read_is_read_as_it_was_opened(tmp_path):
    # Before: SIGBUS (rc -7): the file was mapped and the next plane's pages were gone.
    profile = tmp_path / "cut.xplane.pb"
    profile.write_bytes((TESTS / "profiles" / "tpu_v5e" / "running_sum.xplane.pb").read_bytes())
    done = _child(_TRUNCATED_WHILE_READ, str(profile), str(64 * 2**20))
    assert done.returncode == 0, (done.returncode, done.stderr[-800:])
    assert done.stdout.strip() == "read 7 planes"


def test_a_mapped_profile_that_shrinks_while_read_is_refused_as_truncated(tmp_path):
    # Before: SIGBUS (rc -7), no message.
    profile = tmp_path / "cut.xplane.pb"
    profile.write_bytes((TESTS / "profiles" / "tpu_v5e" / "running_sum.xplane.pb").read_bytes())
    done = _child(_TRUNCATED_WHILE_READ, str(profile), "0")
    assert done.returncode == 0, (done.returncode, done.stderr[-800:])
    assert done.stdout.strip() == ("refused: cut.xplane.pb: the file shrank from 74,906 to 100 bytes while it was "
                                   "read (another process truncated or rewrote it); not read")


_PEAK = """
import resource, sys
from pathlib import Path
from xdiag.profile.reader import read_host
host, _ = read_host(Path(sys.argv[1]))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
print(host.warnings)
"""


def test_an_instruction_of_5m_operand_ids_is_read_in_memory_bounded_by_its_bytes(tmp_path):
    # Before: 5M operand ids (30 MB) peaked 570 MB over the seed's read (19 times the bytes; 50M ids, 200 MB: 5 GiB).
    profile = with_hlo_edited(tmp_path / "operands.xplane.pb", many_operand_ids(5_000_000))
    added = profile.stat().st_size - SHAPE_SEED.stat().st_size
    base, mutant = _child(_PEAK, str(SHAPE_SEED)), _child(_PEAK, str(profile))
    assert mutant.returncode == 0, mutant.stderr[-800:]
    over = int(mutant.stdout.split()[0]) - int(base.stdout.split()[0])
    assert over < 8 * added, (over >> 20, added >> 20)
    assert "1 instruction(s) with more than 65,536 operands (reduce_window_sum.3: 5,000,000) kept their first " \
           "65,536" in mutant.stdout


def _numbers(folder: Path) -> list[float]:
    """Every number the analysis wrote in its tools' answers."""
    return [float(m) for path in (folder / "tools").glob("*.json")
            for m in re.findall(r'": (-?\d+(?:\.\d+)?(?:e[+-]?\d+)?)[,\n}]', path.read_text())]


def test_fusions_of_dimensions_2_to_the_62_or_negative_are_read_as_scalars_and_said(tmp_path):
    # Before (a round of our own): dimensions [2^62, 2^62] made memory_passes 1.6e30; [-5, 7] negative bytes per run,
    # bandwidths and roofline efficiencies in get_hlo_op_profile and detect_unfused_reshapes.
    for name, dims in (("huge", [2**62, 2**62]), ("negative", [-5, 7])):
        profile = with_hlo_edited(tmp_path / f"{name}.xplane.pb", fusion_dims(dims))
        done = _analyze(profile, tmp_path / name)
        assert done.returncode == 0, done.stderr[-2000:]
        numbers = _numbers(tmp_path / name)
        assert max(numbers) < 1e15 and not [n for n in numbers if n < 0 and n != -1], (name, max(numbers),
                                                                                         min(numbers))
        assert re.search(r"HLO module jit_normalised_running_sum: \d+ shape\(s\) with a negative dimension or more "
                         r"than 2\^48 elements \(fusion\.\d+: \[", (tmp_path / name / "analysis.json").read_text())
