"""xdiag.profile.slim: the copy of a profile that XProf's converters get, without the Python tracer's events.

Its bytes are checked against protobuf itself: the real profile parsed, the Python events removed from the
message, serialised again. That XProf's views are the same on it is tests/test_xprof_views.py's part."""

from __future__ import annotations

from pathlib import Path

import pytest
from xdiag.errors import ProfileError
from xdiag.profile import schema
from xdiag.profile.slim import HOST_THREADS_PLANE, PYTHON_EVENT_PREFIX, write_without_python_events

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
