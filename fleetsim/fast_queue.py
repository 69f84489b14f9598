"""Fast mode's queue side: arrivals, the broker's queue snapshot and usage, and the memo of "no" answers that skips repeated decisions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from broker.domain.states import JobState
from broker.scheduling.queue import QueueEntry, QueueSnapshot, Usage
from fleetplan.choice import AggregateChoice, usable_clusters
from fleetplan.decide import Choice, allow_every_cluster, could_ever_fit, within_policy
from fleetplan.view import FleetView
from fleetsim.fast_records import JOB_NEVER, JOB_QUEUED, FastJob, only_cluster
from fleetsim.fast_state import FastState
from placement.fit import capacity
from placement.model import JobRequest

__all__ = ["FastQueue"]


class FastQueue(FastState):
    """Arrivals, the queue and when a "no" may have changed."""

    # ------------------------------------------------------------------ arrivals, the queue

    def _arrive(self, job: FastJob) -> None:
        if not self._homes(job, job.full):
            job.state = JOB_NEVER
            self.remaining -= 1
            self._note("never", job.item.name, "no cluster could hold it even empty")
            return
        # The clusters the choice may yet place it in: where what it is asked (baselines: without the level) could
        # ever fit, as a cluster selector allows.
        homes = [c for c in self._homes(job, job.req) if c not in job.excluded]
        # aggregate's pick weighs every allowed cluster against the others: any of them matters
        job.homes = (
            tuple(c for c in self.cells if c not in job.excluded)
            if self.policy == "aggregate"
            else tuple(dict.fromkeys(self.home[c].name for c in homes))
        )
        # merged: replicas may land on any original cluster's nodes, whichever could hold the whole gang
        for cluster in homes if self.policy != "merged" else [c.name for c in self.fleet.clusters]:
            kinds = tuple(k for (c, g), k in self.kind_of.items() if c == cluster and self._fits_empty(k, job))
            cell = self.home[cluster].name
            job.kinds[cell] = job.kinds.get(cell, ()) + kinds
        self.last_progress = max(self.last_progress, self.now)
        self._enqueue(job)

    def _homes(self, job: FastJob, req: JobRequest) -> tuple[str, ...]:
        """Original clusters that could hold the whole of `req` if they were empty."""
        it = job.item
        key = (job.code, it.replicas, it.min_replicas, req.required_level)
        got = self._ever.get(key)
        if got is None:
            view = FleetView(self._empty, 0.0)
            got = self._ever[key] = tuple(
                c.name for c in self.fleet.clusters if could_ever_fit(view, req, only_cluster(c.name))[0]
            )
        return got

    def _enqueue(self, job: FastJob) -> None:
        job.state = JOB_QUEUED
        job.queued_at = self.now
        job.failed = None
        job.tried = {}
        job.choice = None
        job.copies = []
        if job.entry is None:
            it = job.item
            job.entry = QueueEntry(
                job_id=it.name,
                tenant=it.tenant,
                queue="default",
                band="",
                priority=it.priority,
                seq=job.seq,
                state=JobState.QUEUED,
                gpus=it.gpu_cost,
                gpu_models=it.gpu_models,
                preemptible=it.preemptible,
            )
        self.queued[job.item.name] = job
        self._queue_version += 1
        self._wake()

    def _snapshot(self) -> QueueSnapshot:
        key = (self._queue_version, self._usage_version)
        if self._snap is None or self._snap[0] != key:
            self._snap = (key, self._build_snapshot())
        return self._snap[1]

    def _build_snapshot(self) -> QueueSnapshot:
        """The queue's snapshot over the queued jobs plus one entry per (tenant, model) carrying what is in use:
        the same order and admission as a snapshot over every active job, at the cost of the queue alone."""
        entries = [j.entry for j in self.queued.values() if j.entry is not None]
        for k, ((tenant, model), gpus) in enumerate(self.usage.items()):
            if gpus > 1e-9:
                entries.append(
                    QueueEntry(
                        job_id=f"\x00usage-{k}",
                        tenant=tenant,
                        queue="default",
                        band="",
                        priority=0,
                        seq=-1,
                        state=JobState.RUNNING,
                        gpus=gpus,
                        charged_model=model,
                        charged_gpus=gpus,
                    )
                )
        return QueueSnapshot.build(entries, self.qpolicy, self.now)

    def _charge(self, job: FastJob, model: str, gpus: float) -> None:
        job.model, job.charged = model, gpus
        key = (job.item.tenant, model)
        self.usage[key] = self.usage.get(key, 0.0) + gpus
        self._usage_version += 1

    def _uncharge(self, job: FastJob) -> None:
        if job.charged:
            key = (job.item.tenant, job.model)
            self.usage[key] = self.usage.get(key, 0.0) - job.charged
            self._usage_version += 1
            tenant = job.item.tenant
            self.usage_epoch[tenant] = self.usage_epoch.get(tenant, 0) + 1
        job.charged = 0.0

    # ------------------------------------------------------------------ when a "no" may have changed

    # A job the choice could not place (or whose choice the quota refused) is decided again only once something its
    # answer depended on moved; deciding it earlier would give the same answer (tests/fleetsim/test_fast.py checks
    # that outcomes are the same with this memo off). A record names what the answer depended on (epochs only grow,
    # so it keeps their sum):
    # * ("room", pick, kinds, epochs, usage): no room in the cluster asked (pick; "" = every cluster, Tandem's
    #   choice) can only turn into room where a replica fits an empty node: `kind_epoch` of those node groups;
    # * the same record when the quota refused the choice and no placement on a model the quota admits exists
    #   now (the broker's own narrowing, `within_policy`, finds none): then only room on those models' groups helps;
    # * ("quota", pick, clusters, epochs, usage): the quota refused the choice though an admissible placement
    #   exists: any change the broker sees there, a decrease included (`change`), may move the choice to it;
    # * ("quota-all", pick, usage): the quota refuses every GPU model it could land on in the cluster asked: only its
    #   tenant's usage dropping (`usage_epoch`) can help;
    # * ("workers", flavors, epochs, usage): multikueue's worker queues were full for every flavor it could use:
    #   only a copy leaving one of them (`worker_release`) helps.
    # round-robin asks the cluster at its cursor, aggregate the one its estimate ranks first: a record holds only
    # while the decision would ask the same cluster.

    def _fits_empty(self, kind: int, job: FastJob) -> bool:
        key = (kind, job.code)
        fits = self._kind_fit.get(key)
        if fits is None:
            fits = self._kind_fit[key] = capacity(self._kind_node[kind], job.shape).count > 0
        return fits

    def _record(
        self,
        job: FastJob,
        pick: str,
        refused: Choice | None,
        snap: QueueSnapshot,
        usage: Usage,
        view: FleetView | None,
    ) -> tuple[object, ...]:
        tenant = job.item.tenant
        used = self.usage_epoch.get(tenant, 0)
        if self.policy == "multikueue":
            flavors = tuple(
                (c.name, m)
                for c in self.fleet.clusters
                if c.name not in job.excluded
                for m in self._flavors(c.name, job)
            )
            return ("workers", flavors, sum(map(self.worker_release.__getitem__, flavors)), used)
        kinds = job.kinds.get(pick, ()) if pick else tuple(k for ks in job.kinds.values() for k in ks)
        if refused is None:
            return ("room", pick, kinds, sum(map(self.kind_epoch.__getitem__, kinds)), used)
        least = job.full.min_replicas * job.shape.gpu_cost  # an elastic gang may shrink to pass
        admissible = {
            m
            for m in {self._kind_model[k] for k in kinds}
            if snap.admit(tenant, m, least, preemptible=job.item.preemptible, usage=usage).allowed
        }
        if not admissible:
            return ("quota-all", pick, used)
        clusters = (pick,) if pick else job.homes
        assert view is not None
        if not self._admissible_room(view, job, admissible, clusters):
            kinds = tuple(k for k in kinds if self._kind_model[k] in admissible)
            return ("room", pick, kinds, sum(map(self.kind_epoch.__getitem__, kinds)), used)
        self._quota_watch.update(clusters)
        return ("quota", pick, clusters, sum(map(self.change.__getitem__, clusters)), used)

    def _admissible_room(self, view: FleetView, job: FastJob, models: set[str], clusters: Sequence[str]) -> bool:
        """Whether a domain of some cluster could hold the job on nodes of `models` by the view's numpy columns:
        the first test of `fleetplan.decide.decide_in` (no candidate domain, no choice there), with the request
        narrowed to those models as the broker narrows it (`within_policy`). False proves no admissible choice."""
        narrowed = within_policy(job.req, models)
        req = narrowed.pod_sets[0]
        count = narrowed.min_replicas if narrowed.min_available is not None else req.count  # decide_in shrinks
        for c in clusters:
            arrays = view.arrays(c)
            depth = self.cells[c].depth_of(narrowed.required_level) if narrowed.required_level else None
            if arrays is None or (narrowed.required_level and depth is None):
                continue
            if arrays.candidate_domains([(req.shape, count)], depth, 1):
                return True
        return False

    def _still_no(self, job: FastJob, record: tuple[object, ...] | None, pick: str) -> bool:
        """Whether deciding the job now (asking `pick`) would give the same "no" as when `record` was made."""
        if record is None or not self.memo:
            return False
        used = self.usage_epoch.get(job.item.tenant, 0)
        tag = record[0]
        if record[-1] != used:
            return False
        if tag == "quota-all":
            return record[1] == pick
        if tag == "workers":
            flavors = cast(tuple[tuple[str, str], ...], record[1])
            return record[2] == sum(map(self.worker_release.__getitem__, flavors))
        if record[1] != pick:
            return False
        if tag == "room":
            return record[3] == sum(map(self.kind_epoch.__getitem__, cast(tuple[int, ...], record[2])))
        return record[3] == sum(map(self.change.__getitem__, cast(tuple[str, ...], record[2])))

    def _fingerprint(self) -> tuple[object, ...]:
        """Changes whenever anything a "no" depends on moved (every epoch only grows) or the queue changed."""
        # `change` (every report bumps it) only where a "quota" record reads it, or aggregate's pick does
        watch = self.change.keys() if self.policy == "aggregate" else self._quota_watch
        fp = (
            sum(self.kind_epoch),
            sum(map(self.change.__getitem__, watch)),
            sum(self.usage_epoch.values()),
            sum(self.worker_release.values()),
            self._queue_version,
            self._usage_version,
        )
        if not self._idle_rounds or next(iter(self._idle_rounds))[0] != fp:
            self._idle_rounds.clear()  # rounds of an older state never repeat
        return fp

    def _pick(self, view: FleetView, job: FastJob, picks: dict[tuple[int, tuple[str, ...]], str]) -> str:
        """The cluster aggregate's estimate ranks first for the job, as fleetplan.choice.AggregateChoice ranks
        them (the most replicas free, summed node by node); memoised per shape within one view."""
        key = (job.code, job.excluded)
        got = picks.get(key)
        if got is None:
            cands = usable_clusters(view, job.req, allow_every_cluster, job.excluded)
            got = ""
            if isinstance(cands, list):
                got = AggregateChoice.rank_first(view, job.req, cands)
            picks[key] = got
        return got

    def _flavors(self, cluster: str, job: FastJob) -> tuple[str, ...]:
        """GPU models of the cluster, in node order, on whose empty nodes one replica of the job fits."""
        key = (cluster, job.code)
        got = self._flavor_fit.get(key)
        if got is None:
            models = [
                self._kind_model[k] for (c, _), k in self.kind_of.items() if c == cluster and self._fits_empty(k, job)
            ]
            got = self._flavor_fit[key] = tuple(dict.fromkeys(models))
        return got
