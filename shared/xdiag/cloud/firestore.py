"""The StateStore over Cloud Firestore (or its emulator, where FIRESTORE_EMULATOR_HOST is set).

Collections are slash paths (`analyses/{id}/tools`). `create` is Firestore's own create-if-absent: the
server refuses a second create of one document, so exactly one caller gets True, without a
transaction (the emulator serialises contended transactions very slowly; the fan-in needs none).
Firestore holds no array directly inside an array: such a value is stored as `{"xdiag_nested_list": [...]}`
and comes back as the list it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.api_core import exceptions
from google.cloud import firestore
from google.cloud.firestore_v1.bulk_batch import BulkWriteBatch
from google.rpc import code_pb2

_NESTED = "xdiag_nested_list"  # Firestore reserves field names like __x__
_BATCH_WRITE_LIMIT = 500  # writes per BatchWrite request
_CLOCK = "clock"  # a collection never written: reading from it tells the server's time


def _encode(value: Any, in_array: bool = False) -> Any:
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_encode(v, in_array=True) for v in value]
        return {_NESTED: items} if in_array else items
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {_NESTED}:
            return [_decode(v) for v in value[_NESTED]]
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


class FirestoreStateStore:
    def __init__(self, client: firestore.Client) -> None:
        self._client = client

    def _doc(self, collection: str, key: str) -> firestore.DocumentReference:
        return self._client.collection(collection).document(key)

    def get(self, collection: str, key: str) -> dict[str, Any] | None:
        snapshot = self._doc(collection, key).get()
        return _decode(snapshot.to_dict()) if snapshot.exists else None

    def get_many(self, refs: Sequence[tuple[str, str]]) -> list[dict[str, Any] | None]:
        documents = [self._doc(collection, key) for collection, key in refs]
        found = {snapshot.reference.path: snapshot for snapshot in self._client.get_all(documents)}  # any order
        return [_decode(s.to_dict()) if (s := found.get(d.path)) is not None and s.exists else None for d in documents]

    def set(self, collection: str, key: str, value: dict[str, Any]) -> None:
        self._doc(collection, key).set(_encode(value))

    def update(self, collection: str, key: str, fields: dict[str, Any]) -> None:
        self._doc(collection, key).set(_encode(fields), merge=True)

    def create(self, collection: str, key: str, value: dict[str, Any]) -> bool:
        try:
            self._doc(collection, key).create(_encode(value))
        except exceptions.AlreadyExists:
            return False
        return True

    def create_many(self, collection: str, docs: Sequence[tuple[str, dict[str, Any]]]) -> list[bool]:
        """One BatchWrite per 500 documents: each create succeeds or fails on its own (ALREADY_EXISTS: False),
        unlike a WriteBatch's commit, which fails whole. A key given twice is created once, by its first."""
        first_values: dict[str, dict[str, Any]] = {}
        for key, value in docs:
            first_values.setdefault(key, value)
        unique = list(first_values.items())
        created: dict[str, bool] = {}
        for start in range(0, len(unique), _BATCH_WRITE_LIMIT):
            chunk = unique[start:start + _BATCH_WRITE_LIMIT]
            batch = BulkWriteBatch(self._client)
            for key, value in chunk:
                batch.create(self._doc(collection, key), _encode(value))
            for (key, _), status in zip(chunk, batch.commit().status, strict=True):
                if status.code not in (code_pb2.OK, code_pb2.ALREADY_EXISTS):
                    raise exceptions.from_grpc_status(status.code, f"create {collection}/{key}: {status.message}")
                created[key] = status.code == code_pb2.OK
        answers, seen = [], set()
        for key, _ in docs:
            answers.append(created[key] and key not in seen)
            seen.add(key)
        return answers

    def list(self, collection: str) -> list[tuple[str, dict[str, Any]]]:
        return sorted(
            ((s.id, _decode(s.to_dict())) for s in self._client.collection(collection).stream()), key=lambda kv: kv[0]
        )

    def delete(self, collection: str, key: str) -> None:
        self._doc(collection, key).delete()

    def now(self) -> float:
        """The server's time of a read (of a document that need not exist): no write, so no contention."""
        return self._doc(_CLOCK, "now").get().read_time.timestamp()
