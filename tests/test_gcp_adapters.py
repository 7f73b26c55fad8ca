"""The Google Cloud adapters against the real emulators of the `local_stack` fixture."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from google.api_core.exceptions import DeadlineExceeded
from google.cloud import pubsub_v1

from xdiag.cloud.firestore import FirestoreStateStore
from xdiag.cloud.gcs import GcsBlobStore, storage_client
from xdiag.cloud.pubsub import PubSubBus
from xdiag.cloud.runtime import CloudConfig, firestore_client
from xdiag.model import ToolDone
from xdiag.pipeline.publish_once import PublishOnce
from xdiag.pipeline.topics import DEAD_LETTERS


def _state() -> FirestoreStateStore:
    return FirestoreStateStore(firestore_client(CloudConfig.from_env().project))


def _blobs(cache_dir, cache_bytes: int) -> GcsBlobStore:
    return GcsBlobStore(storage_client(CloudConfig.from_env().project), cache_dir, cache_bytes)


def test_create_if_absent_has_exactly_one_winner_among_concurrent_callers(local_stack):
    state, key = _state(), f"claim-{uuid.uuid4().hex[:8]}"
    with ThreadPoolExecutor(8) as pool:
        winners = list(pool.map(lambda i: state.create("claims", key, {"by": i}), range(8)))
    assert winners.count(True) == 1
    assert state.get("claims", key)["by"] == winners.index(True)


def test_create_many_creates_each_absent_document_and_leaves_the_others(local_stack):
    state, marker = _state(), uuid.uuid4().hex[:8]
    state.set("claims", f"{marker}-b", {"by": "earlier"})
    docs = [(f"{marker}-a", {"by": 1}), (f"{marker}-b", {"by": 2}), (f"{marker}-c", {"by": [[3]]}),
            (f"{marker}-a", {"by": 4})]
    assert state.create_many("claims", docs) == [True, False, True, False]  # a key given twice: its first creates it
    assert state.get_many([("claims", f"{marker}-{k}") for k in "abc"]) == [{"by": 1}, {"by": "earlier"}, {"by": [[3]]}]
    assert state.create_many("claims", docs[:3]) == [False, False, False]
    assert state.create_many("claims", []) == []
    def overlapping(i: int) -> list[bool]:
        return state.create_many("claims", [(f"{marker}-x{j}", {"by": i}) for j in range(i, i + 6)])

    with ThreadPoolExecutor(4) as pool:  # overlapping batches: each document has exactly one creator
        batches = list(pool.map(overlapping, range(4)))
    created = [f"{marker}-x{j}" for i, batch in enumerate(batches) for j, won in zip(range(i, i + 6), batch) if won]
    assert sorted(created) == sorted({f"{marker}-x{j}" for j in range(9)})


def test_documents_round_trip_with_nested_arrays_and_merge_updates(local_stack):
    state, key = _state(), uuid.uuid4().hex[:8]
    value = {"rows": [[1, 2.5, "a"], [], [[3]]], "n": None, "m": {"x": [1, [2]]}}
    state.set("docs", key, value)
    assert state.get("docs", key) == value
    state.update("docs", key, {"extra": True})
    assert state.get("docs", key) == {**value, "extra": True}
    assert (key, {**value, "extra": True}) in state.list("docs")
    assert state.get("docs", "absent") is None
    state.set(f"docs/{key}/tools", "t", {"n": 1})
    assert state.get_many([(f"docs/{key}/tools", "t"), ("docs", "absent"), ("docs", key)]) == [
        {"n": 1}, None, {**value, "extra": True}]  # in the order asked, whatever order the server answers in


def test_local_path_downloads_once_per_version_into_a_bounded_cache(local_stack, tmp_path, h200_profiles):
    bucket = f"gs://{CloudConfig.from_env().bucket}/adapters-{uuid.uuid4().hex[:8]}"
    sources = [h200_profiles[w] for w in ("healthy", "input_bound", "memory_bound")]
    limit = sources[0].stat().st_size + sources[1].stat().st_size  # room for two of the three
    blobs = _blobs(tmp_path / "cache", limit)
    uris = [blobs.put_file(source, f"{bucket}/{source.name}") for source in sources]
    first = blobs.local_path(uris[0])
    assert first.name == sources[0].name and first.read_bytes() == sources[0].read_bytes()
    assert blobs.local_path(uris[0]) == first  # cached: no second download
    for uri in uris[1:]:
        blobs.local_path(uri)
    cached = sorted(p.name for p in (tmp_path / "cache").rglob("*.xplane.pb"))
    assert sum(p.stat().st_size for p in (tmp_path / "cache").rglob("*.xplane.pb")) <= limit
    assert sources[2].name in cached and sources[0].name not in cached  # the least recently used went
    blobs.put(uris[2], b"a new version")
    assert blobs.local_path(uris[2]).read_bytes() == b"a new version"
    assert blobs.stat(uris[2]).size == len(b"a new version") and blobs.stat(f"{bucket}/none") is None
    assert sorted(info.uri for info in blobs.list(f"{bucket}/")) == sorted(uris)


def test_pubsub_bus_publishes_json_with_its_type_and_version(local_stack):
    """Published on a dead-letter topic, the message comes back through the dead_letter function as it was sent."""
    bus, marker = PubSubBus(CloudConfig.from_env().project), uuid.uuid4().hex[:8]
    message = ToolDone(analysis_id=f"bus-{marker}", tool="get_hosts")
    bus.publish("tool-results-dead-letter", message)
    state = _state()

    def recorded():
        return [doc for _, doc in state.list(DEAD_LETTERS) if marker in doc["data"]]

    deadline = time.monotonic() + 30
    while not recorded() and time.monotonic() < deadline:
        time.sleep(0.2)
    [letter] = recorded()
    assert ToolDone.model_validate_json(letter["data"]) == message
    assert letter["attributes"]["type"] == "ToolDone" and letter["attributes"]["version"] == "1"
    assert letter["source_topic"] == "tool-results"


def test_a_file_given_up_on_upload_is_the_cached_copy_of_the_version_written(local_stack, tmp_path, h200_profiles):
    """What collect does with the prepared session: no stage on this machine downloads it again."""
    bucket = f"gs://{CloudConfig.from_env().bucket}/adapters-{uuid.uuid4().hex[:8]}"
    blobs = _blobs(tmp_path / "cache", 2**30)
    given = tmp_path / "given.xplane.pb"
    given.write_bytes(h200_profiles["healthy"].read_bytes())
    uri = blobs.put_file(given, f"{bucket}/given.xplane.pb", cache_source=True)
    cached = blobs.local_path(uri, blobs.stat(uri).generation)
    assert cached.samefile(given) and cached.parent.parent == tmp_path / "cache"
    kept = blobs.put_file(h200_profiles["healthy"], f"{bucket}/kept.xplane.pb")  # the caller's own file: not linked
    downloaded = blobs.local_path(kept)
    assert not downloaded.samefile(h200_profiles["healthy"]) and downloaded.read_bytes() == given.read_bytes()


def test_publish_all_hands_over_each_message_once_however_often_it_is_repeated(local_stack):
    """A fan-out through PublishOnce over the real bus, repeated (a redelivered collect) and overlapping: a pull
    subscription of its own receives every message once, as it was sent."""

    project, marker = CloudConfig.from_env().project, uuid.uuid4().hex[:8]
    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic, subscription = publisher.topic_path(project, f"all-{marker}"), subscriber.subscription_path(project, f"all-{marker}")
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=subscription, topic=topic)
    bus = PublishOnce(PubSubBus(project), _state())
    messages = [ToolDone(analysis_id=f"all-{marker}", tool=t) for t in ("get_hosts", "get_step_trace", "get_kpi_metrics")]
    bus.publish_all(f"all-{marker}", [])  # a fan-out with nothing left to run (the sweeper's repair) is no error
    bus.publish_all(f"all-{marker}", messages[:2])
    bus.publish_all(f"all-{marker}", messages[:2])
    bus.publish_all(f"all-{marker}", messages[1:])

    received, deadline = [], time.monotonic() + 20
    while time.monotonic() < deadline:  # until 2 s after the third: a duplicate would arrive within them
        try:
            pulled = subscriber.pull(subscription=subscription, max_messages=10, timeout=2).received_messages
        except DeadlineExceeded:
            pulled = []
        received += [item.message for item in pulled]
        if pulled:
            subscriber.acknowledge(subscription=subscription, ack_ids=[item.ack_id for item in pulled])
        if len(received) >= 3:
            deadline = min(deadline, time.monotonic() + 2)
    assert sorted((ToolDone.model_validate_json(m.data) for m in received), key=lambda m: m.tool) == \
        sorted(messages, key=lambda m: m.tool)
    assert {m.attributes["type"] for m in received} == {"ToolDone"}
