"""Durable job store: the interface (base) and its SQLite implementation."""

from broker.store.base import Store, StoreOptions

__all__ = ["Store", "StoreOptions"]
