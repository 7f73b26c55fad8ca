"""Has this session built the table yet? Each derived table (the op table, the steps, the host threads…) is built
once per session from its event columns and kept in `session.cache`: every tool that reads one shares that pass."""

from __future__ import annotations

from xdiag.profile.space import Session


def cached(session: Session, key: str, build):
    if key not in session.cache:
        session.cache[key] = build()
    return session.cache[key]
