"""Schema version 3: operator holds (HoldJob / ReleaseJob). ``held_by`` is who placed the hold; NULL = not held."""

STATEMENTS: tuple[str, ...] = ("ALTER TABLE jobs ADD COLUMN held_by TEXT",)
