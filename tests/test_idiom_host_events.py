"""The host events the idiom recognisers read: each event's name a code into the names its lines hold, so a test of
the names runs once per distinct name and costs a flag per event, not a copy of every name."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from xdiag.idioms import IDIOMS
from xdiag.idioms.host_structure import PYTHON_TRACER_EVENT
from xdiag.idioms.program import HostEvents, Program
from xdiag.profile.reader import read_session_in_process

PROFILE = Path(__file__).parent / "profiles" / "h200" / "host_sync.xplane.pb"


def _frames() -> HostEvents:
    return Program(read_session_in_process([PROFILE])).host_events(PYTHON_TRACER_EVENT)


def test_a_test_of_the_python_tracers_names_costs_a_flag_per_event_not_a_copy_of_every_name():
    frames = _frames()
    assert len(frames) > 20_000 and len(set(frames.names)) < 200  # many events, few names
    tested = []
    tracemalloc.start()
    try:
        picked = frames.named(lambda name: tested.append(name) or "host_sync" in name)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A fixed-width copy of every name (NumPy's str) took 4 bytes per character per event: ~230 bytes an event here
    assert peak < 8 * len(frames)
    assert len(tested) < 1_000  # each name once (per line that holds it), not each event
    assert picked.tolist() == ["host_sync" in name for name in frames.names]
    assert 0 < picked.sum() < len(frames)


def test_joined_events_keep_each_events_name():
    frames = _frames()
    first, second = frames.take(range(0, len(frames), 2)), frames.take(range(1, len(frames), 3))
    joined = HostEvents.joined([first, second])
    assert joined.names.tolist() == first.names.tolist() + second.names.tolist()
    assert joined.start_ps.tolist() == first.start_ps.tolist() + second.start_ps.tolist()
    assert joined.where(lambda name: "host_sync" in name).names.tolist() == [
        name for name in first.names.tolist() + second.names.tolist() if "host_sync" in name]


def test_the_read_and_transfer_recognisers_gather_the_python_frames_only_to_name_a_line():
    """Their reads are Python-tracer events of their own names: every frame of the capture (a million on the bench's
    CPU capture) is gathered only where a match needs the line that holds it."""
    program = Program(read_session_in_process([PROFILE]))
    assert float(program.step.get("steps") or 0) > 0  # both look at the steps' events
    assert IDIOMS["per_element_transfers"].recognise(program) == []
    assert IDIOMS["read_each_step"].recognise(program) == []
    assert PYTHON_TRACER_EVENT.pattern not in program.__dict__.get("host_events_read", {})
