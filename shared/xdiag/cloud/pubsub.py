"""The Bus over Google Cloud Pub/Sub (or its emulator, where PUBSUB_EMULATOR_HOST is set).

A message is its JSON on the wire, with its type and schema version as attributes. `publish` returns
once Pub/Sub has the message: a handler that returns has handed its next messages on, so acking its
own delivery cannot lose them. Since each publish waits for its answer anyway, the bus calls the Publish
RPC itself (the generated client, `google.pubsub_v1`) rather than through the batching client of
`google.cloud.pubsub_v1`, whose hand-off to its batch thread cost 4 ms a message on the local stack;
`publish_all` sends a fan-out in one request.
"""

from __future__ import annotations

from collections.abc import Sequence

from google import pubsub_v1

from xdiag.model import Message

PUBLISH_TIMEOUT_S = 60.0
MAX_MESSAGES_PER_REQUEST = 1000  # Pub/Sub's limit per PublishRequest


class PubSubBus:
    def __init__(self, project: str, publisher: pubsub_v1.PublisherClient | None = None) -> None:
        self.project = project
        self._publisher = publisher or pubsub_v1.PublisherClient()

    def topic_path(self, topic: str) -> str:
        return self._publisher.topic_path(self.project, topic)

    def publish(self, topic: str, message: Message) -> None:
        self.publish_all(topic, [message])

    def publish_all(self, topic: str, messages: Sequence[Message]) -> None:
        wire = [pubsub_v1.PubsubMessage(data=message.model_dump_json().encode(),
                                        attributes={"type": type(message).__name__, "version": str(message.version)})
                for message in messages]
        for start in range(0, len(wire), MAX_MESSAGES_PER_REQUEST):
            self._send(topic, wire[start:start + MAX_MESSAGES_PER_REQUEST])

    def publish_raw(self, topic: str, data: bytes, attributes: dict[str, str] | None = None) -> str:
        """Publishes bytes as they are (a dead letter keeps the poison message's own bytes); returns the message id."""
        return self._send(topic, [pubsub_v1.PubsubMessage(data=data, attributes=attributes or {})])[0]

    def _send(self, topic: str, messages: list[pubsub_v1.PubsubMessage]) -> list[str]:
        if not messages:
            return []
        response = self._publisher.publish(topic=self.topic_path(topic), messages=messages, timeout=PUBLISH_TIMEOUT_S)
        return list(response.message_ids)
