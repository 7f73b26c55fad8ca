"""The BlobStore over Google Cloud Storage (or fake-gcs-server, where STORAGE_EMULATOR_HOST is set).

URIs are `gs://BUCKET/NAME`. `local_path` downloads an object once per version into a bounded local
cache shared by every process on the machine (files are renamed into place, so a reader never sees a
half-written one); the least recently used entries go when the cache outgrows its limit, and all but the one
being written when the disk is full (the download is then tried once more).

An object is downloaded as stored (never transcoded by the service) and no larger than `max_object_bytes`: its stored
size is checked first, and one stored with `Content-Encoding: gzip` is inflated here, chunk by chunk, its decoded size
counted to the limit before anything is written, so a small compressed object fills neither the disk (in Cloud
Functions, memory) nor the cache on its way to the refusal.
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import zlib
from pathlib import Path

from google.api_core import exceptions
from google.cloud import storage

from xdiag.disk_cache import evict_least_recent
from xdiag.errors import ProfileError
from xdiag.sizes import readable_size
from xdiag.pipeline.ports import BlobInfo

DEFAULT_CACHE_BYTES = 4 * 2**30
INFLATE_CHUNK = 1 << 20  # bytes decoded at a time: a gzip bomb never holds more than this in memory


def split_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("gs://"):
        raise ValueError(f"not a Cloud Storage URI: {uri!r} (expected gs://BUCKET/NAME)")
    bucket, _, name = uri[len("gs://") :].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {uri!r}")
    return bucket, name


def storage_client(project: str | None = None) -> storage.Client:
    """A client for the real service, or an anonymous one for the emulator STORAGE_EMULATOR_HOST names."""
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project=project or "xdiag-local", credentials=AnonymousCredentials())
    return storage.Client(project=project)


def _inflated(compressed: Path, uri: str):
    """The decoded bytes of a gzip file, INFLATE_CHUNK at a time, every member in turn; ProfileError where it is not
    valid gzip."""
    inflate = zlib.decompressobj(wbits=32 + zlib.MAX_WBITS)  # a gzip header
    try:
        with open(compressed, "rb") as source:
            while chunk := source.read(INFLATE_CHUNK):
                while chunk:
                    data = inflate.decompress(chunk, INFLATE_CHUNK)
                    chunk = inflate.unconsumed_tail
                    if inflate.eof:  # one gzip member ends; a file may hold several, each decoded in turn
                        # The input after the member is in unused_data; where the member's end fell on the output
                        # limit, unconsumed_tail holds the same bytes again (reading both doubled them each member).
                        chunk = inflate.unused_data
                        inflate = zlib.decompressobj(wbits=32 + zlib.MAX_WBITS)
                    yield data
    except zlib.error as exc:
        raise ProfileError(f"{uri} is stored with Content-Encoding: gzip but is not valid gzip: {exc}") from None


def _info(uri: str, blob: storage.Blob) -> BlobInfo:
    updated = blob.updated or blob.time_created  # the store's clock, not this machine's
    return BlobInfo(uri=uri, size=int(blob.size or 0), generation=str(blob.generation),
                    updated=updated.timestamp() if updated is not None else None)


class GcsBlobStore:
    def __init__(self, client: storage.Client, cache_dir: Path, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 max_object_bytes: int | None = None) -> None:
        self._client = client
        self.cache_dir = Path(cache_dir)
        self.cache_bytes = cache_bytes
        self.max_object_bytes = max_object_bytes  # stored and decoded: a larger object is refused with the reason
        self._lock = threading.Lock()

    def _blob(self, uri: str) -> storage.Blob:
        bucket, name = split_uri(uri)
        return self._client.bucket(bucket).blob(name)

    def put(self, uri: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        self._blob(uri).upload_from_string(data, content_type=content_type)
        return uri

    def put_file(self, source: Path, uri: str, content_type: str = "application/octet-stream",
                 cache_source: bool = False) -> str:
        """Uploads the file. With `cache_source`, links it into the local cache as the version just written: a
        reader of that version in any process of this machine (the stages after collect, on the local stack)
        downloads nothing. A link, not a copy (in a Cloud Function /tmp is memory), hence only for a file the
        caller gives up."""
        blob = self._blob(uri)
        blob.upload_from_filename(str(source), content_type=content_type)
        if cache_source and blob.generation is not None:
            target = self._cache_target(uri, blob.generation)
            with self._lock:
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(source, target)
                except FileExistsError:
                    pass
                except OSError:  # another file system: a later reader downloads it
                    return uri
                self._evict(keep=target.parent)
        return uri

    def get(self, uri: str) -> bytes:
        try:
            return self._blob(uri).download_as_bytes()
        except exceptions.NotFound:
            raise FileNotFoundError(uri) from None

    def exists(self, uri: str) -> bool:
        return self._blob(uri).exists()

    def stat(self, uri: str) -> BlobInfo | None:
        bucket, name = split_uri(uri)
        blob = self._client.bucket(bucket).get_blob(name)
        return None if blob is None else _info(uri, blob)

    def list(self, prefix: str) -> list[BlobInfo]:
        bucket, name_prefix = split_uri(prefix)
        return [_info(f"gs://{bucket}/{blob.name}", blob) for blob in self._client.list_blobs(bucket, prefix=name_prefix)]

    def _cache_target(self, uri: str, generation: int | str) -> Path:
        key = hashlib.sha256(f"{uri}#{generation}".encode()).hexdigest()[:24]
        return self.cache_dir / key / uri.rsplit("/", 1)[-1]  # keeps the host's file name

    def local_path(self, uri: str, generation: str | None = None) -> Path:
        """The object's bytes in the local cache, downloaded once per generation: that generation where one is
        named (FileNotFoundError where it is gone: replaced or deleted since), else the live one."""
        bucket, name = split_uri(uri)
        if generation:
            blob = self._client.bucket(bucket).blob(name, generation=int(generation))
        else:
            blob = self._client.bucket(bucket).get_blob(name)
            if blob is None:
                raise FileNotFoundError(uri)
        target = self._cache_target(uri, blob.generation)
        with self._lock:
            if target.exists():
                os.utime(target.parent)  # most recently used
                return target
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.part")
            try:
                if blob.size is None:  # a generation named: its size and encoding not fetched yet
                    blob.reload()
                try:
                    self._download(uri, blob, partial)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    self._evict(keep=target.parent, limit=0)  # the disk is full: everything else goes, then once more
                    try:
                        self._download(uri, blob, partial)
                    except OSError as again:
                        if again.errno != errno.ENOSPC:
                            raise
                        raise OSError(errno.ENOSPC, f"No space left on device for {uri} ({blob.size} bytes stored) in "
                                      f"the download cache {self.cache_dir}, with every other download evicted") from None
                partial.replace(target)
            except exceptions.NotFound:
                raise FileNotFoundError(f"{uri} generation {blob.generation}: gone (replaced or deleted)") from None
            finally:
                partial.unlink(missing_ok=True)
                partial.with_name(partial.name + ".gz").unlink(missing_ok=True)
            self._evict(keep=target.parent)
        return target

    def _download(self, uri: str, blob: storage.Blob, path: Path) -> None:
        """The object's bytes into `path` as stored, gzip-encoded ones inflated here; ProfileError where the stored or
        the decoded size is over the limit (the decoded size is counted first, writing nothing; it stops there)."""
        limit = self.max_object_bytes
        if limit is not None and (blob.size or 0) > limit:
            raise ProfileError(f"{uri} is {readable_size(blob.size)} as stored, over the {readable_size(limit)} limit")
        if (blob.content_encoding or "").lower() != "gzip":
            blob.download_to_filename(str(path), raw_download=True)
            return
        compressed = path.with_name(path.name + ".gz")
        blob.download_to_filename(str(compressed), raw_download=True)
        try:
            if limit is not None:  # counted before a byte is written: a bomb fills no disk on its way to the refusal
                decoded = 0
                for data in _inflated(compressed, uri):
                    decoded += len(data)
                    if decoded > limit:
                        raise ProfileError(
                            f"{uri} is stored with Content-Encoding: gzip ({blob.size} bytes) and decodes to more "
                            f"than the {readable_size(limit)} limit; decoding stopped there")
            with open(path, "wb") as out:
                for data in _inflated(compressed, uri):
                    out.write(data)
        finally:
            compressed.unlink(missing_ok=True)

    def _evict(self, keep: Path, limit: int | None = None) -> None:
        """Drops the least recently used downloads until the cache fits `limit` (its own limit by default), never the
        one just made."""
        evict_least_recent(self.cache_dir, self.cache_bytes if limit is None else limit, keep)
