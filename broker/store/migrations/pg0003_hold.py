"""PostgreSQL schema version 3: the same as the SQLite store's version 3 (operator holds)."""

STATEMENTS: tuple[str, ...] = ("ALTER TABLE jobs ADD COLUMN held_by TEXT",)
