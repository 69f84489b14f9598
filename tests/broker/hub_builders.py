"""Test helpers for the broker's gRPC half: certificates, policy files, a running broker, a scripted agent."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from broker.api import serde
from broker.config import BrokerConfig, ListenerConfig, MtlsListenerConfig, TlsConfig
from broker.hub import Hub
from broker.launcher.client import BrokerClient
from broker.server import Servers, serve
from fleetsim.pki import Pki
from fleetsim.processes import wait_for
from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import cluster_service_pb2_grpc as cs_grpc
from tandem.v1 import common_pb2, job_pb2
from tandem.v1 import inventory_pb2 as inv

TOKENS = {"alpha": "token-alpha", "beta": "token-beta", "gamma": "token-gamma", "admin": "token-admin"}
LEVELS = (
    ("zone", "topology.kubernetes.io/zone"),
    ("rack", "network.example.com/rack"),
    ("host", "kubernetes.io/hostname"),
)
H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"


# ----------------------------------------------------------------------------- policy


def policy_doc(*, names: Iterable[str] = ("alpha", "beta"), **tenant_overrides: dict[str, Any]) -> dict[str, Any]:
    tenants = []
    for name in names:
        t: dict[str, Any] = {
            "name": name,
            "token_sha256": [hashlib.sha256(TOKENS[name].encode()).hexdigest()],
            "priority_bands": ["default", "high"],
            "rate_limit": {"rate_per_s": 10000, "burst": 10000},
        }
        t.update(tenant_overrides.get(name, {}))
        tenants.append(t)
    return {"tenants": tenants, "admins": {"token_sha256": [hashlib.sha256(TOKENS["admin"].encode()).hexdigest()]}}


def write_policy(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(doc))


# ----------------------------------------------------------------------------- specs and inventory


def template(gpus: int = 0, **spec_extra: Any) -> str:
    import json

    container: dict[str, Any] = {"name": "main", "image": "trainer:1"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return json.dumps({"spec": {"containers": [container], **spec_extra}})


def spec(
    gpus: int = 8,
    replicas: int = 1,
    *,
    models: Iterable[str] = (),
    level: str = "",
    cpu: int = 0,
    band: str = "",
    priority: int = 0,
    clusters: Iterable[str] = (),
    preemptible: bool = False,
    min_available: int | None = None,
) -> job_pb2.JobSpec:
    s = job_pb2.JobSpec(priority=priority, priority_band=band, preemptible=preemptible)
    ps = s.pod_sets.add(name="workers", count=replicas, pod_template_json=template(gpus))
    ps.shape.gpu_count = gpus
    ps.shape.allowed_gpu_models.extend(models)
    ps.shape.cpu_milli = cpu
    if level:
        s.topology.required_level = level
    s.cluster_selector.clusters.extend(clusters)
    if min_available is not None:
        s.min_available = min_available
    return s


def node(
    name: str,
    *,
    gpus: int = 8,
    free: int | None = None,
    model: str = H100,
    rack: str = "r1",
    zone: str = "z1",
    cpu: int = 64000,
    ready: bool = True,
) -> inv.NodeInventory:
    free = gpus if free is None else free
    n = inv.NodeInventory(name=name, ready=ready, gpu_model=model if gpus else "", gpu_memory_mib=81559)
    n.labels.update(
        {
            "topology.kubernetes.io/zone": zone,
            "network.example.com/rack": rack,
            "kubernetes.io/hostname": name,
            "nvidia.com/gpu.product": model,
        }
    )
    for seg in (zone, rack, name):
        n.topology_path.segments.add(value=seg)
    n.allocatable.cpu_milli, n.allocatable.memory_bytes, n.allocatable.pods = cpu, 512 << 30, 110
    n.free.cpu_milli, n.free.memory_bytes, n.free.pods = cpu, 512 << 30, 110
    for i in range(gpus):
        n.gpus.add(
            index=i,
            model=model,
            memory_mib=81559,
            milli_in_use=0 if i < free else 1000,
            health=inv.GPU_HEALTH_HEALTHY,
            mig_mode=inv.MIG_MODE_DISABLED,
        )
    return n


# ----------------------------------------------------------------------------- the broker


@dataclass
class Broker:
    servers: Servers
    pki: Pki
    tmp: Path
    cfg: BrokerConfig
    clients: list[BrokerClient] = field(default_factory=list)

    @property
    def hub(self) -> Hub:
        return self.servers.hub

    @property
    def tenant_addr(self) -> str:
        return f"127.0.0.1:{self.servers.tenant_port}"

    @property
    def tenant_mtls_addr(self) -> str:
        assert self.servers.tenant_mtls_port is not None
        return f"127.0.0.1:{self.servers.tenant_mtls_port}"

    @property
    def agent_addr(self) -> str:
        return f"127.0.0.1:{self.servers.agent_port}"

    def client(self, who: str | None = "alpha", **kw: Any) -> BrokerClient:
        c = BrokerClient(self.tenant_addr, token=TOKENS[who] if who else None, **kw)
        self.clients.append(c)
        return c

    def agent(self, cluster: str, *, cert_cn: str | None = None) -> ScriptedAgent:
        cert, key = self.pki.issue(cert_cn or cluster)
        return ScriptedAgent(self.agent_addr, cluster, self.pki.ca_pem, cert.read_bytes(), key.read_bytes())

    async def close(self) -> None:
        for c in self.clients:
            await c.close()
        await self.servers.stop(0.5)


async def start_broker(
    tmp: Path,
    *,
    policy: dict[str, Any] | None = None,
    clock: Callable[[], float] | None = None,
    tenant_tls: bool = False,
    tenant_client_certs: bool = False,
    tenant_mtls_port: bool = False,
    **cfg_fields: Any,
) -> Broker:
    pki = Pki.create(tmp)
    scert, skey = pki.issue("broker", server=True)
    write_policy(tmp / "policy.yaml", policy or policy_doc())
    tenant_tls_cfg = TlsConfig()
    if tenant_tls or tenant_client_certs:
        tenant_tls_cfg = TlsConfig(
            cert_file=str(scert),
            key_file=str(skey),
            client_ca_file=str(pki.dir / "test-root-ca.pem") if tenant_client_certs else None,
            require_client_cert=tenant_client_certs,
        )
    if tenant_mtls_port:  # token launchers on the TLS tenant port, certificate launchers on a second one
        tenant_tls_cfg = TlsConfig(cert_file=str(scert), key_file=str(skey))
        cfg_fields["tenant_mtls_listener"] = MtlsListenerConfig(
            address="127.0.0.1:0",
            tls=TlsConfig(
                cert_file=str(scert),
                key_file=str(skey),
                client_ca_file=str(pki.dir / "test-root-ca.pem"),
                require_client_cert=True,
            ),
        )
    cfg = BrokerConfig(
        tenant_listener=ListenerConfig(address="127.0.0.1:0", tls=tenant_tls_cfg),
        agent_listener=ListenerConfig(
            address="127.0.0.1:0",
            max_message_bytes=64 << 20,
            tls=TlsConfig(
                cert_file=str(scert),
                key_file=str(skey),
                client_ca_file=str(pki.dir / "test-root-ca.pem"),
                require_client_cert=True,
            ),
        ),
        metrics_port=0,
        db_path=str(tmp / "broker.db"),
        policy_path=str(tmp / "policy.yaml"),
        audit_log_path=str(tmp / "audit.jsonl"),
        policy_check_interval_s=0.0,
        **cfg_fields,
    )
    kwargs: dict[str, Any] = {}
    if clock is not None:
        kwargs["clock"] = clock
    store = Hub.store_for(cfg, **kwargs)
    hub = Hub(cfg, store, specs=serde.SPECS, **kwargs)
    servers = await serve(cfg, hub)
    return Broker(servers, pki, tmp, cfg)


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    """A running broker with the default policy, closed after the test."""
    b = await start_broker(tmp_path)
    yield b
    await b.close()


# ----------------------------------------------------------------------------- a scripted agent


class ScriptedAgent:
    """Speaks ClusterService.Connect as a cluster's agent would, one message at a time, from the test."""

    def __init__(self, addr: str, cluster: str, ca: bytes, cert: bytes, key: bytes) -> None:
        creds = grpc.ssl_channel_credentials(ca, key, cert)
        self.channel = grpc.aio.secure_channel(addr, creds, options=[("grpc.ssl_target_name_override", "localhost")])
        self.cluster = cluster
        self.seq = 0
        self.inventory_seq = 0
        self.outbox: asyncio.Queue[cs.AgentMessage | None] = asyncio.Queue()
        self.inbox: asyncio.Queue[cs.BrokerMessage | None] = asyncio.Queue()
        self.call: Any = None
        self.welcome: cs.Welcome | None = None
        self._reader: asyncio.Task[None] | None = None
        self.error: BaseException | None = None

    async def _requests(self) -> Any:
        while True:
            msg = await self.outbox.get()
            if msg is None:
                return
            yield msg

    def send(self, **body: Any) -> None:
        self.seq += 1
        self.outbox.put_nowait(cs.AgentMessage(sequence=self.seq, **body))

    async def connect(
        self,
        nodes: Iterable[inv.NodeInventory] = (),
        *,
        known: Iterable[tuple[str, int]] = (),
        region: str = "eu",
        role: str = "training",
        hello_name: str | None = None,
        snapshot: bool = True,
        log_templates: Iterable[tuple[str, str]] = (),
        epoch: int = 0,
        read_only: bool = False,
        tenants: dict[str, list[str]] | None = None,
    ) -> cs.Welcome:
        stub = cs_grpc.ClusterServiceStub(self.channel)
        self.call = stub.Connect(self._requests())
        hello = cs.Hello(
            cluster_name=hello_name or self.cluster,
            region=region,
            role=role,
            protocol_version=1,
            leader_epoch=epoch,
            leader_identity=f"{self.cluster}-agent-{epoch}",
        )
        if read_only:
            hello.capabilities.dispatch = False
        for tenant, namespaces in (tenants or {}).items():
            hello.tenant_namespaces.add(tenant=tenant, namespaces=namespaces)
        for name, url in log_templates:
            hello.log_url_templates.add(name=name, url_template=url)
        for name, key in LEVELS:
            hello.topology_levels.add(name=name, label_key=key)
        for job, attempt in known:
            ka = hello.known_attempts.add(phase=cs.WORKLOAD_PHASE_GATED)
            ka.attempt.job_id, ka.attempt.attempt = job, attempt
        self.send(hello=hello)
        self._reader = asyncio.get_running_loop().create_task(self._read())
        welcome = await self.expect("welcome")
        self.welcome = welcome
        if snapshot:
            self.snapshot(nodes)
        return welcome

    async def _read(self) -> None:
        try:
            async for msg in self.call:
                await self.inbox.put(msg)
        except grpc.aio.AioRpcError as exc:
            self.error = exc
        await self.inbox.put(None)  # type: ignore[arg-type]

    def snapshot(
        self, nodes: Iterable[inv.NodeInventory], bound: Iterable[tuple[str, int, str, int, str]] = ()
    ) -> None:
        """bound: (job, attempt, pod_set, index, node) the cluster shows bound."""
        self.inventory_seq += 1
        snap = inv.InventorySnapshot(sequence=self.inventory_seq, nodes=list(nodes))
        progress: dict[tuple[str, int], inv.ReservationProgress] = {}
        for job, attempt, pod_set, index, node_name in bound:
            p = progress.get((job, attempt))
            if p is None:
                p = snap.reservations.add()
                p.attempt.job_id, p.attempt.attempt = job, attempt
                progress[(job, attempt)] = p
            p.bound.add(pod_set=pod_set, index=index, node=node_name)
        self.send(inventory_snapshot=snap)

    def heartbeat(self) -> None:
        self.send(heartbeat=cs.Heartbeat(inventory_sequence=self.inventory_seq, leader=True))

    async def expect(self, kind: str, timeout: float = 10.0) -> Any:
        """The next broker message of `kind` (others, like acks and resync requests, are skipped)."""

        async def loop() -> Any:
            while True:
                msg = await self.inbox.get()
                if msg is None:
                    if self.error is not None:
                        raise self.error
                    raise ConnectionError("stream closed")
                if msg.WhichOneof("body") == kind:
                    return getattr(msg, kind)

        return await asyncio.wait_for(loop(), timeout)

    def accept(self, d: cs.Dispatch, namespace: str = "team") -> None:
        ack = cs.DispatchAck(accepted=True, namespace=namespace)
        ack.attempt.CopyFrom(d.attempt)
        self.send(dispatch_ack=ack)

    def reject(self, d: cs.Dispatch, nodes: Iterable[str], message: str = "does not fit") -> None:
        ack = cs.DispatchAck(accepted=False)
        ack.attempt.CopyFrom(d.attempt)
        ack.rejection.reason = job_pb2.DISPATCH_REJECT_REASON_DOES_NOT_FIT
        ack.rejection.message = message
        ack.rejection.nodes.extend(nodes)
        self.send(dispatch_ack=ack)

    def status(
        self,
        job_id: str,
        attempt: int,
        phase: int,
        *,
        replicas: int = 0,
        running: int = 0,
        outcome: int = 0,
        exit_code: int | None = None,
    ) -> None:
        w = cs.WorkloadStatus(phase=phase, outcome=outcome)
        w.attempt.job_id, w.attempt.attempt = job_id, attempt
        for i in range(replicas):
            w.replicas.add(
                pod_set="workers",
                index=i,
                phase=common_pb2.REPLICA_PHASE_RUNNING if i < running else common_pb2.REPLICA_PHASE_GATED,
            )
        if exit_code is not None:
            w.exit_code = exit_code
        self.send(workload_status=w)

    def workload(
        self,
        job_id: str,
        attempt: int,
        phase: int,
        replicas: Iterable[common_pb2.ReplicaStatus],
        *,
        namespace: str = "team",
        outcome: int = 0,
        exit_code: int | None = None,
        rendezvous: str = "",
    ) -> None:
        """A WorkloadStatus with fully described replicas (pods, nodes, phases, exits)."""
        w = cs.WorkloadStatus(phase=phase, outcome=outcome, namespace=namespace, rendezvous_address=rendezvous)
        w.attempt.job_id, w.attempt.attempt = job_id, attempt
        w.replicas.extend(replicas)
        if exit_code is not None:
            w.exit_code = exit_code
        self.send(workload_status=w)

    def feedback(
        self,
        job_id: str,
        attempt: int,
        pod_set: str,
        index: int,
        pod: str,
        time_s: float,
        refused: Iterable[tuple[str, Iterable[int], str]],
        fits: Iterable[str] = (),
    ) -> None:
        """The extender's filter outcome for one pod: refused = (node, FitReason values, message)."""
        p = cs.PodSchedulingFeedback(pod_set=pod_set, index=index, pod_name=pod)
        p.attempt.job_id, p.attempt.attempt = job_id, attempt
        p.time.FromNanoseconds(int(time_s * 1e9))
        for name, reasons, message in refused:
            p.nodes.add(node=name, fits=False, reasons=list(reasons), message=message)
        for name in fits:
            p.nodes.add(node=name, fits=True)
        self.send(scheduling_feedback=cs.SchedulingFeedback(pods=[p]))

    def cancel_ack(self, job_id: str, attempt: int) -> None:
        ack = cs.CancelAck(result=cs.CANCEL_RESULT_DELETED)
        ack.attempt.job_id, ack.attempt.attempt = job_id, attempt
        self.send(cancel_ack=ack)

    async def close(self) -> None:
        self.outbox.put_nowait(None)
        if self.call is not None:
            self.call.cancel()
        if self._reader is not None:
            self._reader.cancel()
            try:
                await self._reader
            except (asyncio.CancelledError, Exception):
                pass
        await self.channel.close()


async def eventually(pred: Callable[[], Any], timeout: float = 10.0, every: float = 0.02) -> Any:
    """Poll an async or sync predicate until it is truthy (condition wait, not a timed assertion), and return it."""
    return await wait_for(pred, timeout, "a condition", interval_s=every)


class AutoCluster:
    """A scripted cluster that runs what it is sent: accepts every dispatch, runs each gang for `run_s` once
    started, reports its nodes busy and then free, and confirms cancels at once. For steady-state tests."""

    def __init__(self, agent: ScriptedAgent, nodes: Iterable[str], *, run_s: float = 0.5) -> None:
        self.agent = agent
        self.nodes = list(nodes)
        self.run_s = run_s
        self.busy: dict[str, tuple[str, int]] = {}
        self.placed: dict[tuple[str, int], list[tuple[str, int, str, int, str]]] = {}
        self.finished = 0
        self._task: asyncio.Task[None] | None = None
        self._timers: set[asyncio.Task[None]] = set()

    def _report(self) -> None:
        bound = [b for key, bs in self.placed.items() for b in bs if any(v == key for v in self.busy.values())]
        self.agent.snapshot([node(n, free=0 if n in self.busy else 8) for n in self.nodes], bound=bound)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            msg = await self.agent.inbox.get()
            if msg is None:
                return
            kind = msg.WhichOneof("body")
            if kind == "dispatch":
                d = msg.dispatch
                key = (d.attempt.job_id, d.attempt.attempt)
                bound, index = [], 0
                for ps in d.pod_sets:
                    for n in ps.nodes:
                        for _ in range(n.replicas):
                            bound.append((key[0], key[1], ps.name, index, n.node))
                            index += 1
                self.placed[key] = bound
                self.agent.accept(d)
                self.agent.status(key[0], key[1], cs.WORKLOAD_PHASE_GATED, replicas=len(bound))
            elif kind == "start":
                key = (msg.start.attempt.job_id, msg.start.attempt.attempt)
                replicas = len(self.placed.get(key, ()))
                for b in self.placed.get(key, ()):
                    self.busy[b[4]] = key
                self.agent.status(key[0], key[1], cs.WORKLOAD_PHASE_RUNNING, replicas=replicas, running=replicas)
                self._report()
                t = asyncio.get_running_loop().create_task(self._finish(key, replicas))
                self._timers.add(t)
                t.add_done_callback(self._timers.discard)
            elif kind == "cancel":
                key = (msg.cancel.attempt.job_id, msg.cancel.attempt.attempt)
                self._free(key)
                self.agent.cancel_ack(*key)
                self._report()

    def _free(self, key: tuple[str, int]) -> bool:
        held = [n for n, k in self.busy.items() if k == key]
        for n in held:
            del self.busy[n]
        return bool(held)

    async def _finish(self, key: tuple[str, int], replicas: int) -> None:
        await asyncio.sleep(self.run_s)
        if self._free(key):
            self.agent.status(
                key[0],
                key[1],
                cs.WORKLOAD_PHASE_SUCCEEDED,
                replicas=replicas,
                running=replicas,
                outcome=job_pb2.ATTEMPT_OUTCOME_SUCCEEDED,
            )
            self.finished += 1
            self._report()

    async def stop(self) -> None:
        for t in [self._task, *self._timers]:
            if t is not None:
                t.cancel()
