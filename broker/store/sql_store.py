"""The Store operations both SQL backends run alike (paging, watch pages, revision waits), over the few primitives
each backend implements with its own statements and driver."""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence

from broker.domain.errors import RevisionCompacted, StoreUnavailable
from broker.domain.records import JobFilter, JobPage, JobRecord, WatchEvent, WatchPage
from broker.store import codec
from broker.store.base import Clock, IdGen, Store, StoreOptions
from broker.store.revisions import CommitSignal

__all__ = ["SqlStore"]


class SqlStore(Store):
    """What the SQLite and PostgreSQL stores share: options, clock, ids, page tokens, the commit signal, and the
    operations written once over ``_jobs_after`` and ``_events_after`` (the settings changes are ``Store``'s, over
    ``_update_job``)."""

    def __init__(self, *, clock: Clock = time.time, id_gen: IdGen | None = None, options: StoreOptions) -> None:
        self._clock = clock
        self._id_gen = id_gen or (lambda: codec.new_job_id(lambda: int(clock() * 1000)))
        self._opts = options
        self._tokens: codec.PageTokens | None = None
        """Set by ``open`` from the database's secret."""
        self._commits = CommitSignal()
        self.schema_version = 0

    # -- primitives (one read snapshot or one write request each) ------------------------------------------

    @abc.abstractmethod
    async def _jobs_after(self, flt: JobFilter, after_seq: int, limit: int) -> list[JobRecord]:
        """Up to ``limit`` jobs matching ``flt`` with seq > ``after_seq``, in seq order."""

    @abc.abstractmethod
    async def _events_after(
        self, from_revision: int, limit: int, tenant: str | None, job_set: str | None
    ) -> tuple[int, Sequence[WatchEvent], int]:
        """From one snapshot: the compaction revision, up to ``limit`` matching events above ``from_revision`` (in
        order) and the latest committed revision that read covers."""

    # -- the shared operations ---------------------------------------------------------------------------

    async def list_jobs(self, flt: JobFilter, *, page_size: int = 0, page_token: str = "") -> JobPage:
        tokens = self._tokens
        if tokens is None:
            raise StoreUnavailable("store is not open")
        size = min(page_size if page_size > 0 else self._opts.default_page_size, self._opts.max_page_size)
        after = tokens.decode(page_token, flt) if page_token else 0
        jobs = await self._jobs_after(flt, after, size + 1)  # one more than the page: is there a next one?
        more = len(jobs) > size
        jobs = jobs[:size]
        return JobPage(tuple(jobs), tokens.encode(jobs[-1].seq, flt) if more and jobs else "")

    async def watch_page(
        self, from_revision: int, *, limit: int = 0, tenant: str | None = None, job_set: str | None = None
    ) -> WatchPage:
        n = min(limit if limit > 0 else self._opts.max_watch_batch, self._opts.max_watch_batch)
        compacted, events, latest = await self._events_after(from_revision, n, tenant, job_set)
        if from_revision < compacted:
            raise RevisionCompacted(
                f"revision {from_revision} was compacted (compacted up to {compacted}); list again, then watch",
                compacted_revision=compacted,
            )
        # a full page covers up to its last event; a short one covers everything committed (same snapshot)
        covered = events[-1].revision if len(events) >= n else max(from_revision, latest)
        return WatchPage(tuple(events), covered)

    async def wait_for_revision(self, after: int, timeout_s: float) -> int:
        return await self._commits.wait(after, timeout_s, self.current_revision)
