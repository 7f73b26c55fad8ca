"""A Bus that publishes each message once: the duplicate deliveries Pub/Sub makes (and the handlers that then run
twice) publish nothing a second time.

A message's key is its topic and bytes (deterministic: the same ToolRun of the same analysis is the same key). The
first publisher claims the key with a create-if-absent write (`published/{key}`); a publish that fails gives the
claim back, so the redelivery publishes. A process killed between the claim and the publish loses that message:
the sweeper (xdiag.pipeline.sweep) finds the analysis without progress and publishes a repair, whose `attempt` number makes
it a new message.
"""

from __future__ import annotations

import hashlib

from xdiag.model import Message, utc_now
from xdiag.pipeline.ports import Bus, StateStore

PUBLISHED = "published"


def publish_key(topic: str, data: bytes) -> str:
    return hashlib.sha256(topic.encode() + b"\n" + data).hexdigest()[:32]


class PublishOnce:
    def __init__(self, bus: Bus, state: StateStore) -> None:
        self._bus, self._state = bus, state

    def publish(self, topic: str, message: Message) -> None:
        key = publish_key(topic, message.model_dump_json().encode())
        if not self._state.create(PUBLISHED, key, {"topic": topic, "at": utc_now()}):
            return  # published before
        try:
            self._bus.publish(topic, message)
        except BaseException:
            self._state.delete(PUBLISHED, key)  # not published: the retry of this delivery publishes it
            raise
