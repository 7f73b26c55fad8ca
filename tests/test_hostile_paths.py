"""Odd paths a user (or whoever can write their folders) may hand xdiag: file names of any characters, a pipe or a
device under a profile's name, an unreadable file in a session folder, and links planted in the output folder. Every
command answers (exit 0) or refuses with one line (exit 2); nothing is written outside --out or through a link."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from xdiag.ids import check_name
from xdiag.profile.locate import id_from_file_name, locate_session

PROFILE = Path(__file__).parent / "profiles" / "tpu_v5e" / "running_sum.xplane.pb"


def _xdiag(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xdiag.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(cwd / "cache")})


def _one_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.mark.parametrize("name, readable", [
    ("my profile", "my_profile-"), ("run(1)", "run_1_-"), ("run[/x]", "run_x_-"), ("profil é", "profil_e-"),
    ("профиль", "profile-"), ("-starts-with-a-dash", "starts-with-a-dash-"), ("...", "profile-")])
def test_a_session_name_is_made_from_any_file_name(name, readable):
    made = id_from_file_name(name)
    assert check_name(made, "session id") == made and made.startswith(readable) and len(made) == len(readable) + 6
    assert id_from_file_name(name) == made  # the same name every time


def test_names_that_differ_only_in_the_characters_replaced_stay_apart():
    assert id_from_file_name("run(1)") != id_from_file_name("run[1]")
    assert id_from_file_name("healthy") == "healthy"  # a name in the grammar stays as it is


def test_analyze_and_tool_read_a_file_whose_name_has_spaces_parentheses_and_accents(tmp_path):
    profile = tmp_path / "my profile (1) é.xplane.pb"
    shutil.copyfile(PROFILE, profile)
    located = locate_session(profile)
    check_name(located.name, "session id")
    analyzed = _xdiag("analyze", str(profile), "-q", "--no-xprof-views", cwd=tmp_path)
    assert analyzed.returncode == 0, analyzed.stderr
    assert Path(analyzed.stdout.strip()) == tmp_path / "xdiag-out" / located.name / "summary.html"
    tool = _xdiag("tool", "get_kpi_metrics", str(profile), cwd=tmp_path)
    assert tool.returncode == 0, tool.stderr


def test_a_pipe_or_a_device_under_a_profiles_name_is_refused_in_one_line(tmp_path):
    pipe = tmp_path / "x.xplane.pb"
    os.mkfifo(pipe)
    device = tmp_path / "z.xplane.pb"
    device.symlink_to("/dev/zero")
    folder = tmp_path / "session"
    folder.mkdir()
    os.mkfifo(folder / "host0.xplane.pb")
    for path in (pipe, device):
        for command in (["analyze", str(path), "-q", "--no-xprof-views", "--out", str(tmp_path / "out")],
                        ["tool", "get_kpi_metrics", str(path)]):
            assert "neither a regular file nor a folder" in _one_line(_xdiag(*command, cwd=tmp_path))
    with pytest.raises(Exception, match="not a regular file"):
        from xdiag.profile.reader import read_host

        read_host(folder / "host0.xplane.pb")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_in_a_session_folder_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "session"
    folder.mkdir()
    shutil.copyfile(PROFILE, folder / "host0.xplane.pb")
    os.chmod(folder / "host0.xplane.pb", 0)
    line = _one_line(_xdiag("analyze", str(folder), "-q", "--no-xprof-views", "--out", str(tmp_path / "out"),
                            cwd=tmp_path))
    assert "cannot be read" in line


def test_links_planted_in_the_output_folder_are_never_followed(tmp_path):
    out, victim, elsewhere = tmp_path / "out", tmp_path / "victim", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    victim.write_text("precious")
    for name in ("summary.html.tmp", "analysis.json.tmp", "summary.html"):
        (out / name).symlink_to(victim)
    done = _xdiag("analyze", str(PROFILE), "-q", "--no-xprof-views", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious"
    assert not (out / "summary.html").is_symlink() and "<html" in (out / "summary.html").read_text().lower()
    # A folder of the output that leads elsewhere: refused in one line, nothing written there.
    shutil.rmtree(out)
    out.mkdir()
    (out / "tools").symlink_to(elsewhere, target_is_directory=True)
    line = _one_line(_xdiag("analyze", str(PROFILE), "-q", "--no-xprof-views", "--out", str(out), cwd=tmp_path))
    assert "leads out of" in line and list(elsewhere.iterdir()) == []


HOSTILE_NAME = "x\tvictim.txt\t1\nzz.xplane.pb"
"""A name that, in a line of tab-separated fields, is a request of its own: read `x`, write over `victim.txt`."""


def _hostile_session(tmp_path: Path) -> tuple[Path, Path]:
    folder = tmp_path / "session"
    folder.mkdir()
    for name in ("host0.xplane.pb", HOSTILE_NAME, "x"):  # `x`: the file the forged request would read
        shutil.copyfile(PROFILE, folder / name)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    return folder, victim


def test_a_file_name_cannot_forge_a_request_to_the_host_readers(tmp_path, monkeypatch):
    from xdiag.profile.hosts_map import read_session_by_host

    folder, victim = _hostile_session(tmp_path)
    monkeypatch.chdir(tmp_path)  # a forged `victim.txt` would be written here
    try:
        session = read_session_by_host([folder / "host0.xplane.pb", folder / HOSTILE_NAME], workers=2)
    finally:  # checked first: the forged request fails the read too, after it wrote
        assert victim.read_bytes() == b"precious", "victim.txt was written over by a request a file name forged"
    assert sorted(h.path.name for h in session.hosts) == sorted(["host0.xplane.pb", HOSTILE_NAME])


def test_a_profile_name_with_control_characters_is_refused_in_one_line(tmp_path):
    folder, victim = _hostile_session(tmp_path)
    for command in (["analyze", str(folder), "-q", "--no-xprof-views", "--out", str(tmp_path / "out")],
                    ["tool", "get_kpi_metrics", str(folder)]):
        done = _xdiag(*command, cwd=tmp_path)
        assert victim.read_bytes() == b"precious", "victim.txt was written over by a request a file name forged"
        line = _one_line(done)
        assert "control characters" in line and "x\\tvictim.txt\\t1\\nzz.xplane.pb" in line, line
