"""The two grpc.aio servers (tenant and agent listeners) with TLS, health checking, reflection and graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from broker.api import serde
from broker.api.ports import AgentPorts, ApiPorts, ClusterPorts, Gate, JobPorts, QueuePorts
from broker.api.services.clusters import AgentServicer, ClusterAdminServicer
from broker.api.services.edge import register
from broker.api.services.jobs import JobServicer
from broker.config import BrokerConfig, ListenerConfig, TlsConfig
from broker.hub import Hub
from broker.web.app import WebServer
from tandem.v1 import cluster_service_pb2, cluster_service_pb2_grpc, job_service_pb2, job_service_pb2_grpc

__all__ = ["Servers", "serve"]

JOB_SERVICE = job_service_pb2.DESCRIPTOR.services_by_name["JobService"].full_name
CLUSTER_SERVICE = cluster_service_pb2.DESCRIPTOR.services_by_name["ClusterService"].full_name


def _credentials(tls: TlsConfig) -> grpc.ServerCredentials | None:
    if not tls.enabled:
        return None
    assert tls.cert_file and tls.key_file
    ca = Path(tls.client_ca_file).read_bytes() if tls.client_ca_file else None
    return grpc.ssl_server_credentials(
        [(Path(tls.key_file).read_bytes(), Path(tls.cert_file).read_bytes())],
        root_certificates=ca,
        require_client_auth=tls.mutual,  # TlsConfig refuses a client CA that would not be required
    )


def _options(lc: ListenerConfig) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", lc.max_message_bytes),
        ("grpc.max_send_message_length", lc.max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def _bind(server: grpc.aio.Server, address: str, tls: TlsConfig) -> int:
    creds = _credentials(tls)
    port: int = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind {address}")
    return port


@dataclass
class Servers:
    hub: Hub
    tenant: grpc.aio.Server
    agent: grpc.aio.Server
    tenant_port: int
    agent_port: int
    healths: tuple[Any, ...] = ()
    """Each listener's health servicer (the tenant's, the agent's): NOT_SERVING first when stopping."""
    tenant_mtls_port: int | None = None
    """The tenant server's mutual-TLS port for certificate launchers (None: not configured)."""
    web: WebServer | None = None
    """The fleet view (None: not configured)."""

    @property
    def web_port(self) -> int | None:
        return self.web.port if self.web is not None else None

    async def stop(self, grace_s: float) -> None:
        """Graceful: report NOT_SERVING, close agent streams, let in-flight calls finish, then close the store."""
        for h in self.healths:
            await h.enter_graceful_shutdown()
        if self.web is not None:  # its live streams end first: they read the store until cancelled
            await self.web.stop()
        self.hub.dispatcher.stop()
        await asyncio.gather(self.tenant.stop(grace_s), self.agent.stop(grace_s))
        in_flight = self.hub.dispatcher.in_flight()
        if in_flight:  # agent messages already taken off a stream are applied, not cut off by the store closing
            await asyncio.wait(in_flight, timeout=max(grace_s, 0.1))
        await self.hub.close()


async def serve(cfg: BrokerConfig, hub: Hub | None = None) -> Servers:
    """Start the hub and both listeners; returns once they accept connections."""
    hub = hub or Hub(cfg, Hub.store_for(cfg), specs=serde.SPECS)
    await hub.start()
    tenant = grpc.aio.server(options=_options(cfg.tenant_listener))
    agent = grpc.aio.server(options=_options(cfg.agent_listener))
    # Every method decodes its request without raising and refuses a bad one as INVALID_ARGUMENT naming the
    # field (broker.api.services.edge.register), never grpcio's UNKNOWN.
    api = api_ports(hub)  # what each servicer and the fleet view get of the hub, built once
    jobs = JobServicer(api.gate, api.jobs, api.queues)
    register(
        job_service_pb2_grpc.add_JobServiceServicer_to_server,
        jobs,
        job_service_pb2_grpc.JobServiceServicer,
        jobs.edge,
        tenant,
        checked_per_item=JobServicer.CHECKED_PER_ITEM,
    )
    # One service, two listeners: admin RPCs on the tenant side, Connect on the agents' mTLS side; the
    # other half of each answers UNIMPLEMENTED.
    admin = ClusterAdminServicer(api.gate, api.clusters)  # type: ignore[abstract]
    agents = AgentServicer(api.gate, api.agents)  # type: ignore[abstract]
    for servicer, server in ((admin, tenant), (agents, agent)):
        register(
            cluster_service_pb2_grpc.add_ClusterServiceServicer_to_server,
            servicer,
            cluster_service_pb2_grpc.ClusterServiceServicer,
            servicer.edge,
            server,
        )
    healths = []
    for server, services in ((tenant, (JOB_SERVICE, CLUSTER_SERVICE)), (agent, (CLUSTER_SERVICE,))):
        h = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(h, server)
        for name in ("",) + services:
            await h.set(name, health_pb2.HealthCheckResponse.SERVING)
        reflection.enable_server_reflection(services + (reflection.SERVICE_NAME, health.SERVICE_NAME), server)
        healths.append(h)
    tport = _bind(tenant, cfg.tenant_listener.address, cfg.tenant_listener.tls)
    # Certificate launchers get a port of their own on the same server: gRPC cannot make a client
    # certificate optional on one port, and a required one would turn token launchers away (H-5).
    mtls = cfg.tenant_mtls_listener
    mport = _bind(tenant, mtls.address, mtls.tls) if mtls is not None else None
    aport = _bind(agent, cfg.agent_listener.address, cfg.agent_listener.tls)
    await tenant.start()
    await agent.start()
    if cfg.metrics_port:
        with contextlib.suppress(OSError):
            hub.metrics.serve(cfg.metrics_port)
    web = None
    if cfg.web is not None:
        web = WebServer(api, cfg.web)
        await web.start()
    return Servers(hub, tenant, agent, tport, aport, tuple(healths), mport, web)


def api_ports(hub: Hub) -> ApiPorts:
    """The bundles of `hub`'s parts each servicer and the fleet view get, built once here (the api room never sees the
    hub)."""
    return ApiPorts(
        gate=Gate(hub.authz, hub.audit),
        jobs=JobPorts(
            store=hub.store,
            policy=hub.policy,
            clock=hub.clock,
            grace_s=hub.cfg.grace_period_s,
            max_response_bytes=hub.cfg.tenant_listener.max_message_bytes,
            queue=hub.placer,
            reads=hub.placer.book,
            reprioritised=hub.reprioritised,
            deliver_for=hub.dispatcher.deliver_for,
            deliver_all=hub.deliver_all,
            fleet_view=hub.fleet_view,
            submissions=hub.metrics.submissions,
        ),
        queues=QueuePorts(reads=hub.placer.book, policy=hub.policy, store=hub.store, clock=hub.clock),
        clusters=ClusterPorts(
            policy=hub.policy,
            fleet_view=hub.fleet_view,
            cordon_reasons=hub.cordon_reasons,
            set_cordon=hub.set_cordon,
        ),
        agents=AgentPorts(hub.dispatcher, hub.clock),
    )
