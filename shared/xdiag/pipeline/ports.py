"""The ports the stages talk through. Their adapters: in the cloud, xdiag.cloud.pubsub (Bus), xdiag.cloud.gcs
(BlobStore) and xdiag.cloud.firestore (StateStore); in process, xdiag.cloud.memory (all three: `xdiag analyze` and
the tests); the Profiler, xdiag.capture.profiler (XProf's gRPC clients).

Stages never import a cloud client: they get a Bus, a BlobStore and a StateStore.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from xdiag.model import Message


@dataclass(frozen=True)
class BlobInfo:
    """An object's identity: a new upload to the same URI has a new `generation`. `updated`: when the store wrote
    this version (seconds since the epoch, by the store's clock; None where the store did not say), not part of the
    identity."""

    uri: str
    size: int
    generation: str
    updated: float | None = field(default=None, compare=False)


class Bus(Protocol):
    def publish(self, topic: str, message: Message) -> None:
        """Deliver `message` to whatever handles `topic` (at least once)."""

    def publish_all(self, topic: str, messages: Sequence[Message]) -> None:
        """`publish` each; returns once every one is handed over (a fan-out in one round trip, not one each)."""


class BlobStore(Protocol):
    def put(self, uri: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        """Write an object; returns its URI."""

    def put_file(self, source: Path, uri: str, content_type: str = "application/octet-stream",
                 cache_source: bool = False) -> str:
        """Write an object from a local file (streamed, for large ones); returns its URI. With `cache_source` the
        caller gives the file up (it must not change afterwards): it becomes the local copy of the version written,
        which `local_path` then returns without a download."""

    def get(self, uri: str) -> bytes:
        """An object's bytes; FileNotFoundError where there is none."""

    def exists(self, uri: str) -> bool: ...

    def local_path(self, uri: str, generation: str | None = None) -> Any:
        """A local file with the object's bytes (the object itself where it is local, else a cached download): of
        that generation where one is named (FileNotFoundError where it was replaced or deleted since)."""

    def list(self, prefix: str) -> list[BlobInfo]:
        """Every object whose URI starts with `prefix`, at any depth."""

    def stat(self, uri: str) -> BlobInfo | None:
        """The object's identity, or None where there is no such object."""


class StateStore(Protocol):
    def get(self, collection: str, key: str) -> dict[str, Any] | None: ...

    def get_many(self, refs: Sequence[tuple[str, str]]) -> list[dict[str, Any] | None]:
        """`get` of each (collection, key), in that order, in one round trip."""

    def set(self, collection: str, key: str, value: dict[str, Any]) -> None: ...

    def update(self, collection: str, key: str, fields: dict[str, Any]) -> None:
        """Merge `fields` into the document (creating it if absent)."""

    def create(self, collection: str, key: str, value: dict[str, Any]) -> bool:
        """Create-if-absent; True only for the one caller that created it (the fan-in's claim)."""

    def create_many(self, collection: str, docs: Sequence[tuple[str, dict[str, Any]]]) -> list[bool]:
        """`create` of each (key, value), in that order, in one round trip: True where this call created it."""

    def list(self, collection: str) -> list[tuple[str, dict[str, Any]]]: ...

    def delete(self, collection: str, key: str) -> None:
        """Removes the document if it exists."""

    def now(self) -> float:
        """The store's own clock (seconds since the epoch): what times written by several machines are compared
        with, never the caller's clock, which may be off."""


class Profiler(Protocol):
    """A workload's profiler server (gRPC ProfilerService), called by address. Errors raise RuntimeError with the
    server's gRPC status text (`UNAVAILABLE: …`)."""

    def trace(self, address: str, logdir: Path, duration_ms: int, attempts: int, options: dict[str, int]) -> None:
        """Captures for `duration_ms`; writes `<logdir>/plugins/profile/<timestamp>/<host>_<port>.xplane.pb`."""

    def start_continuous(self, address: str, options: dict[str, int]) -> None: ...

    def stop_continuous(self, address: str) -> None: ...

    def snapshot(self, address: str, logdir: Path) -> None:
        """Writes the continuous-profiling buffer like `trace` does (nothing where the platform keeps none)."""
