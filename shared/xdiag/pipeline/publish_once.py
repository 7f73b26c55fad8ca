"""A Bus that publishes each message once: the duplicate deliveries Pub/Sub makes (and the handlers that then run
twice) publish nothing a second time.

A message's key is its topic and bytes (deterministic: the same ToolRun of the same analysis is the same key). The
first publisher claims the key with a create-if-absent write (`published/{key}`; a fan-out's keys all in one round
trip, `create_many`); a publish that fails gives the claim back, so the redelivery publishes. A process killed
between the claim and the publish loses that message: the sweeper (xdiag.pipeline.sweep) finds the analysis without
progress and publishes a repair, whose `attempt` number makes it a new message.

Fan-in messages (`tool-results`) go without a claim: their consumer takes a copy as it takes the first (the fan-in
reads the tools' records again, and its own claim starts the investigation once), so a claim per tool run would cost
a round trip and buy nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from xdiag.model import Message, utc_now
from xdiag.pipeline.ports import Bus, StateStore
from xdiag.pipeline.topics import TOPIC_TOOL_RESULTS

PUBLISHED = "published"
UNCLAIMED_TOPICS = frozenset({TOPIC_TOOL_RESULTS})


def publish_key(topic: str, data: bytes) -> str:
    return hashlib.sha256(topic.encode() + b"\n" + data).hexdigest()[:32]


class PublishOnce:
    def __init__(self, bus: Bus, state: StateStore) -> None:
        self._bus, self._state = bus, state

    def publish(self, topic: str, message: Message) -> None:
        self.publish_all(topic, [message])

    def publish_all(self, topic: str, messages: Sequence[Message]) -> None:
        if not messages:
            return
        if topic in UNCLAIMED_TOPICS:
            self._bus.publish_all(topic, messages)
            return
        keys = [publish_key(topic, message.model_dump_json().encode()) for message in messages]
        claimed = self._state.create_many(PUBLISHED, [(key, {"topic": topic, "at": utc_now()}) for key in keys])
        fresh = [(key, message) for key, message, first in zip(keys, messages, claimed) if first]
        if not fresh:
            return  # published before
        try:
            self._bus.publish_all(topic, [message for _, message in fresh])
        except BaseException:
            for key, _ in fresh:  # not published (or not known to be): the retry of this delivery publishes them
                self._state.delete(PUBLISHED, key)
            raise
