"""Structural mutants of a real profile (issue 62, item 3: inputs that abort or exhaust): shapes no bit flip reaches,
built with the real protos from tests/profiles/tpu_v5e/running_sum.xplane.pb (tests/fuzzing.py), each run in a child
process so that an abort is seen as the signal it is. Every one ends in an answer or one line of reason, within
~30 s."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.fuzzing import with_device_planes

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
