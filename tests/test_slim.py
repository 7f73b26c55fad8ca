"""xdiag.profile.slim: the copy of a profile that XProf's converters get, without the Python tracer's events.

Its bytes are checked against protobuf itself: the real profile parsed, the Python events removed from the
message, serialised again; so is the copy holding the metadata plane alone, that XProf's HLO protos come from.
That XProf's views are the same on them is tests/test_xprof_views.py's part."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from xdiag.errors import ProfileError
from xdiag.profile import schema, wire
from xdiag.profile.slim import (
    HOST_THREADS_PLANE,
    METADATA_PLANE,
    PYTHON_EVENT_PREFIX,
    write_metadata_plane,
    write_without_python_events,
)

from tests.conftest import shared_profile

H200 = Path(__file__).resolve().parent / "profiles" / "h200"
RECOMPILATION = H200 / "recompilation.xplane.pb"  # 234,000 of its 295,000 host events are the Python tracer's


def _python_events_removed(data: bytes) -> tuple[bytes, int]:
    """The profile's XSpace without the Python events, serialised with map entries sorted by key; how many went."""
    space = schema.XSpace.FromString(data)
    removed = 0
    for plane in space.planes:
        if plane.name != HOST_THREADS_PLANE:
            continue
        python = {key for key, meta in plane.event_metadata.items() if meta.name.startswith(PYTHON_EVENT_PREFIX)}
        for line in plane.lines:
            kept = [event for event in line.events if event.metadata_id not in python]
            removed += len(line.events) - len(kept)
            del line.events[:]
            line.events.extend(kept)
    return space.SerializeToString(deterministic=True), removed


@pytest.mark.parametrize("profile", [RECOMPILATION, H200 / "host_sync.xplane.pb"], ids=lambda p: p.name)
def test_the_copy_is_the_profile_less_its_python_events_and_nothing_else(profile, tmp_path):
    target = tmp_path / profile.name
    left_out = write_without_python_events(profile, target)
    expected, removed = _python_events_removed(profile.read_bytes())
    assert left_out == removed > 1000
    # every field, unknown ones included, compared in one canonical order (the profiler writes maps unsorted)
    assert schema.XSpace.FromString(target.read_bytes()).SerializeToString(deterministic=True) == expected
    assert target.stat().st_size < profile.stat().st_size


def test_a_file_with_no_python_events_is_not_copied(tmp_path):
    """A profile captured without the Python tracer: nothing to leave out, so nothing is written (the caller links)."""
    stripped = tmp_path / "stripped.xplane.pb"
    stripped.write_bytes(_python_events_removed(RECOMPILATION.read_bytes())[0])
    assert not _python_events_removed(stripped.read_bytes())[1]
    target = tmp_path / "copy.xplane.pb"
    assert write_without_python_events(stripped, target) == 0
    assert not target.exists()


def test_a_file_it_cannot_walk_is_refused_and_leaves_no_copy(tmp_path):
    truncated = tmp_path / "truncated.xplane.pb"
    truncated.write_bytes(RECOMPILATION.read_bytes()[: RECOMPILATION.stat().st_size // 2])
    target = tmp_path / "copy.xplane.pb"
    with pytest.raises(ProfileError, match="truncated"):
        write_without_python_events(truncated, target)
    assert not target.exists()


def test_the_compiled_copy_refuses_a_buffer_too_small_instead_of_writing_past_it():
    """The copy's second pass writes into a buffer the first pass sized; a file changed in between must not make the
    compiled code write past it (no bounds checks there)."""
    data = np.frombuffer(RECOMPILATION.read_bytes(), np.uint8)
    host = next(p for p in schema.XSpace.FromString(data.tobytes()).planes if p.name == HOST_THREADS_PLANE)
    flags = np.zeros(max(host.event_metadata) + 1, np.uint8)
    flags[[k for k, meta in host.event_metadata.items() if meta.name.startswith(PYTHON_EVENT_PREFIX)]] = 1
    line = max(host.lines, key=lambda line: len(line.events)).SerializeToString()
    line_bytes = np.frombuffer(line, np.uint8)
    kept, dropped, err, _ = wire.line_without_events(line_bytes, 0, len(line), flags, np.empty(0, np.uint8))
    assert err == wire.OK and dropped > 1000 and 0 < kept < len(line)
    exact = np.zeros(kept, np.uint8)
    assert wire.line_without_events(line_bytes, 0, len(line), flags, exact)[::2] == (kept, wire.OK)
    assert len(schema.XLine.FromString(exact.tobytes()).events) == len(schema.XLine.FromString(line).events) - dropped
    short = np.zeros(kept - 1, np.uint8)
    assert wire.line_without_events(line_bytes, 0, len(line), flags, short)[2] == wire.ERR_LENGTH


@pytest.mark.parametrize("profile", ["h200/recompilation", "tpu/tpu_v6e_inference"])
def test_the_metadata_copy_is_the_profile_with_its_metadata_plane_alone(profile, tmp_path):
    """The TPU profile has it after its device planes, the H200 one first."""
    profile = RECOMPILATION if profile.startswith("h200/") else shared_profile(f"{profile}.xplane.pb")
    target = tmp_path / profile.name
    assert write_metadata_plane(profile, target)
    space = schema.XSpace.FromString(profile.read_bytes())
    modules = sum(len(m.stats) for p in space.planes if p.name == METADATA_PLANE for m in p.event_metadata.values())
    kept = [p for p in space.planes if p.name == METADATA_PLANE]
    del space.planes[:]
    space.planes.extend(kept)
    copy = schema.XSpace.FromString(target.read_bytes())
    assert copy.SerializeToString(deterministic=True) == space.SerializeToString(deterministic=True)
    assert [p.name for p in copy.planes] == [METADATA_PLANE] and modules > 0
    assert target.stat().st_size < profile.stat().st_size / 10


def test_a_file_without_a_metadata_plane_gets_no_metadata_copy(tmp_path):
    """TensorFlow's V100 profile: no XLA, no HLO modules, no metadata plane."""
    v100 = shared_profile("gpu/v100x8_tf_bert_worker.xplane.pb")
    target = tmp_path / "copy.xplane.pb"
    assert not write_metadata_plane(v100, target) and not target.exists()
    truncated = tmp_path / "truncated.xplane.pb"
    truncated.write_bytes(RECOMPILATION.read_bytes()[: RECOMPILATION.stat().st_size // 2])
    with pytest.raises(ProfileError, match="truncated"):
        write_metadata_plane(truncated, target)
    assert not target.exists()
