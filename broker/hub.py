"""The broker's live parts wired together once: store, catalog, placer, dispatcher, auth, metrics, background loops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from broker.clusters.dispatcher import Dispatcher
from broker.config import BrokerConfig
from broker.domain import errors
from broker.domain.events import ToDispatcher, ToPlacer
from broker.domain.records import JobRecord, event_log
from broker.domain.specs import SpecReader
from broker.metrics import Metrics
from broker.scheduling.placer import Placer
from broker.scheduling.preemptor import Preemptor
from broker.store.base import Store, StoreOptions
from broker.tenancy import auth
from broker.tenancy.policy import PolicyFile
from fleetplan.catalog import Catalog
from fleetplan.choice import make_choice
from fleetplan.view import FleetView

_log = logging.getLogger("tandem.broker.hub")

__all__ = ["Hub"]


class Hub:
    """The live parts wired once, started by `start()`, ended by `close()`; the API's handlers get narrow
    bundles of them (broker.api.ports), never the hub itself."""

    def __init__(
        self,
        cfg: BrokerConfig,
        store: Store,
        *,
        specs: SpecReader,
        clock: Callable[[], float] = time.time,
        metrics: Metrics | None = None,
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.clock = clock
        self.metrics = metrics or Metrics()
        self.policy = PolicyFile(cfg.policy_path, check_interval_s=cfg.policy_check_interval_s)
        self.authz = auth.Authorizer(self.policy, agent_insecure=cfg.agent_insecure)
        local = cfg.store_url is None and cfg.db_path != ":memory:"
        audit_path = cfg.audit_log_path or (cfg.db_path + ".audit.jsonl" if local else None)
        self.audit = auth.AuditLog(audit_path, clock=clock)
        self.catalog = Catalog(stale_after_s=cfg.cluster_stale_after_s)
        self.cordon_reasons: dict[str, str] = {}
        # The placer and the dispatcher hold no reference to each other: each sends the other events.
        self.placer = Placer(
            store,
            self.catalog,
            self.policy,
            specs=specs,
            send=self._to_dispatcher,
            clock=clock,
            batch=cfg.placement_batch,
            candidate_domains=cfg.candidate_domains,
            reservation_ttl_s=cfg.dispatch_ack_timeout_s * 2,
            metrics=self.metrics,
            choice=make_choice(cfg.cluster_choice, cfg.candidate_domains),
            model_weights=cfg.fairness.gpu_model_weights,
            usage_half_life_s=cfg.fairness.usage_half_life_s,
            start_timeout_s=cfg.gang_start_deadline_s,
        )
        self.dispatcher = Dispatcher(
            store, self.catalog, cfg, specs=specs, send=self._to_placer, clock=clock, metrics=self.metrics
        )
        self.preemptor = Preemptor(
            store,
            self.placer,
            self.policy,
            cfg.fairness,
            apply=self.dispatcher.apply,
            grace_s=cfg.grace_period_s,
            clock=clock,
            metrics=self.metrics,
        )
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    def store_for(cls, cfg: BrokerConfig, clock: Callable[[], float] = time.time) -> Store:
        """The configured backend: PostgreSQL when `store_url` is set, else SQLite at `db_path`."""
        options = StoreOptions(retry=cfg.retry)
        if cfg.store_url is not None:
            from broker.store.postgres import PostgresStore

            return PostgresStore(cfg.store_url, clock=clock, options=options)
        from broker.store.sqlite import SqliteStore

        return SqliteStore(cfg.db_path, clock=clock, options=options)

    async def start(self) -> None:
        """Open the store, reload the queue and reservations, start the placer and watchdog loops."""
        await self.store.open()
        for cluster, reason in (await self.store.cordons()).items():
            self._cordon_in_effect(cluster, reason)
        await self.placer.load()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(
                self.placer.run(
                    idle_s=max(self.cfg.placement_interval_s, 0.01) * 20, coalesce_s=self.cfg.placement_interval_s
                )
            ),
            loop.create_task(self.dispatcher.run_sweeps(min(1.0, self.cfg.cluster_stale_after_s / 4))),
            loop.create_task(self._retention()),
            loop.create_task(self._gauges()),
            loop.create_task(self._log_events(await self.store.current_revision())),
        ]
        if self.cfg.fairness.preemption:
            self._tasks.append(loop.create_task(self.preemptor.run()))

    # ------------------------------------------------------------------ what the API reads and asks for

    def fleet_view(self) -> FleetView:
        """The catalog frozen now: how the API, the fleet view and the metrics read the fleet (never the catalog)."""
        return FleetView(self.catalog, self.clock())

    async def set_cordon(self, cluster: str, reason: str | None, actor: str) -> None:
        """Cordon (with its reason) or uncordon (None): durable first, so a cordon survives a restart, then in
        effect for the placer."""
        await self.store.set_cordon(cluster, reason, actor=actor)
        self._cordon_in_effect(cluster, reason)
        self.catalog.sweep(self.clock())
        self.placer.capacity_changed()

    def _cordon_in_effect(self, cluster: str, reason: str | None) -> None:
        self.catalog.set_cordoned(cluster, reason is not None)
        if reason is None:
            self.cordon_reasons.pop(cluster, None)
        else:
            self.cordon_reasons[cluster] = reason

    def reprioritised(self, job: JobRecord) -> None:
        """A job's priority or band changed: the placer's cached request carries the old one, and the queue's
        order changed, so waiting jobs deserve another look."""
        self.placer.book.forget_request(job.job_id)
        self.placer.observe(job)
        self.placer.capacity_changed()

    async def deliver_all(self) -> None:
        """Send every connected cluster what it is owed (after a change that may touch many of them)."""
        for cluster in set(self.dispatcher.sessions):
            await self.dispatcher.deliver(cluster)

    def _to_dispatcher(self, event: ToDispatcher) -> None:
        self.dispatcher.on_event(event)

    def _to_placer(self, event: ToPlacer) -> None:
        self.placer.on_event(event)

    async def _gauges(self, every_s: float = 5.0) -> None:
        """Queue, demand, reservation and staleness gauges, and new group-commit batch sizes."""
        seen: dict[int, int] = {}
        while True:
            await asyncio.sleep(every_s)
            with contextlib.suppress(Exception):
                self.metrics.refresh_queue(self.placer.book)
                self.metrics.refresh_shares(self.placer.book, self.placer.holds)
                self.metrics.staleness(self.fleet_view())
                stats = getattr(self.store, "commit_stats", None)
                for size, count in dict(getattr(stats, "sizes", {}) or {}).items():
                    for _ in range(count - seen.get(size, 0)):
                        self.metrics.commit_batch.observe(size)
                    seen[size] = count

    async def _log_events(self, from_revision: int) -> None:
        """Log every committed job event once, from the store's own event log: submissions, reservations and
        each state change, whichever part of the broker made it (one place, after the commit)."""
        rev = from_revision
        while True:
            try:
                async for page in self.store.watch(rev, bookmark_s=60.0):
                    for ev in page.events:
                        message, fields = event_log(ev)
                        _log.info(message, extra=fields)
                    rev = page.revision
            except errors.OutOfRange:  # compacted past a lagging reader: carry on from now, say what was missed
                now = await self.store.current_revision()
                _log.warning("job events not logged (compacted)", extra={"from_revision": rev, "to_revision": now})
                rev = now

    async def _retention(self) -> None:
        """Delete finished jobs older than the retention bound (their watch events are compacted)."""
        while True:
            await asyncio.sleep(min(3600.0, self.cfg.retention_s / 10))
            try:
                await self.store.compact(finished_before=self.clock() - self.cfg.retention_s)
            except Exception:  # a failed sweep is retried at the next one; never stop the loop
                _log.exception("retention sweep failed")

    async def close(self) -> None:
        self.placer.stop()
        self.preemptor.stop()
        self.dispatcher.stop()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.store.close()
        self.audit.close()
