"""Has this session built the table yet? Each derived table (the op table, the steps, the host threads…) is built
once per session from its event columns and kept in `session.cache`: every tool that reads one shares that pass."""

from __future__ import annotations

import threading

from xdiag.profile.space import Session


def cached(session: Session, key: str, build):
    if key not in session.cache:
        session.cache[key] = build()
    return session.cache[key]


class MadeOnFirstRead(dict):
    """A session's cache in which some tables are made where a tool first reads them (`makers`: key -> a function
    that makes it): a session assembled from many hosts' summaries holds each table only in the processes whose
    tools read it (the reduce reads none of its per-step rows)."""

    def __init__(self, entries: dict, makers: dict):
        super().__init__({key: value for key, value in entries.items() if key not in makers})
        self._makers = dict(makers)
        self._making = threading.RLock()  # two tools' threads asking at once make a table once

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or key in self._makers

    def __missing__(self, key: str):
        with self._making:
            if dict.__contains__(self, key):  # made by the thread that held the lock
                return dict.__getitem__(self, key)
            value = self._makers[key]()  # its maker stays until it is stored: the key is in the cache meanwhile
            self[key] = value
            return value

    def __setitem__(self, key: str, value) -> None:
        self._makers.pop(key, None)
        dict.__setitem__(self, key, value)

    def get(self, key: str, default=None):
        return self[key] if key in self else default

    def update(self, *args, **kwargs) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key: str, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def pop(self, key: str, *default):
        if key in self._makers:
            self[key]  # noqa: B018 - made, then popped as a stored entry
        return dict.pop(self, key, *default)

    def clear(self) -> None:
        self._makers.clear()
        dict.clear(self)
