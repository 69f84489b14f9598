"""Fast mode's cluster side: dispatching pods, kube-scheduler's binding, running jobs, the agents' reports and background pods."""

from __future__ import annotations

import random
import zlib
from typing import Any

from fleetplan.catalog import InventoryReport
from fleetsim.fast_cluster import GPU_TOLERATION, Cell, PodKey, demand_of
from fleetsim.fast_queue import FastQueue
from fleetsim.fast_records import (
    BACKGROUND_CPU_MILLI_PER_GPU,
    BACKGROUND_GPUS,
    BACKGROUND_MEMORY_PER_GPU,
    CAUSE_GANG_TIMEOUT,
    CAUSE_NODE_TAKEN,
    EVENT_BG_ARRIVE,
    EVENT_BG_END,
    EVENT_FINISH,
    EVENT_TIMEOUT,
    JOB_BINDING,
    JOB_DONE,
    JOB_RESERVED,
    JOB_RUNNING,
    PINNED_POLICIES,
    POD_SET,
    FastJob,
    GangCopy,
)
from placement.model import PodShape

__all__ = ["FastPods"]


class FastPods(FastQueue):
    """What a cluster does with the pods it is given, and what its agent reports."""

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, payload: tuple[Any, ...]) -> None:
        job, attempt = payload[0], payload[1]
        if job.attempt != attempt or job.state != JOB_RESERVED:
            return
        if self.policy in PINNED_POLICIES:
            self._bind_pinned(job)
            return
        job.state = JOB_BINDING
        if self.policy == "multikueue":
            flavors: tuple[tuple[str, str], ...] = payload[2]
            for cluster, model in flavors:
                self._copy(job, self.home[cluster], flavor=model)
        else:
            assert job.choice is not None  # the choice's cluster and gang size; its node assignment is dropped
            self._copy(job, self.cells[job.choice.cluster], len(job.choice.assignments))
        self._at(self.now + self.params.gang_timeout_s, EVENT_TIMEOUT, (job, attempt))
        for copy in list(job.copies):
            self._pending[copy.cell.name].append(copy)
            if job.state == JOB_BINDING:
                self._schedule_copy(copy)

    def _copy(self, job: FastJob, cell: Cell, count: int = 0, flavor: str = "") -> GangCopy:
        depth = cell.depth_of(job.full.required_level) if job.full.required_level else None
        copy = GangCopy(job, cell, job.attempt, count or job.item.replicas, depth, flavor=flavor)
        job.copies.append(copy)
        return copy

    def _bind_pinned(self, job: FastJob) -> None:
        """The extender honours the pin: each replica binds on its node if it still fits the true state."""
        assert job.choice is not None
        cell = self.cells[job.choice.cluster]
        copy = self._copy(job, cell, len(job.choice.assignments))
        for a in job.choice.assignments:
            row = cell.row[a.node]
            if cell.capacity(row, job.shape, job.code) < 1:
                self._note("false", job.item.name, f"{a.node}: {CAUSE_NODE_TAKEN}")
                self._withdraw(copy)
                self._replan(job, CAUSE_NODE_TAKEN)
                return
            self._bind(copy, row, a.index)
        self._start(job, copy)

    def _bind(self, copy: GangCopy, row: int, index: int) -> None:
        key: PodKey = (copy.job.item.name, copy.attempt, index)
        copy.cell.bind(key, row, copy.job.shape)
        copy.keys.append(key)
        copy.since.append(self.now)
        copy.cell.mark_bound((copy.job.item.name, copy.attempt), (POD_SET, index))
        self._dirty(copy.cell)

    def _schedule_copy(self, copy: GangCopy) -> None:
        """kube-scheduler, one pod at a time; pods that do not fit stay pending (the bound ones hold on)."""
        job, cell = copy.job, copy.cell
        demand = demand_of(job.shape)
        while not copy.complete:
            row = cell.schedule_pod(job.shape, job.code, demand, copy.depth, copy.domain)
            if row is None:
                return
            if copy.depth is not None and copy.domain is None:
                copy.domain = cell.domain(row, copy.depth)
            self._bind(copy, row, len(copy.keys))
        self._pending[cell.name].remove(copy)
        losers = [other for other in job.copies if other is not copy]
        job.copies = [copy]
        job.cell = cell.name
        if copy.flavor and copy.flavor != job.model:  # multikueue charged the first copy's flavor until one won
            self._uncharge(job)
            self._charge(job, copy.flavor, job.item.replicas * job.shape.gpu_cost)
        self._start(job, copy)
        for other in losers:
            self.lost_copy_gpu_s += other.held_gpu_s(self.now)
            job.outcome.duplicates += 1
            self._withdraw(other)

    def _withdraw(self, copy: GangCopy) -> None:
        """Delete the copy's pods: bound ones give their resources back, pending ones just go."""
        cell = copy.cell
        for key in copy.keys:
            cell.unbind(key)
        if copy.keys:
            self._retry_cells.add(cell.name)
            self._dirty(cell)
        copy.keys.clear()
        copy.since.clear()
        cell.forget((copy.job.item.name, copy.attempt))
        pending = self._pending[cell.name]
        if copy in pending:
            pending.remove(copy)
        if copy.flavor:
            self.admitted[(cell.name, copy.flavor)] -= copy.job.item.gpu_cost
            self.worker_release[(cell.name, copy.flavor)] += 1
            self._wake()

    def _retry(self, cell: Cell) -> None:
        """Capacity freed in the cell: kube-scheduler retries its pending pods, oldest gang first."""
        for copy in list(self._pending[cell.name]):
            if copy.job.state == JOB_BINDING and copy in self._pending[cell.name]:
                self._schedule_copy(copy)

    def _replan(self, job: FastJob, cause: str) -> None:
        """A false dispatch: give everything back and queue the job again (re-planned at the next round)."""
        out = job.outcome
        out.false_dispatches += 1
        out.false_dispatch_causes = (*out.false_dispatch_causes, cause)
        self._drop_reservation(job)
        self._uncharge(job)
        self._enqueue(job)

    def _drop_reservation(self, job: FastJob) -> None:
        res = self.catalog.reservations.get(job.key)
        if res is not None:
            self.catalog.drop_reservation(job.key)
            cell = self.cells[res.cluster]
            for k in {cell.kinds[cell.row[r.node]] for r in res.replicas}:
                self.kind_epoch[k] += 1
            self.change[res.cluster] += 1
            self._wake()

    def _timeout(self, payload: tuple[FastJob, int]) -> None:
        job, attempt = payload
        if job.attempt != attempt or job.state != JOB_BINDING:
            return
        self._note("false", job.item.name, CAUSE_GANG_TIMEOUT)
        for copy in job.copies:
            self.timed_out_gpu_s += copy.held_gpu_s(self.now)
            self._withdraw(copy)
        self._replan(job, CAUSE_GANG_TIMEOUT)

    # ------------------------------------------------------------------ running

    def _start(self, job: FastJob, copy: GangCopy) -> None:
        out = job.outcome
        cell = copy.cell
        rows = [cell.pods[k][0] for k in copy.keys]
        level = job.full.required_level
        depth = cell.depth_of(level) if level else None
        out.domains = tuple(cell.level_value(r, depth) for r in rows) if depth is not None else ()
        if depth is not None and self.policy in PINNED_POLICIES and len({cell.domain(r, depth) for r in rows}) > 1:
            raise AssertionError(f"Tandem split gang {job.item.name} across {level} domains {sorted(set(out.domains))}")
        clusters = {cell.owner[r] for r in rows}
        out.cluster = clusters.pop() if len(clusters) == 1 else cell.name
        if out.started_s is None:
            out.started_s = self.now
        out.last_start_s = job.run_start = self.now
        job.state = JOB_RUNNING
        self.running += 1
        self.last_progress = self.now
        self._note("start", job.item.name, out.cluster)
        self._at(self.now + job.item.duration_s - job.done_s, EVENT_FINISH, (job, job.attempt))

    def _finish(self, payload: tuple[FastJob, int]) -> None:
        job, attempt = payload
        if job.attempt != attempt or job.state != JOB_RUNNING:
            return
        for copy in job.copies:
            self._withdraw(copy)
        self._drop_reservation(job)
        self._uncharge(job)
        job.state = JOB_DONE
        self.running -= 1
        job.outcome.finished_s = self.now
        self.remaining -= 1
        self.last_progress = self.now
        self._note("finish", job.item.name)
        self._wake()

    # ------------------------------------------------------------------ reports

    def _report(self, cell: Cell) -> None:
        """The agent's inventory delta: changed nodes and, per reserved attempt, the replicas bound."""
        self._report_at[cell.name] = None
        self._last_report[cell.name] = self.now
        nodes, grew = cell.take_report()
        bound = before = self._bound_sent[cell.name]
        if cell.bound_changed:
            bound = self._bound_sent[cell.name] = {k: frozenset(v) for k, v in cell.bound.items()}
            cell.bound_changed = False
            if self.policy not in PINNED_POLICIES:
                # Unpinned pods bind where kube-scheduler puts them: once reported bound, their reservation stops
                # holding its own nodes, which gain room in the view though the report shows no change there.
                for key, replicas in bound.items():
                    res = self.catalog.reservations.get(key)
                    new = replicas - before.get(key, frozenset())
                    if res is not None and new:
                        grew |= {cell.kinds[cell.row[r.node]] for r in res.replicas if (r.pod_set, r.index) in new}
        seq = self._report_seq[cell.name] + 1
        self._report_seq[cell.name] = seq
        self.catalog.apply_report(
            InventoryReport(cell.name, seq, False, self.now, tuple(nodes), bound=bound, base_sequence=seq - 1), self.now
        )
        # An attempt whose replicas this report shows bound needs no reservation any more: its pods are in the
        # reported nodes now (the overlay stopped subtracting them as the report landed, so the view is the same).
        for key, replicas in bound.items():
            res = self.catalog.reservations.get(key)
            if res is not None and all((r.pod_set, r.index) in replicas for r in res.replicas):
                self.catalog.drop_reservation(key)
                cell.forget(key)
        self.change[cell.name] += 1
        for k in grew:
            self.kind_epoch[k] += 1
        if grew or self.policy == "aggregate":
            self._wake()

    # ------------------------------------------------------------------ background pods

    def _background_streams(self) -> None:
        p = self.params
        for bg in p.background:
            if bg.cluster not in self.home:
                raise ValueError(f"background pod for unknown cluster {bg.cluster!r}")
            self._at(bg.at_s, EVENT_BG_ARRIVE, (bg.cluster, bg.gpus, bg.duration_s, None))
        if not p.background_streams:
            return
        for c in self.fleet.clusters:
            if c.background_pods_per_min > 0 and any(not g.mig for g in c.groups):
                # one stream per cluster, seeded by (seed, cluster): the same pods under every policy
                rng = random.Random(zlib.crc32(f"{self.seed}/{c.name}".encode()))
                self._next_background(c.name, rng, 0.0)

    def _next_background(self, cluster: str, rng: random.Random, t: float) -> None:
        rate = next(c.background_pods_per_min for c in self.fleet.clusters if c.name == cluster) / 60.0
        at = t + rng.expovariate(rate)
        gpus = rng.choice(BACKGROUND_GPUS)
        duration = rng.expovariate(1.0 / self.params.background_mean_s)
        self._at(at, EVENT_BG_ARRIVE, (cluster, gpus, duration, rng))

    def _background_arrive(self, payload: tuple[str, int, float, random.Random | None]) -> None:
        cluster, gpus, duration, rng = payload
        if rng is not None:
            self._next_background(cluster, rng, self.now)
        cell = self.home[cluster]
        shape = PodShape(
            gpus=gpus,
            cpu_milli=BACKGROUND_CPU_MILLI_PER_GPU * gpus,
            memory=BACKGROUND_MEMORY_PER_GPU * gpus,
            tolerations=(GPU_TOLERATION,),
        )
        row = cell.place_background(cluster, shape, self._code(shape))
        if row is None:
            self.background_dropped += 1
            return
        self.background_placed += 1
        key: PodKey = (f"\x00bg-{cluster}", self.background_placed, 0)
        cell.bind(key, row, shape)
        self._note("background", cluster, cell.names[row])
        self._dirty(cell)
        self._at(self.now + duration, EVENT_BG_END, (cell, key))

    def _background_end(self, payload: tuple[Cell, PodKey]) -> None:
        cell, key = payload
        cell.unbind(key)
        self._dirty(cell)
        self._retry_cells.add(cell.name)
