"""Fast mode's simulated state: the cells, the broker's catalog and queue policy, and the timed-event primitives every part of a run shares."""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence
from typing import Any

from broker.scheduling.drains import DrainHolds
from broker.scheduling.queue import QueuePolicy, QueueSnapshot
from fleetplan.catalog import Catalog, ClusterMeta, InventoryReport
from fleetplan.choice import ClusterChoice, make_choice
from fleetsim.fast_cluster import AttemptKey, Cell, agent_levels, merged_nodes, nodes_of, owners
from fleetsim.fast_records import (
    EVENT_REPORT,
    EVENT_ROUND,
    PINNED_POLICIES,
    POLICIES,
    FastJob,
    FastParams,
    GangCopy,
    request_of,
)
from fleetsim.model import FleetSpec, Outcome, WorkItem
from placement.model import Node, PodShape
from placement.scoring import Policy

__all__ = ["FastState"]


class FastState:
    """A fast-mode run's state and its setup; the sections of the run build on it (fleetsim.fast.FastSim)."""

    def __init__(
        self, fleet: FleetSpec, items: Sequence[WorkItem], *, policy: str, seed: int, params: FastParams = FastParams()
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}: one of {', '.join(POLICIES)}")
        names = [i.name for i in items]
        if len(set(names)) != len(names):
            raise ValueError("work item names must be unique")
        self.fleet = fleet
        self.policy = policy
        self.seed = seed
        self.params = params
        self.now = 0.0
        self.memo = True
        """Skip decisions provably equal to an earlier "no" (see _record); False decides every queued job in every
        round, as the broker's placer would, for tests that the memo changes no outcome."""
        self.log: list[tuple[float, str, str, str]] = []
        self.latency: list[float] = []
        self.lost_copy_gpu_s = 0.0
        self.timed_out_gpu_s = 0.0
        self.background_placed = 0
        self.background_dropped = 0
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._shapes: dict[PodShape, int] = {}

        # node groups through the fleet: (cluster, group) -> id, and each node's group
        self.kind_of: dict[tuple[str, str], int] = {}
        node_kind: dict[str, int] = {}
        for c in fleet.clusters:
            for g, node in zip((grp for grp in c.groups for _ in range(grp.nodes)), nodes_of(c)):
                node_kind[node.name] = self.kind_of.setdefault((c.name, g.name), len(self.kind_of))
        self.kind_epoch = [0] * len(self.kind_of)
        """Per node group, bumped when the broker's view of it may have gained room (a report with a release, a
        reservation dropped): a job that found no room is decided again only once one of its groups moved."""

        self.cells: dict[str, Cell] = {}
        metas: dict[str, ClusterMeta] = {}
        if policy == "merged":
            levels, nodes, owner = merged_nodes(fleet)
            self.cells["merged"] = Cell(
                "merged",
                levels,
                nodes,
                [owner[n.name] for n in nodes],
                [node_kind[n.name] for n in nodes],
                self._scorer(),
            )
            metas["merged"] = ClusterMeta("merged", levels=levels)
        else:
            for c in fleet.clusters:
                levels = agent_levels(c)
                nodes = nodes_of(c)
                self.cells[c.name] = Cell(
                    c.name, levels, nodes, [c.name] * len(nodes), [node_kind[n.name] for n in nodes], self._scorer()
                )
                metas[c.name] = ClusterMeta(c.name, c.region, c.role, levels=levels)
        self.home = owners(self.cells)
        self._pending: dict[str, list[GangCopy]] = {name: [] for name in self.cells}
        """Per cell, gangs with pods kube-scheduler has not bound yet, oldest first."""
        self._retry_cells: set[str] = set()
        """Cells where capacity freed during the current event: their pending pods are retried after it."""

        # The broker's side: its catalog (fed by reports), the cluster choice, the queue's policy.
        self.catalog = Catalog(stale_after_s=params.stale_after_s)
        self._report_seq: dict[str, int] = {}
        self._bound_sent: dict[str, dict[AttemptKey, frozenset[tuple[str, int]]]] = {}
        for name, cell in self.cells.items():
            self._report_seq[name] = 1
            self._bound_sent[name] = {}
            self.catalog.apply_report(InventoryReport(name, 1, True, 0.0, tuple(cell.nodes), meta=metas[name]), 0.0)
        self._rr_period = math.lcm(*range(1, len(self.cells) + 1))
        """The cursor's phase that fixes whom every job asks (candidate lists are 1..clusters long)."""
        self.choice: ClusterChoice | None = None
        if policy != "multikueue":
            self.choice = make_choice("tandem" if policy in PINNED_POLICIES else policy, params.candidate_domains)
        self.qpolicy = QueuePolicy(
            tenant_weights={t.name: t.weight for t in fleet.tenants},
            quotas={(t.name, model): float(limit) for t in fleet.tenants for model, limit in t.quota},
        )
        self.usage: dict[tuple[str, str], float] = {}
        self.usage_epoch: dict[str, int] = {}
        self.change: dict[str, int] = {name: 0 for name in self.cells}
        """Per cluster, bumped on any change the broker sees (aggregate's pick depends on relative room)."""
        self._phase = {name: i * params.report_interval_s / len(self.cells) for i, name in enumerate(self.cells)}
        self._report_at: dict[str, float | None] = {name: None for name in self.cells}
        self._last_report: dict[str, float] = {name: 0.0 for name in self.cells}
        self._round_at: float | None = None
        self._queue_version = 0
        self._usage_version = 0
        self._snap: tuple[tuple[int, int], QueueSnapshot] | None = None
        """The queue's snapshot and the (queue, usage) versions it was built at: the order reads nothing else."""
        self._quota_watch: set[str] = set()
        """Clusters some "quota" record was made for: their `change` is part of the state fingerprint."""
        self._idle_rounds: set[tuple[object, ...]] = set()
        """round-robin: (state fingerprint, cursor phase) of rounds that decided nothing (see _round)."""
        self._last_round = -1.0
        self._last_preempt = -math.inf
        self.drains = DrainHolds(self.catalog)
        """tandem-fair: domains held for long-waiting gangs."""
        self.holds_started = 0
        self.preemptions: dict[str, int] = {}
        """tandem-fair: victims by rule."""
        self.tenant_samples: list[tuple[float, dict[str, tuple[float, float]]]] = []

        # multikueue's worker queues: nominal GPUs per (cluster, model) and what admitted copies hold
        self.nominal: dict[tuple[str, str], float] = {}
        self.admitted: dict[tuple[str, str], float] = {}
        for c in fleet.clusters:
            for g in c.groups:
                key = (c.name, g.gpu_model)
                self.nominal[key] = self.nominal.get(key, 0.0) + g.nodes * g.gpus_per_node
                self.admitted.setdefault(key, 0.0)
        self.worker_release = {key: 0 for key in self.admitted}
        """Per worker flavor, bumped when a copy leaves it (its admitted GPUs drop)."""

        # "could it ever fit" is judged on the original clusters, empty, with the full request (all policies)
        self._empty = Catalog(stale_after_s=math.inf)
        for c in fleet.clusters:
            levels = agent_levels(c)
            self._empty.apply_report(
                InventoryReport(
                    c.name, 1, True, 0.0, tuple(nodes_of(c)), meta=ClusterMeta(c.name, c.region, c.role, levels=levels)
                ),
                0.0,
            )
        self._ever: dict[tuple[object, ...], tuple[str, ...]] = {}
        self._flavor_fit: dict[tuple[str, int], tuple[str, ...]] = {}
        self._kind_fit: dict[tuple[int, int], bool] = {}
        self._kind_node: dict[int, Node] = {}
        for c in fleet.clusters:
            for node in nodes_of(c):
                self._kind_node.setdefault(node_kind[node.name], node)
        self._kind_model = {k: n.gpu_model or "" for k, n in self._kind_node.items()}

        self._order = names
        self.jobs: dict[str, FastJob] = {}
        self.queued: dict[str, FastJob] = {}
        for seq, item in enumerate(sorted(items, key=lambda i: (i.arrival_s, i.name))):
            self.jobs[item.name] = self._job(item, seq)
        self.remaining = len(self.jobs)
        self.running = 0
        """Jobs running now (a gang cycling through dispatch and timeout is not progress)."""
        self.last_arrival = max((i.arrival_s for i in items), default=0.0)
        self.last_progress = 0.0
        self.stopped = ""

    # ------------------------------------------------------------------ setup helpers

    def _scorer(self) -> Policy | None:
        if self.params.pod_scoring == "bestfit":
            return None
        if self.params.pod_scoring != "extender":
            raise ValueError(f"pod_scoring is 'extender' or 'bestfit', not {self.params.pod_scoring!r}")
        from extender.config import ExtenderConfig
        from extender.snapshot import make_scoring_policy

        return make_scoring_policy(ExtenderConfig())  # one per cluster: its memo is per node table

    def _code(self, shape: PodShape) -> int:
        return self._shapes.setdefault(shape, len(self._shapes))

    def _job(self, item: WorkItem, seq: int) -> FastJob:
        full = request_of(item)
        req = full
        excluded: tuple[str, ...] = ()
        if self.policy in ("aggregate", "round-robin", "multikueue") and full.required_level:
            # Topology-blind choice; clusters that lack the level are left out as a cluster selector would.
            level = full.required_level
            req = dataclasses.replace(full, required_level=None)
            excluded = tuple(
                c.name for c in self.fleet.clusters if all(level not in (lv.name, lv.key) for lv in agent_levels(c))
            )
        shape = full.pod_sets[0].shape
        return FastJob(item, seq, req, full, shape, self._code(shape), Outcome(item, item.arrival_s), excluded)

    # ------------------------------------------------------------------ timed events

    def _at(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, payload))

    def _note(self, event: str, job: str, detail: str = "") -> None:
        self.log.append((self.now, event, job, detail))

    def _wake(self) -> None:
        """Something the placer reads changed: a round at the next cycle boundary."""
        cycle = self.params.cycle_s
        k = math.ceil(self.now / cycle - 1e-9)
        t = k * cycle
        if t <= self._last_round:
            t = (k + 1) * cycle
        if self._round_at is None or t < self._round_at:
            self._round_at = t
            self._at(t, EVENT_ROUND, t)

    def _dirty(self, cell: Cell) -> None:
        """The cell changed: its agent reports at its next report slot (multikueue decides without the catalog)."""
        if self.policy == "multikueue":
            cell.dirty.clear()
            return
        if self._report_at[cell.name] is not None:
            return
        interval, phase = self.params.report_interval_s, self._phase[cell.name]
        t = phase + math.ceil((self.now - phase) / interval - 1e-9) * interval
        if t <= self._last_report[cell.name]:
            t += interval
        self._report_at[cell.name] = t
        self._at(t, EVENT_REPORT, cell)
