"""The dispatcher's watchdog: stale clusters, unacknowledged dispatches and gangs past their start deadlines."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from broker.clusters import link
from broker.clusters.dispatcher_outbox import Outbox
from broker.clusters.session import Sessions
from broker.config import BrokerConfig
from broker.domain import job_events
from broker.domain.records import AttemptRecord, JobRecord
from broker.domain.specs import SpecReader
from broker.domain.states import PRE_START, AttemptOutcome, JobState
from broker.store.base import Store
from fleetplan import catalog as cat
from fleetplan.view import FleetView

__all__ = ["Watchdog"]

_log = logging.getLogger("tandem.broker.dispatcher")  # the dispatcher's logger: these are its sweeps
S = JobState


class Watchdog:
    """Sweeps the running attempts against the broker's deadlines; the only authority on them. What it
    decides goes through the outbox as lifecycle events; teardowns are ordered on the clusters' sessions."""

    def __init__(
        self,
        outbox: Outbox,
        sessions: Sessions,
        all_bound: dict[cat.AttemptKey, bool],
        config: BrokerConfig,
        *,
        store: Store,
        catalog: cat.Catalog,
        specs: SpecReader,
        clock: Callable[[], float],
        metrics: Any = None,
    ) -> None:
        self.outbox = outbox
        self.sessions = sessions
        self.all_bound = all_bound
        """What the inbox heard of each started attempt's pods being bound; attempts that ended are dropped here."""
        self.cfg = config
        self.store = store
        self.catalog = catalog
        self.specs = specs
        self.clock = clock
        self.metrics = metrics
        self._stopped = False

    async def sweep(self) -> None:
        """Stale clusters: re-plan what has not started, LOST for started work past the further bound;
        gangs past their start deadline and unacknowledged dispatches are torn down and re-planned."""
        now = self.clock()
        self.catalog.sweep(now)
        for cluster in list(self.sessions):
            self.outbox.kick(cluster)  # anything left in the outbox (e.g. a failed delivery) goes out now
        stale = {
            name: e.silent_for(now)
            for name, e in self.catalog.clusters.items()
            if e.silent_for(now) > self.cfg.cluster_stale_after_s
        }
        if self.metrics is not None:
            self.metrics.staleness(FleetView(self.catalog, now))
        runs = await self.store.active_runs()  # one read, not one per attempt
        for job, a in runs:
            silent = stale.get(a.cluster)
            if job.attempt != a.number:
                continue
            if silent is not None:
                if job.state in PRE_START and silent > self.cfg.cluster_stale_after_s:
                    await self.outbox.apply(job_events.ClusterSilent(job.job_id, a.number))
                    continue
                if (
                    job.state in (S.STARTING, S.RUNNING)
                    and silent > self.cfg.cluster_stale_after_s + self.cfg.lost_after_s
                ):
                    await self.outbox.apply(job_events.ClusterSilent(job.job_id, a.number))
                    continue
            if (
                job.state is S.DISPATCHED
                and a.dispatch_time
                and now - a.dispatch_time > self.cfg.dispatch_ack_timeout_s
            ):
                await self.outbox.apply(job_events.ReservationExpired(job.job_id, a.number))
            else:
                late = self._late(job, a, now)
                if late:
                    await self._teardown(job, a.cluster, AttemptOutcome.GANG_TIMEOUT, late, "GANG_TIMEOUT")
        active = {(j.job_id, a.number) for j, a in runs}
        for key in [k for k in self.all_bound if k not in active]:
            del self.all_bound[key]

    def _late(self, job: JobRecord, a: AttemptRecord, now: float) -> str:
        """Why a gang missed its start (empty when it has not): the broker's deadlines are the only
        authority (the agent only reports). Both start bounds count from the Start."""
        if job.state not in (S.ACCEPTED, S.STARTING):
            return ""  # only a gang not started yet can miss its start: running jobs' specs are not decoded
        timeout = self.specs.start_timeout_s(job.spec, self.cfg.gang_start_deadline_s)
        if job.state is S.ACCEPTED and a.dispatch_time and now - a.dispatch_time > timeout:
            return f"the gang's pods were not all created and pinned {timeout:g} s after its dispatch"
        if job.state is not S.STARTING or a.start_time is None:
            return ""
        since = now - a.start_time
        schedule = min(self.cfg.gang_schedule_timeout_s, timeout)
        # Judged only on a report heard since this broker started (after a restart it knows nothing yet).
        if since > schedule and self.all_bound.get((job.job_id, a.number)) is False:
            return f"not every pod was bound to its node {schedule:g} s after Start"
        if since > timeout:
            return f"not every replica was running {timeout:g} s after Start"
        return ""

    async def run(self, every_s: float = 1.0) -> None:
        """Sweep every `every_s` until stopped."""
        while not self._stopped:
            await asyncio.sleep(every_s)
            try:
                await self.sweep()
            except Exception:
                _log.exception("sweep failed")

    async def _teardown(self, job: JobRecord, cluster: str, outcome: AttemptOutcome, message: str, why: str) -> None:
        """End the attempt (the lifecycle re-queues it as the next attempt) and order its workload deleted."""
        attempt = job.attempt
        await self.outbox.apply(job_events.AttemptEnded(job.job_id, attempt, outcome, None, message))
        session = self.sessions.get(cluster)
        if session is not None:
            session.send(link.CancelOut(job.job_id, attempt, why, self.cfg.grace_period_s, message))

    def stop(self) -> None:
        self._stopped = True
