"""What the scheduling loop and the cluster side read from a stored job's spec, as a port.

A job's spec is stored as the API's wire message (the bytes the tenant's request carried, so a
restart or a replica renders exactly what was accepted). The rooms below the API never decode it
themselves: they ask a ``SpecReader`` for the domain facts they need, and the API room, which owns
the wire format, implements it (``broker.api.serde.SPECS``); the hub is handed one when it is built.
"""

from __future__ import annotations

from typing import Protocol

from broker.domain.records import JobRecord
from placement.model import JobRequest

__all__ = ["SpecReader"]


class SpecReader(Protocol):
    def request(self, job: JobRecord) -> JobRequest:
        """The core's request for the stored job (pod sets, shapes, selectors, topology)."""
        ...

    def start_timeout_s(self, spec: bytes, default: float) -> float:
        """The job's own gang start deadline in seconds, else ``default``."""
        ...
