"""The local stack's Pub/Sub emulator over its REST API: the pipeline's topics, each with its dead-letter topic, push
subscriptions to the functions with their retry and dead-letter policies, and publishing on a topic."""

from __future__ import annotations

import base64
from typing import Any

from xdiag.cloud.runtime import dead_letter_topic
from xdiag.cloud.stack_config import FUNCTIONS, HOST, PIPELINE_TOPICS, UNRECORDED_TOPIC, StackError, StackSettings
from xdiag.cloud.stack_processes import http


class StackPubSub:
    """The Pub/Sub emulator of a stack whose services listen on `ports`."""

    def __init__(self, ports: dict[str, int], settings: StackSettings) -> None:
        self.ports = ports
        self.settings = settings

    def _url(self, path: str) -> str:
        return f"http://{HOST}:{self.ports['pubsub']}/v1/projects/{self.settings.project}/{path}"

    def ready(self) -> bool:
        return http("GET", self._url("topics"), timeout=2)[0] == 200

    def _put_topic(self, topic: str) -> None:
        status, body = http("PUT", self._url(f"topics/{topic}"))
        if status not in (200, 409):
            raise StackError(f"creating topic {topic} failed: {status} {body}")

    def _put_subscription(self, topic: str, port: int) -> None:
        project = self.settings.project
        body: dict[str, Any] = {
            "topic": f"projects/{project}/topics/{topic}",
            "ackDeadlineSeconds": 600,  # a delivery may take as long as its stage does
            "pushConfig": {"pushEndpoint": f"http://{HOST}:{port}/projects/{project}/topics/{topic}"},
            "retryPolicy": {
                "minimumBackoff": f"{self.settings.min_backoff_s}s",
                "maximumBackoff": f"{self.settings.max_backoff_s}s",
            },
        }
        # A pipeline topic's undeliverable messages go to its dead-letter topic; a dead-letter topic's (a letter
        # even dead_letter could not record) to the parking topic: no subscription retries forever.
        parking = dead_letter_topic(topic) if topic in PIPELINE_TOPICS else UNRECORDED_TOPIC
        body["deadLetterPolicy"] = {
            "deadLetterTopic": f"projects/{project}/topics/{parking}",
            "maxDeliveryAttempts": self.settings.max_delivery_attempts,
        }
        name = f"subscriptions/{topic}-push"
        status, answer = http("PUT", self._url(name), body)
        if status == 409:  # there already (a stack restarted on a running emulator): it gets these policies again
            mask = "ackDeadlineSeconds,pushConfig,retryPolicy,deadLetterPolicy"
            status, answer = http("PATCH", self._url(name), {"subscription": body, "updateMask": mask})
        if status != 200:
            raise StackError(f"creating the push subscription for {topic} failed: {status} {answer}")

    def subscription(self, topic: str) -> dict[str, Any]:
        """The push subscription of `topic` as the emulator has it (its policies)."""
        status, body = http("GET", self._url(f"subscriptions/{topic}-push"))
        if status != 200:
            raise StackError(f"no push subscription for {topic}: {status} {body}")
        return body

    def publish(self, topic: str, data: bytes, attributes: dict[str, str] | None = None) -> str:
        """Publishes raw bytes on a topic of the stack (tests, `xdiag publish-capture`); returns the message id."""
        message = {"data": base64.b64encode(data).decode(), "attributes": attributes or {}}
        status, body = http("POST", self._url(f"topics/{topic}:publish"), {"messages": [message]})
        if status != 200:
            raise StackError(f"publishing on {topic} failed: {status} {body}")
        return body["messageIds"][0]

    def put_topics(self) -> None:
        for topic in PIPELINE_TOPICS:
            self._put_topic(topic)
            self._put_topic(dead_letter_topic(topic))
        self._put_topic(UNRECORDED_TOPIC)

    def put_subscriptions(self) -> None:
        for spec in FUNCTIONS:
            for topic in spec.topics:
                self._put_subscription(topic, self.ports[spec.name])
        status, answer = http("PUT", self._url(f"subscriptions/{UNRECORDED_TOPIC}-pull"),
                              {"topic": f"projects/{self.settings.project}/topics/{UNRECORDED_TOPIC}"})
        if status not in (200, 409):
            raise StackError(f"creating the {UNRECORDED_TOPIC} subscription failed: {status} {answer}")
