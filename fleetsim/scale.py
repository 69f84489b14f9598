"""Scale mode (FLEET-NOTES S-5): many clusters as synthetic agents in one process, the real broker in its own.

No API servers and no extenders. Each synthetic agent speaks `ClusterService.Connect` over mutual TLS with
the real agent's stream (`extender.agent.stream`) and message builders (`extender.agent.wire`): a Hello with
its cluster name, region, role, topology levels and tenant namespaces; a full inventory snapshot; deltas
when pods bind or finish; heartbeats. It accepts every Dispatch, reports the pods gated, then bound and
running after the broker's Start, and after a while succeeded, so capacity frees again.

Inventories are recorded, not invented: real-format Node objects (the HGX H100 node of
tests/fixtures/cluster.json, renamed, with rack and block labels) go once through the extender's own
`Inventory` and the agent's encoder with the default label allow-list (A-21). The encoded NodeInventory
bytes, free and with one 8-GPU pod bound, are replayed for every cluster with only the cluster part of the
node names rewritten.

Measured on the broker process: CPU (/proc/<pid>/stat), RSS (/proc/<pid>/status VmRSS) and the Prometheus
histograms it serves (`tandem_broker_decision_seconds`, `tandem_broker_time_to_placement_seconds`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import math
import os
import random
import time
import urllib.request
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from broker.launcher.client import BrokerClient, SubmitItem
from extender.agent import wire
from extender.agent.attempts import rendezvous_address
from extender.agent.config import AgentConfig
from extender.agent.encode import LabelFilter, ReportBuilder
from extender.agent.model import AttemptKey, Order
from extender.agent.status import ReplicaPhase, ReplicaView
from extender.agent.stream import Stream, StreamClosed, open_channel
from extender.config import ExtenderConfig
from extender.inventory import KINDS, Inventory
from fleetsim.harness import REPO, BrokerEndpoint, BrokerProcess, free_port, tenancy_policy, wait_for
from fleetsim.model import TenantSpec, WorkItem
from fleetsim.wire import job_spec
from placement.podspec import GPU_RESOURCE
from tandem.v1 import common_pb2, job_pb2
from tandem.v1 import inventory_pb2 as inv

__all__ = [
    "AGENT_VERSION",
    "DEFAULT_MIX",
    "FIXTURE",
    "FleetLayout",
    "FleetTally",
    "Histogram",
    "JobKind",
    "Phase",
    "PhaseResult",
    "Placement",
    "RecordedInventory",
    "ScaleBroker",
    "ScaleResult",
    "Submission",
    "SyntheticAgent",
    "SyntheticFleet",
    "connect_fleet",
    "histogram",
    "job_specs",
    "machine_busy_s",
    "percentile",
    "process_cpu_s",
    "process_peak_rss_bytes",
    "process_rss_bytes",
    "record_inventory",
    "run_scale",
    "scrape_metrics",
    "start_broker",
    "submit_steady",
]

FIXTURE = REPO / "tests" / "fixtures" / "cluster.json"
FIXTURE_NODE = "h100-r1-n1"
"""The fixture's HGX H100 node (8 x H100 80GB, 192 CPUs, 2 TiB), the shape every synthetic node takes."""
GPUS_PER_NODE = 8
REPLICA_GPUS = 8
"""Every replica of the scale mix takes a whole node's GPUs, so a node is either free or busy: the two
recorded variants of each node."""
REPLICA_CPU_MILLI = 96_000
REPLICA_MEMORY = 1 << 40
AGENT_VERSION = "0.2.0+synthetic"
KUBERNETES_VERSION = "v1.35.2"
ADMIN = "scale-admin"
DECISION_METRIC = "tandem_broker_decision_seconds"
PLACEMENT_METRIC = "tandem_broker_time_to_placement_seconds"


# ----------------------------------------------------------------------------- measurement helpers


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc; NaN when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def machine_busy_s() -> float:
    """CPU seconds every core of the machine spent busy since boot (/proc/stat: all but idle and iowait), so
    a phase can say how much CPU processes other than the broker and the agents took meanwhile."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _status_kib(pid: int, field_name: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def process_rss_bytes(pid: int) -> int:
    """Resident set size of a process (VmRSS of /proc/<pid>/status; 0 when it is gone)."""
    return _status_kib(pid, "VmRSS") * 1024


def process_peak_rss_bytes(pid: int) -> int:
    """Peak resident set size of a process (VmHWM; 0 when it is gone)."""
    return _status_kib(pid, "VmHWM") * 1024


def percentile(xs: Iterable[float], p: float) -> float:
    """The nearest-rank `p`th percentile (0 for no values)."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] if s else 0.0


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram as scraped: cumulative counts per upper bound (the last bound is +Inf)."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float

    def minus(self, earlier: Histogram) -> Histogram:
        """What was observed since `earlier` (same buckets)."""
        before = dict(earlier.buckets)
        return Histogram(
            tuple((le, c - before.get(le, 0.0)) for le, c in self.buckets),
            self.count - earlier.count,
            self.sum - earlier.sum,
        )

    def quantile(self, q: float) -> float:
        """As PromQL's histogram_quantile: linear within the bucket holding the rank (NaN when empty; the
        highest finite bound when the rank falls in +Inf)."""
        if self.count <= 0 or not self.buckets:
            return float("nan")
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(le):
                    return lower
                inside = cumulative - below
                return lower + (le - lower) * ((rank - below) / inside if inside > 0 else 1.0)
            lower, below = le, cumulative
        return lower

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count > 0 else float("nan")


EMPTY_HISTOGRAM = Histogram((), 0.0, 0.0)


def scrape_metrics(url: str, timeout_s: float = 10.0) -> str:
    """The text exposition of a metrics endpoint (blocking: call it in a thread)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return str(resp.read().decode())


def histogram(text: str, name: str) -> Histogram:
    """One unlabelled histogram of a text exposition (EMPTY_HISTOGRAM when absent)."""
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        buckets: list[tuple[float, float]] = []
        count = total = 0.0
        for s in family.samples:
            if s.name.endswith("_bucket"):
                buckets.append((float(s.labels["le"]), float(s.value)))
            elif s.name.endswith("_count"):
                count = float(s.value)
            elif s.name.endswith("_sum"):
                total = float(s.value)
        return Histogram(tuple(sorted(buckets)), count, total)
    return EMPTY_HISTOGRAM


# ----------------------------------------------------------------------------- the fleet's shape


@dataclass(frozen=True, slots=True)
class FleetLayout:
    """`clusters` identical clusters of `nodes` HGX nodes each: racks of `nodes_per_rack` consecutive nodes,
    blocks of `racks_per_block` racks, one zone. Cluster names have one width, so renaming a recorded node
    never changes a length inside the encoded bytes."""

    clusters: int = 100
    nodes: int = 1000
    nodes_per_rack: int = 16
    racks_per_block: int = 8
    region: str = "region-1"
    """The fixture node's region label (every cluster is in it)."""
    role: str = "training"
    zone: str = "zone-a"
    tenant: str = "scale"
    namespace: str = "scale-jobs"

    @property
    def _width(self) -> int:
        return max(3, len(str(self.clusters - 1)))

    def cluster_name(self, k: int) -> str:
        return f"sc{k:0{self._width}d}"

    def cluster_names(self) -> list[str]:
        return [self.cluster_name(k) for k in range(self.clusters)]

    def node_name(self, cluster: str, i: int) -> str:
        return f"{cluster}-n{i:0{max(4, len(str(self.nodes - 1)))}d}"

    def rack_of(self, i: int) -> str:
        return f"r{i // self.nodes_per_rack:03d}"

    def block_of(self, i: int) -> str:
        return f"b{i // (self.nodes_per_rack * self.racks_per_block):02d}"

    @property
    def gpus_per_cluster(self) -> int:
        return self.nodes * GPUS_PER_NODE


# ----------------------------------------------------------------------------- recorded inventory


def _node_object(base: Mapping[str, Any], layout: FleetLayout, cluster: str, i: int) -> dict[str, Any]:
    node: dict[str, Any] = copy.deepcopy(dict(base))
    meta = node["metadata"]
    name = layout.node_name(cluster, i)
    meta["name"] = name
    meta["uid"] = str(uuid.uuid5(uuid.NAMESPACE_DNS, name))
    meta["labels"].update(
        {
            "kubernetes.io/hostname": name,
            "topology.kubernetes.io/zone": layout.zone,
            "topology.kubernetes.io/region": layout.region,
            "network.example.com/block": layout.block_of(i),
            "network.example.com/rack": layout.rack_of(i),
        }
    )
    address = f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
    node["status"]["addresses"] = [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}]
    return node


def _replica_pod(layout: FleetLayout, node: str, i: int) -> dict[str, Any]:
    """A running pod holding one replica's resources (what a bound gang pod takes on its node)."""
    resources = {"cpu": f"{REPLICA_CPU_MILLI}m", "memory": str(REPLICA_MEMORY), GPU_RESOURCE: str(REPLICA_GPUS)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"replica-{i}", "namespace": layout.namespace, "uid": f"replica-{i}"},
        "spec": {
            "nodeName": node,
            "schedulerName": "tandem-scheduler",
            "restartPolicy": "Never",
            "containers": [
                {"name": "main", "image": "trainer:1", "resources": {"requests": resources, "limits": dict(resources)}}
            ],
        },
        "status": {"phase": "Running"},
    }


def _encoded(
    config: ExtenderConfig, labels: LabelFilter, nodes: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]]
) -> list[bytes]:
    """The nodes as the agent reports them: the extender's inventory, then the agent's snapshot encoder."""
    inventory = Inventory(config)
    for kind in KINDS:
        inventory.replace(kind, nodes if kind == "Node" else pods if kind == "Pod" else [])
    facts = {f.name: f for f in inventory.snapshot().facts}
    report = ReportBuilder(labels).snapshot([facts[n["metadata"]["name"]] for n in nodes], [], 0.0)
    return [n.SerializeToString(deterministic=True) for n in report.nodes]


_NAME_OCCURRENCES = 3
"""A reported node's name appears as its name, its hostname label and the host segment of its topology path."""


@dataclass(frozen=True)
class RecordedInventory:
    """One cluster's nodes as the agent's encoder produced them, under the first cluster's name: per node the
    bytes with nothing bound (`free`) and with one replica bound (`busy`)."""

    layout: FleetLayout
    free: tuple[bytes, ...]
    busy: tuple[bytes, ...]
    record_s: float
    """Time the recording took (extender inventory + encoder, both variants)."""
    raw_labels: int
    """Labels on the fixture node; the reported ones are the allow-list's subset."""
    reported_labels: int
    untrimmed_snapshot_bytes: int
    """What one cluster's snapshot would weigh with every label reported (LabelFilter.everything())."""
    _snapshot_nodes: bytes = field(default=b"", repr=False)

    @property
    def template_cluster(self) -> str:
        return self.layout.cluster_name(0)

    @property
    def snapshot_bytes(self) -> int:
        """One cluster's snapshot nodes on the wire."""
        return len(self._snapshot_nodes)

    def _rename(self, data: bytes, cluster: str) -> bytes:
        if cluster == self.template_cluster:
            return data
        old, new = f"{self.template_cluster}-n".encode(), f"{cluster}-n".encode()
        assert len(old) == len(new), "cluster names must share one width"
        return data.replace(old, new)

    def node(self, cluster: str, i: int, bound_gpus: int) -> bytes:
        """NodeInventory bytes of node `i` of `cluster` with `bound_gpus` GPUs held by bound pods."""
        if bound_gpus not in (0, REPLICA_GPUS):
            raise ValueError(f"only free and {REPLICA_GPUS}-GPU-bound nodes were recorded, not {bound_gpus}")
        return self._rename((self.busy if bound_gpus else self.free)[i], cluster)

    def snapshot(
        self,
        cluster: str,
        sequence: int,
        now: float,
        bound: Mapping[int, int] | None = None,
        reservations: Iterable[inv.ReservationProgress] = (),
        applied_broker_sequence: int = 0,
    ) -> inv.InventorySnapshot:
        """The cluster's full report; nodes with bound pods (index -> GPUs) take their busy bytes."""
        snap = inv.InventorySnapshot(
            sequence=sequence, reservations=list(reservations), applied_broker_sequence=applied_broker_sequence
        )
        snap.observe_time.FromNanoseconds(int(now * 1e9))
        if not bound:
            snap.MergeFromString(self._rename(self._snapshot_nodes, cluster))  # the recorded report as sent
        else:
            for i in range(self.layout.nodes):
                snap.nodes.add().MergeFromString(self.node(cluster, i, bound.get(i, 0)))
        return snap


def record_inventory(layout: FleetLayout, fixture: Path = FIXTURE, node_name: str = FIXTURE_NODE) -> RecordedInventory:
    """Record one cluster's nodes through the extender's inventory and the agent's encoder, default label
    allow-list (the extender's topology keys + GPU facts + well-known placement labels)."""
    t0 = time.perf_counter()
    base = next(
        o
        for o in json.loads(fixture.read_text())["items"]
        if o.get("kind") == "Node" and o["metadata"]["name"] == node_name
    )
    config = ExtenderConfig()
    labels = LabelFilter.build(config.topology.keys)
    cluster = layout.cluster_name(0)
    nodes = [_node_object(base, layout, cluster, i) for i in range(layout.nodes)]
    free = _encoded(config, labels, nodes, [])
    pods = [_replica_pod(layout, n["metadata"]["name"], i) for i, n in enumerate(nodes)]
    busy = _encoded(config, labels, nodes, pods)
    record_s = time.perf_counter() - t0
    pattern = f"{cluster}-n".encode()
    for data in free + busy:  # renaming rewrites exactly the name, the hostname label and the host segment
        if data.count(pattern) != _NAME_OCCURRENCES:
            raise ValueError(f"a recorded node holds {pattern!r} {data.count(pattern)} times, not {_NAME_OCCURRENCES}")
    untrimmed = _encoded(config, LabelFilter.everything(), nodes[:1], [])[0]
    reported = inv.NodeInventory.FromString(free[0])
    snapshot_nodes = inv.InventorySnapshot(nodes=[inv.NodeInventory.FromString(b) for b in free]).SerializeToString(
        deterministic=True
    )
    return RecordedInventory(
        layout,
        tuple(free),
        tuple(busy),
        record_s,
        len(base["metadata"]["labels"]),
        len(reported.labels),
        len(untrimmed) * layout.nodes,
        snapshot_nodes,
    )


# ----------------------------------------------------------------------------- what the agents saw


@dataclass(frozen=True, slots=True)
class Placement:
    """A job's first dispatch as its cluster received it."""

    job_id: str
    attempt: int
    cluster: str
    nodes: tuple[str, ...]
    racks: frozenset[str]
    blocks: frozenset[str]
    received: float
    """time.monotonic() at the agent."""


@dataclass
class FleetTally:
    """What every synthetic agent saw and did, for the measurements and the checks."""

    placements: dict[str, Placement] = field(default_factory=dict)
    dispatches: int = 0
    redispatches: int = 0
    """Dispatches of a job after its first (another attempt: rejected, timed out or re-planned)."""
    overcommits: list[str] = field(default_factory=list)
    """A node handed more GPUs than it has (or a node the cluster does not have): must stay empty."""
    held_gpus: dict[str, int] = field(default_factory=dict)
    peak_gpus: dict[str, int] = field(default_factory=dict)
    started: int = 0
    finished: int = 0
    finished_at: list[float] = field(default_factory=list)
    """time.monotonic() of every attempt's end at its agent."""
    cancelled: int = 0
    stream_errors: list[str] = field(default_factory=list)
    messages_sent: int = 0

    def hold(self, cluster: str, gpus: int) -> None:
        held = self.held_gpus[cluster] = self.held_gpus.get(cluster, 0) + gpus
        self.peak_gpus[cluster] = max(self.peak_gpus.get(cluster, 0), held)


# ----------------------------------------------------------------------------- one synthetic agent


@dataclass
class _Attempt:
    order: Order
    replicas: tuple[tuple[str, int, str], ...]
    """(pod set, index, node) of every replica."""
    gpus: dict[str, int]
    """node -> GPUs the attempt takes there."""
    bound: bool = False
    reserved: bool = True
    """Its reservation ConfigMap exists: from the accept until a report has shown every replica bound (the agent
    then deletes it, as every replica runs)."""
    started_at: float | None = None
    finish: asyncio.TimerHandle | None = None


class SyntheticAgent:
    """One cluster's agent without a cluster: the real agent's protocol over the real wire, pods that bind the
    moment the broker says Start and finish `run_seconds` later."""

    def __init__(
        self,
        name: str,
        recorded: RecordedInventory,
        tally: FleetTally,
        *,
        run_seconds: tuple[float, float],
        coalesce_s: float,
        rng: random.Random,
    ) -> None:
        self.name = name
        self.recorded = recorded
        self.layout = recorded.layout
        self.tally = tally
        self.run_seconds = run_seconds
        self.coalesce_s = coalesce_s
        self.rng = rng
        self.index = {self.layout.node_name(name, i): i for i in range(self.layout.nodes)}
        self.held: dict[int, int] = {}
        """node index -> GPUs dispatched there and not finished."""
        self.bound: dict[int, int] = {}
        """node index -> GPUs of bound (running) pods: what the inventory shows."""
        self.attempts: dict[AttemptKey, _Attempt] = {}
        self.dirty: set[int] = set()
        self.reservations_changed = False
        self.inventory_sequence = 0
        self.config: AgentConfig | None = None
        self.stream: Stream | None = None
        self.heartbeat_s = 5.0
        self._channel: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False

    # ------------------------------------------------------------------ the link

    async def connect(self, broker_addr: str, cert: Path, key: Path, ca: Path, timeout_s: float = 120.0) -> None:
        """Hello -> Welcome, then the full snapshot; the reader and reporter run until `close`."""
        self.config = AgentConfig(
            cluster_name=self.name,
            region=self.layout.region,
            role=self.layout.role,
            broker=broker_addr,
            tls_cert_file=cert,
            tls_key_file=key,
            tls_ca_file=ca,
            tenants={self.layout.tenant: [self.layout.namespace]},
            coalesce_s=self.coalesce_s,
        )
        self._channel = open_channel(self.config)
        self.stream = Stream(self._channel, self.config, time.time)
        hello = wire.hello(
            self.config,
            [],
            epoch=1,
            identity=f"{self.name}-synthetic_0",
            instance_id=uuid.uuid4().hex[:12],
            kubernetes_version=KUBERNETES_VERSION,
            agent_version=AGENT_VERSION,
            dispatch=True,
            dra_enabled=False,
        )
        welcome = await self.stream.open(hello, timeout_s)
        self.heartbeat_s = welcome.heartbeat_s
        self._send_snapshot()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._read(), name=f"{self.name}-read"),
            loop.create_task(self._report_loop(), name=f"{self.name}-report"),
        ]

    def _send(self, **body: Any) -> int:
        stream = self.stream
        if stream is None or stream.closed:
            return 0
        try:
            seq = stream.send(**body)
        except StreamClosed:
            return 0
        self.tally.messages_sent += 1
        return seq

    async def _read(self) -> None:
        assert self.stream is not None
        try:
            async for sequence, msg in self.stream.messages():
                self._on_message(msg)
                self.stream.applied_upto(sequence)
        except StreamClosed as e:
            if not self._closing:
                self.tally.stream_errors.append(f"{self.name}: {e}")
        except Exception as e:
            self.tally.stream_errors.append(f"{self.name}: reader failed: {e!r}")

    def _on_message(self, msg: wire.Inbound | wire.WireError) -> None:
        if isinstance(msg, wire.WireError):  # as the agent: an unreadable Dispatch is rejected, naming the field
            if msg.key is not None:
                rejection = wire.Rejection("TEMPLATE_INVALID", str(msg))
                self._send(dispatch_ack=wire.dispatch_ack(msg.key, rejection=rejection))
        elif isinstance(msg, Order):
            self._dispatch(msg)
        elif isinstance(msg, wire.StartMsg):
            self._start(msg.key)
        elif isinstance(msg, wire.CancelMsg):
            self._cancel(msg.key)
        elif isinstance(msg, wire.ResyncMsg):
            if msg.inventory:
                self._send_snapshot()
            if msg.workloads:
                for key in list(self.attempts):
                    self._status(key)

    # ------------------------------------------------------------------ orders

    def _dispatch(self, order: Order) -> None:
        key = order.key
        namespace = self.config.namespace_for(order.tenant, order.namespace_hint) if self.config else None
        if key in self.attempts:  # a redelivered dispatch: accepted again, nothing created twice
            self._send(
                dispatch_ack=wire.dispatch_ack(
                    key, namespace=namespace or "", inventory_sequence=order.inventory_sequence
                )
            )
            return
        if namespace is None:
            self._send(
                dispatch_ack=wire.dispatch_ack(
                    key,
                    rejection=wire.Rejection(
                        "TENANT_NOT_ALLOWED", f"cluster {self.name} maps no namespace to tenant {order.tenant}"
                    ),
                )
            )
            return
        replicas: list[tuple[str, int, str]] = []
        gpus: dict[str, int] = {}
        for ps in order.pod_sets:
            for index in range(ps.count):
                node = ps.node_of(index) or ""
                replicas.append((ps.name, index, node))
                gpus[node] = gpus.get(node, 0) + ps.shape.gpus
        now = time.monotonic()
        t = self.tally
        t.dispatches += 1
        if order.job_id in t.placements:
            t.redispatches += 1
        else:
            nodes = tuple(sorted(gpus))
            idx = [self.index[n] for n in nodes if n in self.index]
            t.placements[order.job_id] = Placement(
                order.job_id,
                order.attempt,
                self.name,
                nodes,
                frozenset(self.layout.rack_of(i) for i in idx),
                frozenset(self.layout.block_of(i) for i in idx),
                now,
            )
        for node, n in gpus.items():
            i = self.index.get(node)
            if i is None:
                t.overcommits.append(f"{self.name}: {order.job_id} on unknown node {node}")
                continue
            self.held[i] = self.held.get(i, 0) + n
            if self.held[i] > GPUS_PER_NODE:
                t.overcommits.append(f"{self.name}/{node}: {self.held[i]} GPUs held after {order.job_id}")
        t.hold(self.name, sum(gpus.values()))
        self.attempts[key] = _Attempt(order, tuple(replicas), gpus)
        self.reservations_changed = True  # the agent writes a reservation ConfigMap: the next report lists it
        self._send(
            dispatch_ack=wire.dispatch_ack(key, namespace=namespace, inventory_sequence=order.inventory_sequence)
        )
        self._status(key)  # every pod created, pinned and gated at once

    def _start(self, key: AttemptKey) -> None:
        a = self.attempts.get(key)
        if a is None:
            self._send(
                workload_status=wire.workload_status(
                    wire.WorkloadReport(
                        key, "FAILED", outcome="INFRA_FAILED", message="Start for an attempt this cluster does not hold"
                    ),
                    time.time(),
                )
            )
            return
        if a.bound:
            return
        a.bound, a.started_at = True, time.time()
        for node, n in a.gpus.items():
            i = self.index.get(node)
            if i is not None:
                self.bound[i] = self.bound.get(i, 0) + n
                self.dirty.add(i)
        self.tally.started += 1
        self._status(key)
        a.finish = asyncio.get_running_loop().call_later(self.rng.uniform(*self.run_seconds), self._finish, key)

    def _release(self, a: _Attempt) -> None:
        for node, n in a.gpus.items():
            i = self.index.get(node)
            if i is None:
                continue
            self.held[i] = self.held.get(i, 0) - n
            if a.bound:
                self.bound[i] = self.bound.get(i, 0) - n
                self.dirty.add(i)
        self.tally.hold(self.name, -sum(a.gpus.values()))
        if a.reserved:
            self.reservations_changed = True

    def _finish(self, key: AttemptKey) -> None:
        a = self.attempts.get(key)
        if a is None:
            return
        self._release(a)
        self._status(key, "SUCCEEDED")
        del self.attempts[key]
        self.tally.finished += 1
        self.tally.finished_at.append(time.monotonic())

    def _cancel(self, key: AttemptKey) -> None:
        a = self.attempts.pop(key, None)
        if a is None:
            self._send(cancel_ack=wire.cancel_ack(key, "NOT_FOUND", "nothing of this attempt exists here"))
            return
        if a.finish is not None:
            a.finish.cancel()
        self._release(a)
        self.tally.cancelled += 1
        self._send(cancel_ack=wire.cancel_ack(key, "DELETED", "every pod is gone"))

    def _status(self, key: AttemptKey, end: str = "") -> None:
        """The attempt's WorkloadStatus as the agent reports it: GATED before Start, RUNNING after, then the end."""
        a = self.attempts[key]
        phase = end or ("RUNNING" if a.bound else "GATED")
        replica_phase = {"GATED": ReplicaPhase.GATED, "RUNNING": ReplicaPhase.RUNNING}.get(
            phase, ReplicaPhase.SUCCEEDED
        )
        finished = time.time() if end else None
        replicas = tuple(
            ReplicaView(
                ps,
                index,
                f"{a.order.job_name(ps)}-{index}-synth",
                node,
                replica_phase,
                exit_code=0 if end else None,
                start_time=a.started_at,
                finish_time=finished,
            )
            for ps, index, node in a.replicas
        )
        report = wire.WorkloadReport(
            key,
            phase,
            replicas,
            self.layout.namespace,
            rendezvous_address(a.order),
            outcome="SUCCEEDED" if end else "",
            exit_code=0 if end else None,
        )
        self._send(workload_status=wire.workload_status(report, time.time()))

    # ------------------------------------------------------------------ reports

    def _progress(self) -> list[inv.ReservationProgress]:
        """Every reservation the cluster holds, with the replicas bound so far. A reservation reported fully
        bound is deleted afterwards (the agent drops it once every replica runs): the next report leaves it out."""
        out = []
        for (job, attempt), a in sorted(self.attempts.items()):
            if not a.reserved:
                continue
            p = inv.ReservationProgress(attempt=common_pb2.AttemptRef(job_id=job, attempt=attempt))
            if a.bound:
                for ps, index, node in a.replicas:
                    p.bound.add(pod_set=ps, index=index, node=node)
                a.reserved = False
                self.reservations_changed = True
            out.append(p)
        return out

    def _shown(self, i: int) -> int:
        """GPUs the node's report shows in use: a node the broker overcommitted (counted in the tally) still
        shows only its own GPUs."""
        return min(self.bound.get(i, 0), GPUS_PER_NODE)

    def _send_snapshot(self) -> None:
        self.inventory_sequence += 1
        applied = self.stream.applied if self.stream else 0
        self.reservations_changed = False
        bound = {i: self._shown(i) for i, g in self.bound.items() if g}
        snap = self.recorded.snapshot(self.name, self.inventory_sequence, time.time(), bound, self._progress(), applied)
        self.dirty.clear()
        self._send(inventory_snapshot=snap)

    def _send_delta(self) -> None:
        base = self.inventory_sequence
        self.inventory_sequence += 1
        self.reservations_changed = False
        delta = inv.InventoryDelta(
            sequence=self.inventory_sequence,
            base_sequence=base,
            reservations=self._progress(),
            applied_broker_sequence=self.stream.applied if self.stream else 0,
        )
        delta.observe_time.FromNanoseconds(time.time_ns())
        for i in sorted(self.dirty):
            delta.upserted_nodes.add().MergeFromString(self.recorded.node(self.name, i, self._shown(i)))
        self.dirty.clear()
        self._send(inventory_delta=delta)

    async def _report_loop(self) -> None:
        """Changes coalesced into one delta per `coalesce_s` (as the agent), heartbeats in between."""
        last_beat = time.monotonic()
        try:
            while self.stream is not None and not self.stream.closed:
                await asyncio.sleep(self.coalesce_s)
                if self.dirty or self.reservations_changed:
                    self._send_delta()
                if time.monotonic() - last_beat >= self.heartbeat_s:
                    last_beat = time.monotonic()
                    self._send(heartbeat=wire.heartbeat(self.stream.applied, self.inventory_sequence, True))
        except Exception as e:
            self.tally.stream_errors.append(f"{self.name}: reporter failed: {e!r}")

    async def close(self) -> None:
        self._closing = True
        for a in self.attempts.values():
            if a.finish is not None:
                a.finish.cancel()
        if self.stream is not None:
            await self.stream.close()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._channel is not None:
            await self._channel.close()


@dataclass
class SyntheticFleet:
    agents: list[SyntheticAgent]
    tally: FleetTally
    connect_s: float
    """First Hello until the broker listed every cluster connected with all its nodes."""

    async def close(self) -> None:
        await asyncio.gather(*(a.close() for a in self.agents))


async def _until_listed(admin: BrokerClient, layout: FleetLayout, timeout_s: float, every_s: float = 0.2) -> None:
    """Until ListClusters shows every cluster connected, fresh, with all its nodes (polled gently: each call
    is broker work inside the measured connect)."""
    wanted = set(layout.cluster_names())
    deadline = time.monotonic() + timeout_s
    while True:
        listed = await admin.list_clusters()
        if {c.name for c in listed.clusters if c.connected and not c.stale and c.nodes == layout.nodes} >= wanted:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every cluster was listed with its {layout.nodes} nodes in {timeout_s:g} s")
        await asyncio.sleep(every_s)


async def connect_fleet(
    recorded: RecordedInventory,
    broker: BrokerEndpoint,
    admin: BrokerClient,
    *,
    run_seconds: tuple[float, float] = (10.0, 20.0),
    parallel: int = 16,
    coalesce_s: float = 0.15,
    seed: int = 0,
    timeout_s: float = 300.0,
) -> SyntheticFleet:
    """Connect one synthetic agent per cluster of the layout (`parallel` handshakes and snapshots at a time),
    each with a client certificate naming its cluster; returns once the broker (asked through `admin`) lists
    every cluster connected, fresh, with all its nodes."""
    layout = recorded.layout
    tally = FleetTally()
    rng = random.Random(seed)
    agents = [
        SyntheticAgent(
            name, recorded, tally, run_seconds=run_seconds, coalesce_s=coalesce_s, rng=random.Random(rng.random())
        )
        for name in layout.cluster_names()
    ]
    certs = {a.name: broker.pki.issue(a.name) for a in agents}  # outside the timed part
    gate = asyncio.Semaphore(parallel)

    async def one(agent: SyntheticAgent) -> None:
        async with gate:
            cert, key = certs[agent.name]
            await agent.connect(broker.agent_addr, cert, key, broker.pki.ca_file)

    t0 = time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.gather(*(one(a) for a in agents)), timeout_s)
        await _until_listed(admin, layout, timeout_s)
    except BaseException:
        await asyncio.gather(*(a.close() for a in agents))
        raise
    return SyntheticFleet(agents, tally, time.perf_counter() - t0)


# ----------------------------------------------------------------------------- jobs


@dataclass(frozen=True, slots=True)
class JobKind:
    label: str
    replicas: int
    level: str
    """Topology level every replica must share ("" = none)."""
    weight: float


DEFAULT_MIX = (
    JobKind("1 x 8 GPUs", 1, "", 0.6),
    JobKind("8 x 8 GPUs, one rack", 8, "rack", 0.3),
    JobKind("32 x 8 GPUs, one block", 32, "block", 0.1),
)


def job_specs(n: int, mix: Sequence[JobKind], tenant: str) -> list[tuple[JobKind, job_pb2.JobSpec]]:
    """`n` jobs in the mix's proportions, interleaved by smooth weighted round-robin (deterministic: the
    kinds arrive evenly spread, every kind early)."""
    total = sum(k.weight for k in mix)
    credit = [0.0] * len(mix)
    out = []
    for i in range(n):
        for j, k in enumerate(mix):
            credit[j] += k.weight
        j = max(range(len(mix)), key=lambda x: credit[x])
        credit[j] -= total
        kind = mix[j]
        item = WorkItem(
            f"scale-{i}",
            tenant,
            "gang" if kind.replicas > 1 else "batch",
            arrival_s=0.0,
            duration_s=0.0,
            replicas=kind.replicas,
            gpus=REPLICA_GPUS,
            cpu_milli=REPLICA_CPU_MILLI,
            memory_bytes=REPLICA_MEMORY,
            required_level=kind.level,
        )
        out.append((kind, job_spec(item)))
    return out


@dataclass(frozen=True, slots=True)
class Submission:
    index: int
    """Position in the submitted list."""
    job_id: str
    sent: float
    """time.monotonic() when its SubmitJobs call went out."""


async def submit_steady(
    client: BrokerClient, specs: Sequence[job_pb2.JobSpec], rate_per_s: float, job_set: str, tick_s: float = 0.05
) -> tuple[list[Submission], list[str]]:
    """Submit at `rate_per_s`: every tick one SubmitJobs call with the jobs whose time has come (calls overlap
    when the broker is slow, so the offered rate holds). Returns the accepted submissions and the refusals."""
    accepted: list[Submission] = []
    refused: list[str] = []
    calls: list[asyncio.Task[None]] = []

    async def call(first: int, batch: Sequence[job_pb2.JobSpec]) -> None:
        t = time.monotonic()
        items = [SubmitItem(f"{job_set}-{first + j}", s) for j, s in enumerate(batch)]
        for r in await client.submit(job_set, items):
            if r.job_id:
                accepted.append(Submission(first + r.index, r.job_id, t))
            else:
                refused.append(f"{r.key}: {r.error_message}")

    t0 = time.monotonic()
    done = 0
    loop = asyncio.get_running_loop()
    while done < len(specs):
        due = min(len(specs), int((time.monotonic() - t0) * rate_per_s) + 1)
        if due > done:
            calls.append(loop.create_task(call(done, specs[done:due])))
            done = due
        await asyncio.sleep(tick_s)
    await asyncio.gather(*calls)
    accepted.sort(key=lambda x: x.index)
    return accepted, refused


# ----------------------------------------------------------------------------- the broker and the run


@dataclass
class ScaleBroker:
    process: BrokerProcess
    metrics_url: str
    token: str

    @property
    def pid(self) -> int:
        assert self.process.proc is not None
        return self.process.proc.pid

    async def metrics(self) -> str:
        return await asyncio.to_thread(scrape_metrics, self.metrics_url)


async def start_broker(tmp: Path, layout: FleetLayout, **config: Any) -> ScaleBroker:
    """The real broker as its own process (`python -m broker.main --config broker.yaml`): agents' mutual-TLS
    listener, SQLite store, metrics on a free port, one tenant for the scale jobs."""
    tokens = {layout.tenant: f"{layout.tenant}-token", ADMIN: "admin-token"}
    policy = tenancy_policy([TenantSpec(layout.tenant, namespace=layout.namespace)], tokens, tokens[ADMIN])
    for t in policy["tenants"]:  # submissions come in bursts of a tick's worth
        t["rate_limit"] = {"rate_per_s": 100_000, "burst": 100_000}
    port = free_port()
    process = BrokerProcess(
        tmp, policy, tokens, admin=ADMIN, **{"metrics_port": port, "heartbeat_interval_s": 5.0, **config}
    )
    await process.start()
    return ScaleBroker(process, f"http://127.0.0.1:{port}/metrics", tokens[layout.tenant])


@dataclass(frozen=True, slots=True)
class Phase:
    """`jobs` of the mix submitted at a steady `rate_per_s`."""

    jobs: int
    rate_per_s: float


@dataclass
class PhaseResult:
    """One phase's measurements (times in seconds, from its first submission)."""

    phase: Phase
    submit_s: float = 0.0
    placed: int = 0
    place_window_s: float = 0.0
    """Until the phase's last job's first dispatch reached its cluster."""
    agents_cpu_s: float = 0.0
    """CPU of this process (the synthetic agents and the submitting client) over the placement window."""
    others_cpu_s: float = 0.0
    """CPU the rest of the machine used over the placement window (other processes compete for the cores)."""
    place_cpu_s: float = 0.0
    """Broker CPU over the placement window (submissions, decisions, commits, dispatches, the agents' replies
    and reports, and the ends of the phase's early jobs)."""
    placement_latency_s: dict[str, float] = field(default_factory=dict)
    """job id -> its SubmitJobs call until its Dispatch reached the agent."""
    decisions: Histogram = EMPTY_HISTOGRAM
    time_to_placement: Histogram = EMPTY_HISTOGRAM
    drain_s: float = 0.0
    """Until every job of the phase finished at the agents."""
    total_cpu_s: float = 0.0
    """Broker CPU until the drain: every job's whole life."""
    broker_rss_end: int = 0
    refused: list[str] = field(default_factory=list)
    final_states: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    """job id -> JobKind.label."""

    @property
    def placed_per_s(self) -> float:
        return self.placed / self.place_window_s if self.place_window_s > 0 else 0.0

    @property
    def cpu_ms_per_placed_job(self) -> float:
        return self.place_cpu_s * 1000 / self.placed if self.placed else float("nan")

    @property
    def cpu_ms_per_job_life(self) -> float:
        return self.total_cpu_s * 1000 / self.placed if self.placed else float("nan")


@dataclass
class ScaleResult:
    """Everything a scale run measured (times in seconds, sizes in bytes)."""

    layout: FleetLayout
    recorded: RecordedInventory
    mix: tuple[JobKind, ...]
    run_seconds: tuple[float, float]
    broker_rss_idle: int = 0
    connect_s: float = 0.0
    connect_cpu_s: float = 0.0
    connect_agents_cpu_s: float = 0.0
    connect_others_cpu_s: float = 0.0
    broker_rss_connected: int = 0
    idle_cpu_per_s: float = 0.0
    """Broker CPU share with the fleet connected and nothing to do (heartbeats)."""
    phases: list[PhaseResult] = field(default_factory=list)
    broker_rss_end: int = 0
    broker_rss_peak: int = 0
    agents_rss_end: int = 0
    tally: FleetTally = field(default_factory=FleetTally)


async def _states(client: BrokerClient, job_set: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    token = ""
    while True:
        page = await client.list(job_set_id=job_set, page_size=1000, page_token=token)
        for j in page.jobs:
            state = job_pb2.JobState.Name(j.status.state).removeprefix("JOB_STATE_")
            counts[state] = counts.get(state, 0) + 1
        token = page.next_page_token
        if not token:
            return counts


async def _settled_states(client: BrokerClient, job_set: str, n: int, timeout_s: float = 60.0) -> dict[str, int]:
    """The job set's states once the broker has recorded `n` ends (the last statuses may still be in flight)."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = await _states(client, job_set)
        if sum(states.get(s, 0) for s in ("SUCCEEDED", "FAILED", "CANCELLED")) >= n or time.monotonic() > deadline:
            return states
        await asyncio.sleep(0.5)


async def _run_phase(
    broker: ScaleBroker,
    client: BrokerClient,
    fleet: SyntheticFleet,
    phase: Phase,
    mix: Sequence[JobKind],
    tenant: str,
    *,
    place_timeout_s: float,
    drain_timeout_s: float,
) -> PhaseResult:
    out = PhaseResult(phase)
    pid, tally, procs = broker.pid, fleet.tally, [broker.process.as_proc()]
    specs = job_specs(phase.jobs, mix, tenant)
    job_set = f"scale-{uuid.uuid4().hex[:8]}"
    finished_before = tally.finished
    before = await broker.metrics()
    cpu0, own0, busy0, t0 = process_cpu_s(pid), process_cpu_s(os.getpid()), machine_busy_s(), time.monotonic()
    sent, out.refused = await submit_steady(client, [s for _, s in specs], phase.rate_per_s, job_set)
    out.submit_s = time.monotonic() - t0
    await wait_for(lambda: all(s.job_id in tally.placements for s in sent), place_timeout_s, "every job placed", procs)
    out.place_cpu_s = process_cpu_s(pid) - cpu0
    out.agents_cpu_s = process_cpu_s(os.getpid()) - own0
    out.others_cpu_s = max(0.0, machine_busy_s() - busy0 - out.place_cpu_s - out.agents_cpu_s)
    out.placed = len(sent)
    if sent:
        out.place_window_s = max(tally.placements[s.job_id].received for s in sent) - t0
    out.placement_latency_s = {s.job_id: tally.placements[s.job_id].received - s.sent for s in sent}
    out.kinds = {s.job_id: specs[s.index][0].label for s in sent}
    after = await broker.metrics()
    out.decisions = histogram(after, DECISION_METRIC).minus(histogram(before, DECISION_METRIC))
    out.time_to_placement = histogram(after, PLACEMENT_METRIC).minus(histogram(before, PLACEMENT_METRIC))
    await wait_for(lambda: tally.finished - finished_before >= len(sent), drain_timeout_s, "every job finished", procs)
    out.drain_s = time.monotonic() - t0
    out.total_cpu_s = process_cpu_s(pid) - cpu0
    out.broker_rss_end = process_rss_bytes(pid)
    out.final_states = await _settled_states(client, job_set, len(sent))
    return out


async def run_scale(
    workdir: Path,
    layout: FleetLayout,
    phases: Sequence[Phase],
    *,
    mix: Sequence[JobKind] = DEFAULT_MIX,
    run_seconds: tuple[float, float] = (10.0, 20.0),
    settle_s: float = 3.0,
    parallel: int = 16,
    place_timeout_s: float = 300.0,
    drain_timeout_s: float = 300.0,
    seed: int = 0,
) -> ScaleResult:
    """Record the inventory, start the broker, connect the fleet, then per phase submit its jobs at its rate
    and wait until every one was placed and has finished; the broker process is measured throughout."""
    recorded = record_inventory(layout)
    result = ScaleResult(layout, recorded, tuple(mix), run_seconds)
    broker = await start_broker(workdir, layout)
    fleet: SyntheticFleet | None = None
    pid = broker.pid
    try:
        admin = broker.process.client(ADMIN, timeout_s=60.0)
        client = broker.process.client(layout.tenant, timeout_s=60.0)
        await asyncio.sleep(1.0)  # start-up settles before the idle sample
        result.broker_rss_idle = process_rss_bytes(pid)
        cpu0, own0, busy0 = process_cpu_s(pid), process_cpu_s(os.getpid()), machine_busy_s()
        fleet = await connect_fleet(
            recorded,
            broker.process,
            admin,
            run_seconds=run_seconds,
            parallel=parallel,
            seed=seed,
            timeout_s=place_timeout_s,
        )
        result.tally = fleet.tally
        result.connect_s = fleet.connect_s
        result.connect_cpu_s = process_cpu_s(pid) - cpu0
        result.connect_agents_cpu_s = process_cpu_s(os.getpid()) - own0
        result.connect_others_cpu_s = max(
            0.0, machine_busy_s() - busy0 - result.connect_cpu_s - result.connect_agents_cpu_s
        )
        result.broker_rss_connected = process_rss_bytes(pid)
        cpu0, t0 = process_cpu_s(pid), time.monotonic()
        await asyncio.sleep(settle_s)
        result.idle_cpu_per_s = (process_cpu_s(pid) - cpu0) / (time.monotonic() - t0)
        for phase in phases:
            result.phases.append(
                await _run_phase(
                    broker,
                    client,
                    fleet,
                    phase,
                    mix,
                    layout.tenant,
                    place_timeout_s=place_timeout_s,
                    drain_timeout_s=drain_timeout_s,
                )
            )
        result.broker_rss_end = process_rss_bytes(pid)
        result.broker_rss_peak = process_peak_rss_bytes(pid)
        result.agents_rss_end = process_rss_bytes(os.getpid())
    finally:
        if fleet is not None:
            await fleet.close()
        await broker.process.stop()
    return result
