"""The Bus over Google Cloud Pub/Sub (or its emulator, where PUBSUB_EMULATOR_HOST is set).

A message is its JSON on the wire, with its type and schema version as attributes. `publish` returns
once Pub/Sub has the message: a handler that returns has handed its next messages on, so acking its
own delivery cannot lose them. Each publish waits for its answer anyway, so the client's batching delay
(10 ms by default, paid on every message) is off; `publish_all` hands a fan-out over at once and waits once.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.types import BatchSettings

from xdiag.model import Message

PUBLISH_TIMEOUT_S = 60.0


class PubSubBus:
    def __init__(self, project: str, publisher: pubsub_v1.PublisherClient | None = None) -> None:
        self.project = project
        self._publisher = publisher or pubsub_v1.PublisherClient(batch_settings=BatchSettings(max_latency=0.0))

    def topic_path(self, topic: str) -> str:
        return self._publisher.topic_path(self.project, topic)

    def publish(self, topic: str, message: Message) -> None:
        self.publish_all(topic, [message])

    def publish_all(self, topic: str, messages: Sequence[Message]) -> None:
        futures = [
            self._publisher.publish(self.topic_path(topic), message.model_dump_json().encode(),
                                    type=type(message).__name__, version=str(message.version))
            for message in messages
        ]
        for future in futures:
            future.result(timeout=PUBLISH_TIMEOUT_S)

    def publish_raw(self, topic: str, data: bytes, attributes: dict[str, str] | None = None) -> str:
        """Publishes bytes as they are (a dead letter keeps the poison message's own bytes); returns the message id."""
        future = self._publisher.publish(self.topic_path(topic), data, **(attributes or {}))
        return future.result(timeout=PUBLISH_TIMEOUT_S)
