"""The pipeline's map stage (issue 37): a many-host session's files decoded one per `map_host` delivery, their
prepared columns stored keyed by each file's version, and collect assembling them (the reduce) into the session the
tools read. On the in-process bus over a bucket folder (the stages as the cloud runs them, `prepare` on), with real
two-process JAX captures grown to more hosts by copying their real host files (tests/test_hosts_map.py's `_pod`).
The local stack's run of the same path is tests/test_local_stack.py's 16-host test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from xdiag.cloud.embedded import analyze_session
from xdiag.cloud.memory import InProcessBus, LocalBlobStore, MemoryStateStore
from xdiag.handlers import HANDLERS
from xdiag.model import CaptureReady, HostMapRun, SweepRequest
from xdiag.pipeline.deps import Dependencies, SessionLoader
from xdiag.pipeline.layout import prepared_host_uri
from xdiag.pipeline.publish_once import PublishOnce
from xdiag.pipeline.stages.map_host import map_host
from xdiag.pipeline.sweep import sweep
from xdiag.pipeline.topics import ANALYSES, TOPIC_CAPTURES, TOPIC_HOST_MAPS, host_maps_collection
from xdiag.profile.locate import locate_session

from tests.test_hosts_map import _pod

RUN, SESSION = "pod-run", "pod-session"


class Pipeline:
    """The stages on the in-process bus, `map_hosts_from` hosts and more mapped host by host."""

    def __init__(self, buckets: Path, **settings) -> None:
        self.bus, self.blobs, self.state = InProcessBus(), LocalBlobStore(buckets), MemoryStateStore()
        self.events: list[tuple[str, dict]] = []
        self.deps = Dependencies(
            bus=PublishOnce(self.bus, self.state), blobs=self.blobs, state=self.state,  # as the cloud publishes
            sessions=SessionLoader(self.blobs, prepare=True, map_hosts_from=settings.pop("map_hosts_from", 2)),
            profile_root="gs://bucket", on_event=lambda stage, info: self.events.append((stage, info)), **settings)
        for topic, (_, handler) in HANDLERS.items():
            self.bus.subscribe(topic, lambda message, handler=handler: handler(message, self.deps))

    @property
    def folder(self) -> Path:
        return self.blobs.buckets / "bucket" / RUN / "plugins" / "profile" / SESSION

    def announce(self, attempt: int = 0) -> dict:
        """A manual request for the session's files as they are now; the analysis it ends with."""
        self.bus.publish(TOPIC_CAPTURES, CaptureReady(run_id=RUN, session_id=SESSION, attempt=attempt))
        self.bus.drain()
        return self.latest()

    def latest(self) -> dict:
        return max((doc for _, doc in self.state.list(ANALYSES)), key=lambda doc: doc["updated_at"])

    def maps(self, analysis: dict) -> dict[str, dict]:
        return {doc["host"]: doc for _, doc in self.state.list(host_maps_collection(analysis["analysis_id"]))}

    def decoded(self) -> list[str]:
        """The hosts a map_host delivery decoded (not those it found mapped already)."""
        return [info["host"] for stage, info in self.events if stage == "map_host"]


def _findings(diagnosis: dict) -> list[tuple]:
    return [(f["key"], f["priority"], f["title"], f["whats_happening"]) for f in diagnosis["findings"]]


@pytest.fixture
def pod(lockstep, tmp_path) -> Pipeline:
    """Six hosts of the straggler_compute job (its straggler once) in a bucket folder."""
    pipeline = Pipeline(tmp_path / "buckets")
    pipeline.folder.parent.mkdir(parents=True)
    _pod(pipeline.folder, lockstep["straggler_compute"], 6)
    return pipeline


def test_each_host_is_mapped_once_and_the_reduce_gives_the_embedded_findings(pod, tmp_path):
    analysis = pod.announce()
    assert analysis["status"] == "DONE", analysis.get("failure_reason")
    files = sorted(p.name for p in pod.folder.glob("*.xplane.pb"))
    maps = pod.maps(analysis)
    assert sorted(maps) == files and len(files) == 6
    assert all(doc["status"] == "DONE" and doc["prepared_bytes"] > 0 and not doc.get("reused") for doc in maps.values())
    assert sorted(pod.decoded()) == files  # one decode per host file, each in its own delivery
    host_maps = [m for topic, m in pod.bus.delivered if topic == TOPIC_HOST_MAPS]
    assert len(host_maps) == 6 and all(isinstance(m, HostMapRun) for m in host_maps)
    reduces = [m for topic, m in pod.bus.delivered if topic == TOPIC_CAPTURES and m.hosts_mapped]
    assert len(reduces) == 1  # the fan-in announces the session once
    for info in (pod.blobs.stat(f"gs://bucket/{RUN}/plugins/profile/{SESSION}/{name}") for name in files):
        assert pod.blobs.exists(prepared_host_uri(analysis["output_uri"], info))

    embedded = analyze_session(locate_session(pod.folder), tmp_path / "embedded")
    assert _findings(analysis["diagnosis"]) == _findings(embedded.diagnosis.model_dump(mode="json"))
    assert analysis["profile"]["hosts"] == embedded.profile["hosts"]
    straggler = next(f for f in analysis["diagnosis"]["findings"] if f["key"] == "straggler_host")
    assert "process1" in straggler["title"] + straggler["whats_happening"]


def test_a_late_host_maps_only_itself(pod, lockstep):
    first = pod.announce()
    late = next(p for p in sorted(lockstep["straggler_compute"].glob("*.xplane.pb")) if "process0" in p.name)
    shutil.copyfile(late, pod.folder / "late_host.xplane.pb")
    pod.events.clear()
    second = pod.announce()
    assert second["analysis_id"] != first["analysis_id"] and second["status"] == "DONE"
    assert pod.decoded() == ["late_host.xplane.pb"]  # the six it had are this version's prepared files already
    maps = pod.maps(second)
    assert len(maps) == 7 and sum(bool(doc.get("reused")) for doc in maps.values()) == 6
    assert len(second["profile"]["hosts"]) == 7


def test_a_host_that_cannot_be_read_fails_the_analysis_naming_it_and_every_file_stays(pod):
    broken = sorted(pod.folder.glob("*.xplane.pb"))[2]
    broken.write_bytes(broken.read_bytes()[: broken.stat().st_size // 3])
    before = {p.name: p.read_bytes() for p in pod.folder.glob("*.xplane.pb")}
    analysis = pod.announce()
    assert analysis["status"] == "FAILED"
    assert broken.name in analysis["failure_reason"] and "truncated" in analysis["failure_reason"].lower()
    maps = pod.maps(analysis)
    assert maps[broken.name]["status"] == "FAILED" and maps[broken.name]["reason"] == analysis["failure_reason"]
    assert sum(doc["status"] == "DONE" for doc in maps.values()) == 5  # the others were mapped, and stay
    assert {p.name: p.read_bytes() for p in pod.folder.glob("*.xplane.pb")} == before
    assert pod.blobs.exists(analysis["output_uri"] + "/summary.html")


@pytest.mark.parametrize("limit, reason", [
    ({"max_hosts": 4}, "the session has 6 host files, over the limit of 4 hosts per session"),
    ({"max_host_file_bytes": 1000}, "over the limit of 1000 bytes per host file"),
])
def test_a_session_over_a_limit_fails_at_once_with_the_reason(lockstep, tmp_path, limit, reason):
    pipeline = Pipeline(tmp_path / "buckets", **limit)
    pipeline.folder.parent.mkdir(parents=True)
    _pod(pipeline.folder, lockstep["straggler_compute"], 6)
    analysis = pipeline.announce()
    assert analysis["status"] == "FAILED" and reason in analysis["failure_reason"]
    assert pipeline.decoded() == [] and not [m for t, m in pipeline.bus.delivered if t == TOPIC_HOST_MAPS]


def test_a_map_delivered_twice_decodes_once_and_a_lost_one_is_published_again_by_the_sweeper(pod):
    lost: list[HostMapRun] = []
    publish = pod.bus.publish

    def lose_the_first_map(topic, message):  # claimed as published, never delivered (Pub/Sub lost it)
        if topic == TOPIC_HOST_MAPS and not lost:
            lost.append(message)
            return
        publish(topic, message)

    pod.bus.publish = lose_the_first_map
    stuck = pod.announce()
    pod.bus.publish = publish
    assert stuck["status"] == "MAPPING_HOSTS" and len(pod.maps(stuck)) == 5

    ran = next(m for topic, m in pod.bus.delivered if topic == TOPIC_HOST_MAPS)
    map_host(ran, pod.deps)  # a second delivery of a map that ran decodes nothing again
    assert pod.announce()["status"] == "MAPPING_HOSTS"  # nor does a second delivery of the announcement
    assert len(pod.decoded()) == 5

    pod.deps.stage_deadline_s = 0.0  # overdue at once: the sweeper repairs it
    sweep(SweepRequest(), pod.deps)
    pod.bus.drain()
    done = pod.latest()
    assert done["status"] == "DONE", done.get("failure_reason")
    assert done["repairs"] == 1
    assert done["last_repair"]["missing"] == f"1 host file(s) never mapped: {lost[0].uri.rsplit('/', 1)[-1]}"
    assert sorted(pod.decoded()) == sorted(pod.maps(done))  # each host decoded exactly once


def test_a_session_read_whole_has_only_the_session_limit(lockstep, tmp_path):
    """The per-host limits are the map stage's (what one invocation decodes): where hosts are not mapped (`xdiag
    analyze`, or XDIAG_MAP_HOSTS_FROM=0) a file over them is read, as before."""
    pipeline = Pipeline(tmp_path / "buckets", map_hosts_from=0, max_hosts=1, max_host_file_bytes=1000)
    pipeline.folder.parent.mkdir(parents=True)
    _pod(pipeline.folder, lockstep["straggler_compute"], 2)
    analysis = pipeline.announce()
    assert analysis["status"] == "DONE", analysis.get("failure_reason")
    assert pipeline.decoded() == [] and len(analysis["profile"]["hosts"]) == 2
