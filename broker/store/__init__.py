"""Durable job store: the interface (base), SQLite (embedded default) and PostgreSQL (HA) implementations."""

from broker.store.base import Store, StoreOptions

__all__ = ["Store", "StoreOptions"]
