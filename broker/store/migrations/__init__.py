"""Versioned schema migrations for the SQLite store, applied in order at open and recorded in ``schema_version``."""

from __future__ import annotations

from broker.store.migrations import m0001_initial

__all__ = ["MIGRATIONS", "LATEST"]

MIGRATIONS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, m0001_initial.STATEMENTS),
)
"""(version, statements); append new versions, never edit applied ones."""

LATEST = MIGRATIONS[-1][0]
