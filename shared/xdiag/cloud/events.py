"""Decoding the CloudEvents that trigger the functions, in every form they arrive in.

- Pub/Sub, Eventarc form: type `google.cloud.pubsub.topic.v1.messagePublished`, data
  `{"message": {"data": <base64>, "attributes": {...}, "messageId": ...}, "subscription": ...}`,
  source `//pubsub.googleapis.com/projects/P/topics/T`.
- Pub/Sub push form (`{"message": ..., "subscription": ...}` POSTed to `/projects/P/topics/T`):
  functions-framework turns it into the same CloudEvent, the topic taken from the request path.
- Storage, Eventarc form: type `google.cloud.storage.object.v1.finalized`, data = the object resource.
- Storage, GCS Pub/Sub notification: a Pub/Sub message with attributes `eventType=OBJECT_FINALIZE`,
  `bucketId`, `objectId` (`objectGeneration`) and the object resource as JSON data.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any

from xdiag.errors import PoisonMessage
from xdiag.model import ProfileUploaded

PUBSUB_PUBLISHED = "google.cloud.pubsub.topic.v1.messagePublished"
STORAGE_FINALIZED = "google.cloud.storage.object.v1.finalized"
OBJECT_FINALIZE = "OBJECT_FINALIZE"


@dataclass
class PubSubDelivery:
    """One Pub/Sub message as a function receives it."""

    topic: str  # "" where the push endpoint did not carry the topic path
    data: bytes
    attributes: dict[str, str] = field(default_factory=dict)
    message_id: str = ""


def _event_data(event: Any) -> Any:
    data = event.data
    if isinstance(data, (bytes, str)):
        try:
            return json.loads(data or b"null")
        except ValueError:
            raise PoisonMessage(f"{event['type']} event whose data is not JSON") from None
    return data


def pubsub_delivery(event: Any) -> PubSubDelivery:
    """The Pub/Sub message a CloudEvent carries (either form)."""
    if event["type"] != PUBSUB_PUBLISHED:
        raise PoisonMessage(f"expected a Pub/Sub message event ({PUBSUB_PUBLISHED}), got {event['type']!r}")
    body = _event_data(event)
    message = body.get("message") if isinstance(body, dict) else None
    if not isinstance(message, dict):
        raise PoisonMessage("Pub/Sub event without a message")
    try:
        data = base64.b64decode(message.get("data") or "", validate=True)
    except (binascii.Error, ValueError):
        raise PoisonMessage("Pub/Sub message data is not base64") from None
    source = event["source"] or ""
    topic = source.rpartition("/topics/")[2] if "/topics/" in source else ""
    return PubSubDelivery(
        topic=topic,
        data=data,
        attributes={str(k): str(v) for k, v in (message.get("attributes") or {}).items()},
        message_id=str(message.get("messageId") or message.get("message_id") or event["id"] or ""),
    )


def storage_upload(event: Any) -> ProfileUploaded | None:
    """The object an object-finalize event names; None for other storage events (delete, metadata update)."""
    if event["type"] == STORAGE_FINALIZED:
        resource = _event_data(event)
        if not isinstance(resource, dict):
            raise PoisonMessage("storage event without an object resource")
        return _upload(resource.get("bucket"), resource.get("name"), resource.get("generation"), resource.get("size"))
    if event["type"] != PUBSUB_PUBLISHED:
        if event["type"].startswith("google.cloud.storage.object.v1."):
            return None
        raise PoisonMessage(f"not a storage event: {event['type']!r}")
    delivery = pubsub_delivery(event)
    attributes = delivery.attributes
    if attributes.get("eventType", OBJECT_FINALIZE) != OBJECT_FINALIZE:
        return None
    try:
        resource = json.loads(delivery.data) if delivery.data else {}
    except ValueError:
        resource = {}  # notifications with payload NONE carry the attributes only
    if not isinstance(resource, dict):
        resource = {}
    if "uri" in resource and not attributes.get("objectId"):  # a ProfileUploaded itself (the sweeper's re-announcement)
        try:
            return ProfileUploaded.model_validate(resource)
        except ValueError as exc:
            raise PoisonMessage(f"malformed ProfileUploaded message: {exc}") from None
    return _upload(
        attributes.get("bucketId") or resource.get("bucket"),
        attributes.get("objectId") or resource.get("name"),
        attributes.get("objectGeneration") or resource.get("generation"),
        resource.get("size"),
    )


def _upload(bucket: Any, name: Any, generation: Any, size: Any) -> ProfileUploaded:
    if not bucket or not name:
        raise PoisonMessage("storage notification names no bucket and object (bucketId/objectId or bucket/name)")
    try:
        size_bytes = int(size or 0)
    except (TypeError, ValueError):
        size_bytes = 0
    return ProfileUploaded(uri=f"gs://{bucket}/{name}", generation=str(generation or ""), size=size_bytes)
