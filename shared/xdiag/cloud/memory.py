"""The embedded default: an in-process bus, a local directory and an in-memory state store.

No network, no emulator: `xdiag analyze` runs the pipeline's stages over these.
"""

from __future__ import annotations

import os
import pickle
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from xdiag.errors import UnsafeOutput
from xdiag.fresh_files import replace_with, replacing
from xdiag.model import Message
from xdiag.pipeline.ports import BlobInfo


class InProcessBus:
    """Delivers messages to registered handlers, in publish order, on `drain()`."""

    def __init__(self) -> None:
        self._handlers: dict[str, Callable[[Message], None]] = {}
        self._queue: deque[tuple[str, Message]] = deque()
        self.delivered: list[tuple[str, Message]] = []

    def subscribe(self, topic: str, handler: Callable[[Message], None]) -> None:
        self._handlers[topic] = handler

    def publish(self, topic: str, message: Message) -> None:
        # A JSON round trip, as on the wire: a handler never shares an object with its publisher.
        self._queue.append((topic, type(message).model_validate_json(message.model_dump_json())))

    def publish_all(self, topic: str, messages: Sequence[Message]) -> None:
        for message in messages:
            self.publish(topic, message)

    def drain(self) -> int:
        """Runs handlers until no message is left; returns how many were delivered."""
        count = 0
        while self._queue:
            topic, message = self._queue.popleft()
            handler = self._handlers.get(topic)
            if handler is None:
                raise LookupError(f"no handler subscribed to topic {topic!r}")
            handler(message)
            self.delivered.append((topic, message))
            count += 1
        return count


def _path_of(uri: str) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path) if parsed.scheme else uri)
    raise ValueError(f"the local blob store cannot hold {uri!r}; use a file path or file:// URI")


class LocalBlobStore:
    """Objects are files; URIs are paths or file:// URIs (and gs://BUCKET/NAME, as `buckets`/BUCKET/NAME, where
    a folder for buckets is given: Cloud Storage's layout without the service)."""

    def __init__(self, buckets: Path | None = None, confined_to: Path | None = None) -> None:
        self.buckets = buckets
        # A folder (`xdiag analyze --out`) whose objects are never written outside it: a path under it whose folders
        # lead elsewhere (a planted link) is refused.
        self.confined_to = confined_to.resolve() if confined_to is not None else None
        self.written: set[Path] = set()  # every object's path written, absolute (what an analysis wrote)

    def _path(self, uri: str) -> Path:
        if uri.startswith("gs://") and self.buckets is not None:
            return self.buckets / uri[len("gs://"):]
        return _path_of(uri)

    def _uri(self, path: Path, like: str) -> str:
        if like.startswith("gs://") and self.buckets is not None:
            return "gs://" + path.relative_to(self.buckets).as_posix()
        return str(path)

    def _writable(self, uri: str) -> Path:
        """The object's path, its folder made; PermissionError where a link leads it out of `confined_to`."""
        path = self._path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        root = self.confined_to
        if root is not None and Path(os.path.abspath(path)).is_relative_to(root) and not path.parent.resolve(
                ).is_relative_to(root):
            raise UnsafeOutput(f"{path}: a link in its folders leads out of {root}; not written")
        self.written.add(Path(os.path.abspath(path)))
        return path

    def put(self, uri: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        replace_with(self._writable(uri), data)  # never through a link; readers never see half a file
        return uri

    def get(self, uri: str) -> bytes:
        return self._path(uri).read_bytes()

    def exists(self, uri: str) -> bool:
        return self._path(uri).exists()

    def local_path(self, uri: str, generation: str | None = None) -> Path:
        path = self._path(uri)
        if generation and (info := self.stat(uri)) is not None and info.generation != generation:
            raise FileNotFoundError(f"{uri}: replaced since (generation {generation}, now {info.generation})")
        return path

    def stat(self, uri: str) -> BlobInfo | None:
        try:
            info = self._path(uri).stat()
        except FileNotFoundError:
            return None
        return BlobInfo(uri=uri, size=info.st_size, generation=str(info.st_mtime_ns), updated=info.st_mtime)

    def list(self, prefix: str) -> list[BlobInfo]:
        base = self._path(prefix)
        folder = base if prefix.endswith("/") else base.parent
        if not folder.is_dir():
            return []
        paths = [p for p in sorted(folder.rglob("*")) if p.is_file() and str(p).startswith(str(base))]
        return [info for info in (self.stat(self._uri(p, prefix)) for p in paths) if info is not None]

    def put_file(self, source: Path, uri: str, content_type: str = "application/octet-stream",
                 cache_source: bool = False) -> str:
        path = self._writable(uri)  # the object is a local file already: nothing to cache
        with replacing(path) as out, source.open("rb") as copied:
            shutil.copyfileobj(copied, out)
        return uri


def _copied(value: Any) -> Any:
    """A document's own copy, as a store would hand back: a pickle round trip, 2-3x quicker than copy.deepcopy on
    the tool results' nested dicts and lists (which the aggregator lists once per tool)."""
    return pickle.loads(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))


class MemoryStateStore:
    """Documents in a dict, guarded by a lock; `create` is the atomic create-if-absent."""

    def __init__(self) -> None:
        self._docs: dict[str, dict[str, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def get(self, collection: str, key: str) -> dict[str, Any] | None:
        with self._lock:
            doc = self._docs.get(collection, {}).get(key)
            return _copied(doc) if doc is not None else None

    def get_many(self, refs: Sequence[tuple[str, str]]) -> list[dict[str, Any] | None]:
        return [self.get(collection, key) for collection, key in refs]

    def set(self, collection: str, key: str, value: dict[str, Any]) -> None:
        with self._lock:
            self._docs.setdefault(collection, {})[key] = _copied(value)

    def update(self, collection: str, key: str, fields: dict[str, Any]) -> None:
        with self._lock:
            self._docs.setdefault(collection, {}).setdefault(key, {}).update(_copied(fields))

    def create(self, collection: str, key: str, value: dict[str, Any]) -> bool:
        with self._lock:
            docs = self._docs.setdefault(collection, {})
            if key in docs:
                return False
            docs[key] = _copied(value)
            return True

    def create_many(self, collection: str, docs: Sequence[tuple[str, dict[str, Any]]]) -> list[bool]:
        return [self.create(collection, key, value) for key, value in docs]

    def list(self, collection: str) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            return [(k, _copied(v)) for k, v in sorted(self._docs.get(collection, {}).items())]

    def delete(self, collection: str, key: str) -> None:
        with self._lock:
            self._docs.get(collection, {}).pop(key, None)

    def now(self) -> float:
        return time.time()  # the store lives in this process: its clock is this process's
