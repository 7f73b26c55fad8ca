"""The read `xdiag analyze` begins before its imports (xdiag.profile.session.ReadAhead): the loader of exactly that
file version takes its session, any other load reads for itself, a failed read fails the load as the loader's own
read would, and a read nobody takes is released. Real TPU v5e and hostile profiles from tests/profiles."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from xdiag.cloud.memory import LocalBlobStore
from xdiag.errors import ProfileError
from xdiag.pipeline.deps import SessionLoader
from xdiag.profile.session import ReadAhead

PROFILES = Path(__file__).parent / "profiles"
TPU = PROFILES / "tpu_v5e" / "conv_net_train.xplane.pb"
CORRUPT = PROFILES / "hostile" / "event_length_minus_1.xplane.pb"


def _copy(source: Path, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(source, folder / source.name))


def _loader_with(read: ReadAhead) -> tuple[SessionLoader, list]:
    blobs = LocalBlobStore()
    loader = SessionLoader(blobs)
    loader.take_read(read)
    return loader, [blobs.stat(str(read.path))]


def test_the_load_of_the_file_read_ahead_takes_its_session(tmp_path):
    path = _copy(TPU, tmp_path)
    read = ReadAhead(path, "s")
    loader, inputs = _loader_with(read)
    try:
        session = loader.load(inputs, "s")
        assert session is read.take()
        assert session.name == "s" and session.platform == "TPU" and session.event_count > 0
        assert loader.read_ms[tuple(inputs)] >= read.read_ms > 0  # the read's own time, not the wait for it
    finally:
        loader.close()


def test_another_version_of_the_file_or_another_name_is_read_afresh(tmp_path):
    path = _copy(TPU, tmp_path)
    read = ReadAhead(path, "s")
    early = read.take()  # the read is done before the file changes
    later = path.stat().st_mtime_ns + 10**9
    os.utime(path, ns=(later, later))  # the same bytes, but a later version of the file
    loader, inputs = _loader_with(read)
    try:
        session = loader.load(inputs, "s")
        assert session is not early and session.event_count == early.event_count
    finally:
        loader.close()

    named_otherwise = ReadAhead(path, "s")
    loader, inputs = _loader_with(named_otherwise)
    try:
        assert loader.load(inputs, "another").name == "another"
    finally:
        loader.close()
    with pytest.raises(RuntimeError, match="was closed"):  # not taken: released by the load that read afresh
        named_otherwise.take()


def test_a_read_that_failed_fails_the_load_with_the_reason_the_loaders_own_read_gives(tmp_path):
    path = _copy(CORRUPT, tmp_path)
    blobs = LocalBlobStore()
    with pytest.raises(ProfileError) as own:
        SessionLoader(blobs).load([blobs.stat(str(path))], "s")
    loader, inputs = _loader_with(ReadAhead(path, "s"))
    try:
        with pytest.raises(ProfileError) as ahead:
            loader.load(inputs, "s")
    finally:
        loader.close()
    assert str(ahead.value) == str(own.value) and "event_length_minus_1" in str(own.value)


def test_a_read_nobody_takes_is_released_and_a_second_hand_over_replaces_the_first(tmp_path):
    path = _copy(TPU, tmp_path)
    first, second = ReadAhead(path, "s"), ReadAhead(path, "s")
    loader, inputs = _loader_with(first)
    loader.take_read(second)
    try:
        assert loader.load(inputs, "s") is second.take()
        with pytest.raises(RuntimeError, match="was closed"):  # when the second replaced it: its session released
            first.take()
    finally:
        loader.close()
    unused = ReadAhead(path, "s")
    SessionLoader(LocalBlobStore()).take_read(unused)
    unused.close()
    with pytest.raises(RuntimeError, match="was closed"):
        unused.take()
