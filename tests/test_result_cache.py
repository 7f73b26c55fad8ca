"""The local result cache serves nothing it did not verify: answers and decoded sessions carry their digests, a file
rewritten in place is another version, entries are private to their user, and interrupted stores are cleaned."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from xdiag.agent.result_cache import SESSION_DIGEST, SESSION_FILE, ResultCache, UnusableCache, answer_tool
from xdiag.disk_cache import SIZES, STALE_PART_SECONDS, evict_least_recent

H200 = Path(__file__).parent / "profiles" / "h200"


@pytest.fixture
def profile(tmp_path) -> Path:
    copy = tmp_path / "memory_bound.xplane.pb"
    shutil.copyfile(H200 / "memory_bound.xplane.pb", copy)
    return copy


def _answer(cache: ResultCache, profile: Path, tool: str = "get_kpi_metrics") -> dict:
    text, status = answer_tool([profile], "memory_bound", tool, {}, cache, 2**30)
    assert status == "ok"
    return json.loads(text)


def test_entries_are_private_to_their_user(tmp_path, profile):
    cache = ResultCache(tmp_path / "cache")
    _answer(cache, profile)
    entry = cache.entry([profile])
    settled = time.time() - 60  # an entry's size is recorded once it has settled (disk_cache.SETTLE_SECONDS)
    for folder in (entry / "answers", entry):
        os.utime(folder, (settled, settled))
    cache.trim(keep=tmp_path / "none")
    folders = [tmp_path / "cache", entry, entry / "answers", tmp_path / "cache" / SIZES]
    files = [entry / SESSION_FILE, entry / SESSION_DIGEST, *(entry / "answers").iterdir(),
             *(tmp_path / "cache" / SIZES).iterdir()]
    assert {stat.S_IMODE(f.stat().st_mode) for f in folders} == {0o700}
    assert {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o600}


def test_a_cache_folder_others_may_write_is_made_private(tmp_path, profile):
    (tmp_path / "cache").mkdir(mode=0o777)
    os.chmod(tmp_path / "cache", 0o777)
    _answer(ResultCache(tmp_path / "cache"), profile)
    assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o700


def test_a_cache_folder_of_another_user_or_a_link_is_refused_and_the_tool_answers(tmp_path, profile):
    if os.geteuid() == 0:
        foreign = tmp_path / "foreign"
        foreign.mkdir()
        os.chown(foreign, 65534, 65534)
    else:
        foreign = Path("/")  # root's
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    for root in (foreign, link):
        cache = ResultCache(root)
        with pytest.raises(UnusableCache):
            cache._private_entry(cache.entry([profile]))
        assert _answer(cache, profile)["status"] == "ok"
        assert cache.answer([profile], "get_kpi_metrics", {}) is None
    assert list((tmp_path / "elsewhere").iterdir()) == []
    if os.geteuid() == 0:
        assert list(foreign.iterdir()) == []


def test_a_truncated_or_emptied_answer_is_answered_afresh(tmp_path, profile):
    cache = ResultCache(tmp_path / "cache")
    first = _answer(cache, profile)
    (kept,) = (cache.entry([profile]) / "answers").iterdir()
    for damage in (kept.read_bytes()[:-40], b""):
        kept.write_bytes(damage)
        assert cache.answer([profile], "get_kpi_metrics", {}) is None and not kept.exists()
        assert _answer(cache, profile)["summary"] == first["summary"]


def test_a_flipped_or_altered_session_is_decoded_again(tmp_path, profile):
    cache = ResultCache(tmp_path / "cache")
    first = _answer(cache, profile, "get_hlo_op_profile")
    stored = cache.entry([profile]) / SESSION_FILE
    data = bytearray(stored.read_bytes())
    for at in range(len(data) // 2, len(data) // 2 + 2000):  # 2,000 flipped bytes in its columns
        data[at] ^= 0xFF
    stored.write_bytes(bytes(data))
    for answers in (cache.entry([profile]) / "answers").iterdir():
        answers.unlink()
    again = _answer(cache, profile, "get_hlo_op_profile")
    assert again["summary"] == first["summary"]
    assert (cache.entry([profile]) / SESSION_DIGEST).read_text().strip() != ""
    assert stored.read_bytes() != bytes(data)  # stored afresh


def test_a_file_rewritten_in_place_with_the_same_size_and_mtime_is_another_version(tmp_path, profile):
    cache = ResultCache(tmp_path / "cache")
    before = cache.entry([profile])
    info = profile.stat()
    data = bytearray(profile.read_bytes())
    data[len(data) // 3] ^= 0x01
    with profile.open("r+b") as handle:  # in place: the same inode and size
        handle.write(bytes(data))
    os.utime(profile, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert profile.stat().st_size == info.st_size and profile.stat().st_mtime_ns == info.st_mtime_ns
    assert cache.entry([profile]) != before
    replacement = tmp_path / "replacement"
    replacement.write_bytes(bytes(data))
    os.utime(replacement, ns=(info.st_atime_ns, info.st_mtime_ns))
    middle = cache.entry([profile])
    replacement.replace(profile)  # replaced by a rename: another inode, the same bytes, size and mtime
    assert cache.entry([profile]) != middle


def test_files_left_by_interrupted_stores_are_counted_and_cleaned(tmp_path, profile):
    cache = ResultCache(tmp_path / "cache", limit_bytes=2**30)
    _answer(cache, profile)
    entry = cache.entry([profile])
    left = entry / ".session.xdiag.abc123.part"
    left.write_bytes(b"\0" * 4096)
    fresh = entry / ".session.xdiag.def456.part"  # a store in flight in another process
    fresh.write_bytes(b"\0" * 4096)
    old = time.time() - STALE_PART_SECONDS - 60
    os.utime(left, (old, old))
    kept_bytes = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file() and f != left)
    tight = ResultCache(tmp_path / "cache", limit_bytes=kept_bytes - 1)  # only the file in flight is over it
    tight._trim(keep=tmp_path / "none")
    assert tight.interrupted_stores_cleaned == 1 and not left.exists()
    assert fresh.exists() and not (entry / SESSION_FILE).exists()  # the entry went: the file in flight counted


def test_an_analysis_keeps_its_answers_and_trims_the_cache_once(tmp_path, profile, monkeypatch):
    """`keep_analysis_answers` stores every answer an analysis wrote and then trims once: the least recently used
    entry goes past the limit, the one just made never (a walk of the cache folder per answer took 0.6 s of
    `xdiag analyze` on a full cache)."""
    from xdiag.agent import result_cache

    older = [H200 / "healthy.xplane.pb"]
    roomy = ResultCache(tmp_path / "cache", limit_bytes=2**30)
    answer_tool(older, "healthy", "get_kpi_metrics", {}, roomy, 2**30)
    older_bytes = sum(f.stat().st_size for f in roomy.entry(older).rglob("*") if f.is_file())
    out = tmp_path / "out"
    (out / "tools").mkdir(parents=True)
    tools = ("get_kpi_metrics", "get_step_trace", "get_hosts")
    for tool in tools:
        (out / "tools" / f"{tool}.json").write_text(json.dumps({"tool": tool, "args": {}, "status": "ok"}) + "\n")
    (out / "tools" / "failed.json").write_text(json.dumps({"tool": "get_hosts", "args": {"x": 1}, "status": "failed"}))
    walks = []

    def counted(*args, **kwargs):
        walks.append(args)
        return evict_least_recent(*args, **kwargs)

    monkeypatch.setattr(result_cache, "evict_least_recent", counted)
    tight = ResultCache(tmp_path / "cache", limit_bytes=older_bytes)  # the new answers put it past the limit
    assert result_cache.keep_analysis_answers(tight, [profile], out) == 3
    assert len(walks) == 1
    assert not tight.entry(older).exists()  # the least recently used went
    for tool in tools:  # the one just made stays, every answer in it
        assert json.loads(tight.answer([profile], tool, {}))["tool"] == tool
    assert tight.answer([profile], "get_hosts", {"x": 1}) is None


def test_eviction_counts_every_file_at_any_depth_and_no_folder_behind_a_link(tmp_path):
    """The eviction's walk (one scandir per folder) finds what `Path.rglob` finds: files at any depth, a link to a
    file as a file, nothing through a link to a folder."""
    from xdiag.disk_cache import _files_under

    entry = tmp_path / "entry"
    (entry / "xprof-views" / "deep").mkdir(parents=True)
    (entry / "answers").mkdir()
    for name in ("session.xdiag", "answers/a.json", "xprof-views/deep/v.pb", ".x.part", "xprof-views/.y.part"):
        (entry / name).write_bytes(b"\0" * 10)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "o.pb").write_bytes(b"\0")
    (entry / "to-folder").symlink_to(outside, target_is_directory=True)
    (entry / "to-file").symlink_to(entry / "session.xdiag")
    found = {(name, Path(path), info.st_size) for name, path, info in _files_under(entry)}
    expected = {(f.name, f, f.lstat().st_size) for f in entry.rglob("*") if f.is_file()}
    assert found == expected and len(found) == 6


def _entry(root: Path, name: str, size: int, age_s: float) -> Path:
    entry = root / name
    (entry / "answers").mkdir(parents=True)
    (entry / "answers" / "a.json").write_bytes(b"\0" * size)
    used = time.time() - age_s
    for folder in (entry / "answers", entry):
        os.utime(folder, (used, used))
    return entry


def test_eviction_reads_each_entrys_recorded_size_and_walks_only_what_changed(tmp_path, monkeypatch):
    """An entry's bytes are recorded when it is walked (disk_cache.SIZES): the next eviction walks the entry just made
    and none of the others (stat'ing every file of 858 entries cost 49-54 ms a trim). A file another process
    put in an entry's folder after its record (XProf's views, converted in the background) is counted: that entry is
    walked again, and the least recently used goes for it."""
    from xdiag import disk_cache

    root = tmp_path / "cache"
    entries = [_entry(root, f"e{i}", 1000, age_s=100 - i) for i in range(5)]
    assert evict_least_recent(root, 7500) == 0 and all(e.exists() for e in entries)
    assert sorted(os.listdir(root / SIZES)) == [e.name for e in entries]
    walked = []
    walk = disk_cache._files_under

    def counted(folder):
        walked.append(Path(folder).name)
        return walk(folder)

    monkeypatch.setattr(disk_cache, "_files_under", counted)
    evict_least_recent(root, 7500, keep=entries[4])
    assert [name for name in walked if name.startswith("e")] == ["e4"]
    walked.clear()
    (entries[0] / "answers" / "b.json").write_bytes(b"\0" * 3000)  # the least recently used entry grows past the limit
    evict_least_recent(root, 7500, keep=entries[4])
    assert {name for name in walked if name.startswith("e")} == {"e0", "e4"}  # e0 then to remove its files
    assert not entries[0].exists() and all(e.exists() for e in entries[1:])
    assert sorted(os.listdir(root / SIZES)) == [e.name for e in entries[1:]]  # its record went with it


LIMIT = 1_000_000


def _store_and_trim(root: str, seed: int) -> None:
    """One process of the test below: answers into 20 entries of one cache for 1.5 s, then into 20 others for 2.5 s
    (the first 20 settle meanwhile), each store trimming the cache."""
    import random

    cache, draw = ResultCache(Path(root), limit_bytes=LIMIT), random.Random(seed)
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < 4:
        entry = Path(root) / f"e{draw.randrange(20) + (20 if elapsed > 1.5 else 0)}"
        cache.store_answer([], f"tool{draw.randrange(8)}", {}, "x" * draw.randrange(1000, 8000), entry=entry)
        time.sleep(draw.uniform(0, 0.01))
    assert not cache._said_unwritable  # an entry evicted under a store is made again, not called unwritable


def test_processes_storing_and_trimming_at_once_keep_the_limit_and_true_records(tmp_path):
    """Four processes store answers into the same entries and each trims after every store, evicting entries the
    others are listing, recording or writing into, while the entries left alone settle and get their records: no
    store calls the cache unwritable, the cache ends within its limit, and every record left holds its entry's bytes
    as a walk counts them, none of an entry gone."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from xdiag.disk_cache import _files_under

    root = tmp_path / "cache"
    with ProcessPoolExecutor(4, mp_context=multiprocessing.get_context("spawn")) as pool:  # no fork of JAX's threads
        list(pool.map(_store_and_trim, [str(root)] * 4, range(4)))
    ResultCache(root, limit_bytes=LIMIT).trim(keep=root / "none")  # reads the records still trusted
    actual = {e.name: sum(info.st_size for _, _, info in _files_under(e)) for e in root.iterdir() if e.name != SIZES}
    recorded = {r.name: int(r.read_text().split()[0]) for r in (root / SIZES).iterdir()}
    assert actual and recorded and {name: actual.get(name) for name in recorded} == recorded
    assert sum(actual.values()) <= LIMIT


@contextlib.contextmanager
def _read_only(folder: Path):
    """`folder` made read-only for this user while the block runs: its mode where we are not root, else the immutable
    attribute (root writes through any mode)."""
    if os.geteuid() != 0:
        os.chmod(folder, 0o500)
        try:
            yield
        finally:
            os.chmod(folder, 0o700)
        return
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("root cannot make a folder read-only here (chattr +i refused)")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


@pytest.mark.parametrize("damaged", ["answer", "session"])
def test_a_corrupt_entry_in_a_read_only_cache_is_answered_afresh_without_a_traceback(tmp_path, profile, damaged):
    # Before: the corrupt file's unlink sat outside the error handling: PermissionError out of answer_tool.
    cache = ResultCache(tmp_path / "cache")
    first = _answer(cache, profile)
    entry = cache.entry([profile])
    (kept,) = (entry / "answers").iterdir()
    if damaged == "session":
        kept.unlink()  # the session is read only where no answer is kept
    corrupt = kept if damaged == "answer" else entry / SESSION_FILE
    corrupt.write_bytes(corrupt.read_bytes()[:-40])
    with _read_only(entry / "answers"), _read_only(entry):
        assert cache.answer([profile], "get_kpi_metrics", {}) is None
        assert _answer(cache, profile)["summary"] == first["summary"]  # computed afresh
    assert corrupt.exists()  # left where it could not be removed, and never served


def test_a_profile_xprof_cannot_read_has_no_smart_suggestions_and_that_answer_is_kept(tmp_path):
    # Before: get_smart_suggestions failed on the repo's own non-UTF-8 profile (XProf's parser refuses it), and as a
    # failure it was never kept: every call converted again to fail again.
    profile = tmp_path / "event_name_not_utf8.xplane.pb"
    shutil.copyfile(Path(__file__).parent / "profiles" / "hostile" / profile.name, profile)
    cache = ResultCache(tmp_path / "cache")
    text, status = answer_tool([profile], "hostile", "get_smart_suggestions", {}, cache, 2**30)
    assert status == "not_available", text
    assert "XProf cannot read the profile" in json.loads(text)["reason"]
    assert cache.answer([profile], "get_smart_suggestions", {}) == text


def test_a_source_file_rewritten_with_the_same_size_and_mtime_is_another_code_version(tmp_path):
    """The cache keys every answer by the versions of xdiag's source files (`code_digest`: path, size, mtime, ctime,
    inode, not their bytes): a file rewritten in place, its size and mtime as they were, is another version; an
    untouched tree is the same version in every process."""
    import xdiag

    copy = tmp_path / "xdiag"
    shutil.copytree(Path(xdiag.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__", "*.so"))

    def digest() -> str:
        return subprocess.run([sys.executable, "-c", "from xdiag.agent.result_cache import code_digest; "
                               "print(code_digest())"], capture_output=True, text=True, check=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(tmp_path)}).stdout.strip()

    before = digest()
    assert before == digest()
    source = copy / "tools" / "__init__.py"
    info = source.stat()
    text = source.read_text()
    source.write_text(text.replace("a", "b", 1))
    os.utime(source, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert source.stat().st_size == info.st_size and source.stat().st_mtime_ns == info.st_mtime_ns
    assert digest() != before


@pytest.mark.parametrize("limit", ["abc", "²", "nan", "1e999", "-1"])
def test_a_cache_limit_that_is_no_number_is_said_in_one_line_and_the_default_kept(monkeypatch, capsys, limit):
    # Before: ValueError or OverflowError from float()/int() in from_env, a traceback from every tool.
    monkeypatch.setenv("XDIAG_LOCAL_CACHE_GIB", limit)
    assert ResultCache.from_env().limit_bytes == 2 * 2**30
    said = capsys.readouterr().err
    assert said == f"xdiag: XDIAG_LOCAL_CACHE_GIB takes a number of GiB such as 2 (got {limit!r}); using the " \
                   "default, 2 GiB\n"
    monkeypatch.setenv("XDIAG_LOCAL_CACHE_GIB", "0.5")
    assert ResultCache.from_env().limit_bytes == 2**29


def test_a_tool_answers_with_a_cache_limit_that_is_no_number(tmp_path, profile):
    env = {**os.environ, "XDIAG_LOCAL_CACHE_DIR": str(tmp_path / "cache"), "XDIAG_LOCAL_CACHE_GIB": "²"}
    done = subprocess.run([sys.executable, "-m", "xdiag.cli", "tool", "get_kpi_metrics", str(profile)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and json.loads(done.stdout), done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "xdiag: XDIAG_LOCAL_CACHE_GIB takes a number of GiB such as 2 (got '²'); using the default, 2 GiB"]
