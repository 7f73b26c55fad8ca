"""An option that takes one of a fixed set of values is checked before any work is done: a value outside the set
exits 2 with one line on stderr naming the choices, and nothing on stdout (issue 72, item 17)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROFILE = Path(__file__).parent / "profiles" / "tpu_v5e" / "running_sum.xplane.pb"


def _xdiag(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(cwd / "cache"), "XDIAG_CONTROL_PLANE_URL": "http://127.0.0.1:9"}
    return subprocess.run([sys.executable, "-m", "xdiag.cli", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_lines_with_an_unknown_order_exits_2_before_the_profile_is_decoded(tmp_path):
    # Before: the profile was decoded (and kept in the cache), then the tool's refusal printed on stdout, exit 1.
    done = _xdiag("lines", str(PROFILE), "--order", "bogus", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, ""), (done.returncode, done.stdout[-500:])
    assert done.stderr.strip() == "xdiag: --order 'bogus': not one of self, total, host"
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*"))


@pytest.mark.parametrize("args, said", [
    (("analyze", str(PROFILE), "--investigator", "bogus"), "xdiag: --investigator 'bogus': not one of rules, gemini"),
    (("capture", "--run", "r", "--device-tracer", "7"), "Invalid value for '--device-tracer'"),
    (("continuous", "start", "--run", "r", "--device-tracer", "-1"), "Invalid value for '--device-tracer'"),
])
def test_every_option_of_a_fixed_set_of_values_is_checked_before_any_work(tmp_path, args, said):
    # Before: a tracer level of 7 went to the control plane (here none answers: exit 1 on its failure).
    done = _xdiag(*args, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, ""), (done.returncode, done.stdout[-500:], done.stderr[-500:])
    assert said in done.stderr, done.stderr


@pytest.mark.parametrize("command", [("analyze", str(PROFILE)), ("tool", "get_kpi_metrics", str(PROFILE)),
                                     ("lines", str(PROFILE)), ("mcp",)])
@pytest.mark.parametrize("gib", ["nan", "inf", "-1", "0"])
def test_a_profile_bound_that_is_no_positive_finite_number_exits_2_before_any_work(tmp_path, command, gib):
    # Before: nan and inf ended in a traceback (int(nan * 2**30)); -1 was taken, then every profile refused.
    done = _xdiag(*command, "--max-profile-gib", gib, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, ""), (done.returncode, done.stdout[-500:], done.stderr[-500:])
    assert done.stderr.strip() == f"xdiag: --max-profile-gib {float(gib)}: not a positive finite number"
    assert not (tmp_path / "cache").exists() and not (tmp_path / "xdiag-out").exists()


@pytest.mark.parametrize("top", ["0", "-1", "201"])
def test_diff_top_is_bounded_as_lines_top_is(tmp_path, top):
    # Before: --top -1 was taken and silently dropped a row of each group; --top 0 listed none.
    done = _xdiag("diff", str(PROFILE), str(PROFILE), "--top", top, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, ""), (done.returncode, done.stdout[-500:], done.stderr[-500:])
    assert "Invalid value for '--top'" in done.stderr, done.stderr
    assert not (tmp_path / "xdiag-out").exists()
