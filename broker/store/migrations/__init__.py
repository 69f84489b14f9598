"""Versioned schema migrations for the SQLite store, applied in order at open and recorded in ``schema_version``."""

from __future__ import annotations

from broker.store.migrations import (
    m0001_initial,
    m0002_status,
    m0003_hold,
    pg0001_initial,
    pg0002_status,
    pg0003_hold,
)

__all__ = ["MIGRATIONS", "LATEST", "PG_MIGRATIONS", "PG_LATEST"]

MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, m0001_initial.STATEMENTS),
    (2, m0002_status.STATEMENTS),
    (3, m0003_hold.STATEMENTS),
)
"""(version, statements); append new versions, never edit applied ones."""

LATEST = MIGRATIONS[-1][0]

PG_MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, pg0001_initial.STATEMENTS),
    (2, pg0002_status.STATEMENTS),
    (3, pg0003_hold.STATEMENTS),
)
"""The PostgreSQL store's migrations: same version numbers, same meaning as MIGRATIONS."""

PG_LATEST = PG_MIGRATIONS[-1][0]
