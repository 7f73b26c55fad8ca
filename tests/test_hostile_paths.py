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


LONG = Path(__file__).parent / "profiles" / "tpu_v5e" / "gru_scan_train.xplane.pb"


def _holds_flock(pid: int, path: Path) -> bool:
    """Whether process `pid` holds a flock on `path`, from Linux's /proc/locks: looking takes no lock (a probe's own
    flock could make the analysis it probes refuse)."""
    try:
        inode = path.stat().st_ino
        locks = Path("/proc/locks").read_text()
    except OSError:
        return False
    return any(f[1] == "FLOCK" and f[4] == str(pid) and f[5].rsplit(":", 1)[-1] == str(inode)
               for f in (line.split() for line in locks.splitlines()) if len(f) > 5)


def test_two_analyses_into_one_out_cannot_both_succeed(tmp_path):
    """One analysis stopped while it writes into --out (SIGSTOP once it holds the folder's lock), a second into the
    same --out: one refuses in one line, the other's report is the one the folder holds (each printed the other's).
    Stopped as soon as the folder was there, the first could stop before taking the lock: the second then ran
    alone and the first after it, both rightly, and the test failed (once in a full run)."""
    import signal
    import time

    from xdiag.cloud.embedded import OUT_LOCK

    out = tmp_path / "out"
    env = {**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")}
    first = subprocess.Popen([sys.executable, "-m", "xdiag.cli", "analyze", str(LONG), "--no-xprof-views", "-q",
                              "--out", str(out)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not _holds_flock(first.pid, out / OUT_LOCK) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        assert first.poll() is None, first.communicate()
        os.kill(first.pid, signal.SIGSTOP)
        second = _xdiag("analyze", str(PROFILE), "--no-xprof-views", "-q", "--out", str(out), cwd=tmp_path)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    first_out, first_err = first.communicate(timeout=300)
    done = {"first": first.returncode, "second": second.returncode}
    assert sorted(done.values()) == [0, 2], f"both analyses into one --out exited {done}"
    refused = second if second.returncode else subprocess.CompletedProcess([], first.returncode, first_out, first_err)
    assert "another analysis is writing there" in _one_line(refused)
    import json

    kept = json.loads((out / "analysis.json").read_text())["session_id"]
    assert kept == (LONG if first.returncode == 0 else PROFILE).name.removesuffix(".xplane.pb")


def test_an_out_below_a_file_or_on_a_full_disk_is_refused_in_one_line(tmp_path):
    import resource
    import signal

    (tmp_path / "a_file").write_text("x")
    line = _one_line(_xdiag("analyze", str(PROFILE), "-q", "--no-xprof-views", "--out", str(tmp_path / "a_file" / "out"),
                            cwd=tmp_path))
    assert "the output folder cannot be made (Not a directory" in line

    def full() -> None:  # every write past 20 kB fails as on a full disk (EFBIG, as ENOSPC would)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    done = subprocess.run([sys.executable, "-m", "xdiag.cli", "analyze", str(PROFILE), "-q", "--no-xprof-views",
                           "--out", str(tmp_path / "full")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, preexec_fn=full, env={**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "c")})
    assert "the analysis cannot be written there (File too large" in _one_line(done)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes any folder")
def test_a_read_only_out_is_refused_in_one_line(tmp_path):
    (tmp_path / "read_only").mkdir(mode=0o555)
    line = _one_line(_xdiag("analyze", str(PROFILE), "-q", "--no-xprof-views", "--out",
                            str(tmp_path / "read_only" / "out"), cwd=tmp_path))
    assert "cannot be made (Permission denied" in line


def test_a_profile_directly_under_the_root_folder_is_located():
    from xdiag.profile.locate import file_session_names

    assert file_session_names(Path("/run.xplane.pb")) == ("run", "local")
    assert file_session_names(Path("/logs/plugins/profile/s1/h.xplane.pb")) == ("s1", "logs")


@pytest.mark.skipif(not os.access("/", os.W_OK), reason="a file directly under / needs root")
def test_analyze_a_profile_directly_under_the_root_folder(tmp_path):
    profile = Path("/") / f"xdiag-test-{os.getpid()}.xplane.pb"
    shutil.copyfile(PROFILE, profile)
    try:
        done = _xdiag("analyze", str(profile), "-q", "--no-xprof-views", "--out", str(tmp_path / "out"), cwd=tmp_path)
    finally:
        profile.unlink()
    assert done.returncode == 0, done.stderr


def test_a_session_is_the_folder_its_name_names_where_another_folders_made_name_is_the_same(tmp_path):
    from xdiag.profile.locate import log_dir_sessions

    profile_dir = tmp_path / "logs" / "plugins" / "profile"
    made = id_from_file_name("a b")
    for folder in ("a b", made):
        (profile_dir / folder).mkdir(parents=True)
        shutil.copyfile(PROFILE, profile_dir / folder / "host0.xplane.pb")
    assert locate_session(tmp_path / "logs", made).folder_name == made
    names = [s.name for s in log_dir_sessions(tmp_path / "logs")]
    assert len(set(names)) == 2, names
    spaced = next(s.name for s in log_dir_sessions(tmp_path / "logs") if s.folder_name == "a b")
    assert locate_session(tmp_path / "logs", spaced).folder_name == "a b"


def _two_hosts(tmp_path: Path) -> Path:
    session = tmp_path / "two_hosts"
    session.mkdir()
    for host in ("host0", "host1"):
        shutil.copyfile(LONG, session / f"{host}.xplane.pb")
    return session


def test_sigterm_to_analyze_leaves_nothing_in_the_temporary_folder(tmp_path):
    """SIGTERM while the hosts of a 2-host session are mapped into the temporary folder: the process ends (143) and
    takes the mapped hosts with it (486 MiB were left on a large session)."""
    import signal
    import time

    temporary = tmp_path / "tmp"
    temporary.mkdir()
    analysis = subprocess.Popen(
        [sys.executable, "-m", "xdiag.cli", "analyze", str(_two_hosts(tmp_path)), "-q", "--no-xprof-views", "--out",
         str(tmp_path / "out")], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "TMPDIR": str(temporary), "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache")})
    deadline = time.monotonic() + 120
    while analysis.poll() is None and time.monotonic() < deadline and not any(
            p.name.startswith("xdiag-hosts") and any(p.iterdir()) for p in temporary.iterdir()):
        time.sleep(0.005)
    assert analysis.poll() is None, "the analysis ended before its hosts were mapped"
    analysis.send_signal(signal.SIGTERM)
    analysis.communicate(timeout=120)
    time.sleep(0.5)  # its map workers end on their own once their requests' pipe closes
    left = [p.name for p in temporary.iterdir() if p.name.startswith("xdiag-")]
    assert analysis.returncode == 143 and not left, (analysis.returncode, left)


def test_what_a_killed_analysis_left_is_swept_at_the_next_start(tmp_path):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    ended = subprocess.Popen(["true"])
    ended.wait()
    orphan = temporary / f"xdiag-hosts-pid{ended.pid}-abcd1234"  # a process killed outright (SIGKILL) left it
    alive = temporary / f"xdiag-hosts-pid{os.getpid()}-abcd1234"  # a running process's
    for folder in (orphan, alive):
        folder.mkdir()
        (folder / "host-00000.xdiag").write_bytes(b"x" * 1000)
    done = subprocess.run([sys.executable, "-m", "xdiag.cli", "analyze", str(_two_hosts(tmp_path)), "-q",
                           "--no-xprof-views", "--out", str(tmp_path / "out")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(temporary), "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "c")})
    assert done.returncode == 0, done.stderr
    assert not orphan.exists() and alive.exists()


def test_an_analysis_replaces_the_tool_outputs_an_earlier_one_left_in_its_out(tmp_path):
    """An earlier analysis's follow-up calls (`tools/followup-*.json`) are not left beside the next one's, where
    `xdiag diff` would read them as its own; a file of the user's own there stays."""
    h200 = Path(__file__).parent / "profiles" / "h200"
    out = tmp_path / "out"
    first = _xdiag("analyze", str(h200 / "input_bound.xplane.pb"), "-q", "--no-xprof-views", "--out", str(out),
                   cwd=tmp_path)
    assert first.returncode == 0 and any(p.name.startswith("followup-") for p in (out / "tools").iterdir())
    (out / "tools" / "notes.txt").write_text("mine")
    second = _xdiag("analyze", str(h200 / "healthy.xplane.pb"), "-q", "--no-xprof-views", "--out", str(out),
                    cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    left = sorted(p.name for p in (out / "tools").iterdir() if p.name.startswith("followup-"))
    assert not left, f"the first analysis's follow-ups are left beside the second's: {left}"
    assert (out / "tools" / "notes.txt").read_text() == "mine"


TOO_LONG = "a" * 300 + ".xplane.pb"  # a file name past NAME_MAX (255): the system refuses it, ENAMETOOLONG
PAST_PATH_MAX = "/".join(["b" * 200] * 25)  # 5,024 characters: past PATH_MAX (4,096)


@pytest.mark.parametrize("args, said", [
    (("tool", "get_kpi_metrics", TOO_LONG), f"xdiag: {TOO_LONG}: cannot be read (File name too long)"),
    (("lines", TOO_LONG), f"xdiag: {TOO_LONG}: cannot be read (File name too long)"),
    (("analyze", TOO_LONG, "-q", "--no-xprof-views"), f"xdiag: {TOO_LONG}: cannot be read (File name too long)"),
    (("lines", str(PROFILE), "--source-root", PAST_PATH_MAX), f"xdiag: --source-root {PAST_PATH_MAX}: not a folder"),
    (("analyze", str(PROFILE), "--source-root", PAST_PATH_MAX), f"xdiag: --source-root {PAST_PATH_MAX}: not a folder"),
    (("diff", str(PROFILE), str(PROFILE), "--out", TOO_LONG),
     f"xdiag: --out {TOO_LONG}: not a folder (File name too long); name a folder for diff.html and diff.json"),
])
def test_a_name_longer_than_the_system_takes_is_refused_in_one_line(tmp_path, args, said):
    # Before: OSError ENAMETOOLONG from Path.exists()/is_dir() (Python 3.11 raises it) ended each in a traceback.
    done = _xdiag(*(str(tmp_path / arg) if arg == TOO_LONG else arg for arg in args), cwd=tmp_path)
    assert _one_line(done) == said.replace(TOO_LONG, str(tmp_path / TOO_LONG)) and done.stdout == ""
    assert not (tmp_path / "xdiag-out").exists()  # refused before any work
