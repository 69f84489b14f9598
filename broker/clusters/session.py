"""One live agent stream: what the broker has processed and acknowledged of it, and its outgoing queue."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TypeAlias

from broker.clusters import link

__all__ = ["Session", "Sessions"]


@dataclass
class Session:
    """One live agent stream. Outgoing domain messages go through `out` (the servicer serialises and numbers
    them); `None` closes the stream."""

    cluster: str
    session_id: str
    out: asyncio.Queue[link.Outbound | None] = field(default_factory=asyncio.Queue)
    done_upto: int = 0
    """Every agent message with a sequence up to this one is processed (what Ack may claim)."""
    acked_sequence: int = 0
    ack_scheduled: bool = False
    closed: bool = False
    aborted: str = ""
    """Why the broker ended the stream (a newer leader's stream replaced it); the servicer ends it ABORTED."""
    inventory_sequence: int = 0
    leader_epoch: int = 0
    _done: set[int] = field(default_factory=set)
    chains: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    """Per job, the last message being processed: messages about one job apply in order, others concurrently."""

    def complete(self, sequence: int) -> None:
        if sequence <= self.done_upto:
            return
        self._done.add(sequence)
        while self.done_upto + 1 in self._done:
            self.done_upto += 1
            self._done.discard(self.done_upto)

    def send(self, body: link.Outbound) -> None:
        if not self.closed:
            self.out.put_nowait(body)

    def close(self, aborted: str = "") -> None:
        if not self.closed:
            self.closed = True
            self.aborted = aborted
            self.out.put_nowait(None)


Sessions: TypeAlias = dict[str, Session]
"""The live session per cluster: the dispatcher opens and closes them; its outbox and watchdog send on them."""
