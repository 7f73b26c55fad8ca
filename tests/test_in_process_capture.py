"""`python -m xdiag.examples.in_process`: several workloads profiled in one process (how the TPU captures are made),
run here on the CPU as its users run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from xdiag.profile.locate import locate_session
from xdiag.profile.reader import read_session

SHARED = Path(__file__).resolve().parents[1] / "shared"


def test_in_process_capture_writes_each_profile_a_manifest_and_an_archive(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SHARED), "JAX_PLATFORMS": "cpu"}
    archive = tmp_path / "profiles.tgz"
    proc = subprocess.run(
        [sys.executable, "-m", "xdiag.examples.in_process", "host_transfers", "running_sum", "collective_bound",
         "--steps", "3", "--logdir", str(tmp_path / "cap"), "--archive", str(archive)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((tmp_path / "cap" / "manifest.json").read_text())
    assert manifest["platform"] == "cpu"
    entries = manifest["workloads"]
    assert entries["host_transfers"]["steps"] == 3 and entries["running_sum"]["steps"] == 3
    assert "needs >= 2 devices" in entries["collective_bound"]["skipped"]  # one CPU device: said, not failed
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["host_transfers.xplane.pb", "manifest.json", "running_sum.xplane.pb"]
        tar.extractall(tmp_path / "unpacked", filter="data")
    session = read_session(locate_session(tmp_path / "unpacked" / "running_sum.xplane.pb").files)
    assert session.hosts, "the archived profile is a readable XSpace"


def test_in_process_capture_refuses_an_unknown_workload(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SHARED)}
    proc = subprocess.run([sys.executable, "-m", "xdiag.examples.in_process", "no_such", "--logdir", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown workload(s): no_such" in proc.stderr
