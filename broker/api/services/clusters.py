"""ClusterService servicers: the agents' Connect stream (own listener) and the admin cluster RPCs (tenant listener)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import grpc

from broker.api import serde_agent, validation
from broker.api.handlers import clusters as cluster_handlers
from broker.api.ports import AgentPorts, ClusterPorts, Gate
from broker.api.services.edge import Edge, abort, request_violations
from broker.api.services.wire import Undecodable
from broker.clusters.session import Session
from broker.domain import errors
from broker.tenancy.auth import AuditLog, Caller, Listener, Method
from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import cluster_service_pb2_grpc as cs_grpc

__all__ = ["AgentServicer", "ClusterAdminServicer", "cordon"]

_log = logging.getLogger("tandem.broker.clusters")


class AgentServicer(cs_grpc.ClusterServiceServicer):
    """Connect only; the admin RPCs are not served on the agent listener.

    A message the broker cannot read — bytes that are not an AgentMessage, or an enum number the
    negotiated protocol does not define — ends the stream with INVALID_ARGUMENT, its BadRequest naming
    `messages[<position>]` (0 = the Hello) and the field, ErrorInfo metadata the position and the last
    sequence read. Nothing of it is applied or acknowledged; the agent reconnects and the Hello
    reconciliation recovers what it carried (skipping it instead would acknowledge a report the broker
    never read). A message that reads but whose content the broker cannot apply is logged and skipped, as
    before: one bad report must not drop the cluster.
    """

    def __init__(self, gate: Gate, agents: AgentPorts) -> None:
        self.gate = gate
        self.agents = agents
        self.edge = Edge(gate, Listener.AGENT)

    async def Connect(
        self, request_iterator: AsyncIterator[cs.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[cs.BrokerMessage]:
        caller: Caller | None = None
        session: Session | None = None
        reader: asyncio.Task[None] | None = None
        refused: list[errors.InvalidArgument] = []
        try:
            caller = self.edge.caller(context, Method.CONNECT)
            first = await anext(aiter(request_iterator), None)
            bad = _unreadable(first, 0)
            if bad:
                raise _refusal(0, 0, bad)
            assert isinstance(first, cs.AgentMessage)
            if first.WhichOneof("body") != "hello":
                raise errors.InvalidArgument.fields(
                    errors.FieldViolation("messages[0].hello", "the first message must be a Hello")
                )
            session = await self.agents.sessions.open_session(
                caller, serde_agent.hello_from_proto(first.hello), first.sequence
            )
            self.gate.audit.record(caller, Method.CONNECT, "ok", session=session.session_id)
            reader = asyncio.get_running_loop().create_task(
                self._read(session, request_iterator, first.sequence, refused)
            )
            sequence = 0
            while True:
                out = await session.out.get()
                if out is None:
                    break
                sequence += 1
                yield serde_agent.broker_message(sequence, self.agents.clock(), out)
            if refused:
                await abort(context, refused[0])
            if session.aborted:  # a newer leader's stream took over: tell this agent why (ABORTED)
                await abort(
                    context, errors.Aborted(session.aborted, details=errors.ErrorDetails(reason="STREAM_SUPERSEDED"))
                )
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            if session is None:
                await self.edge.fail(context, exc, Method.CONNECT, caller)
            _log.warning("agent stream ended with error", extra={"cluster": session.cluster, "error": repr(exc)})
        finally:
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await reader
            if session is not None:
                self.agents.sessions.close_session(session)

    async def _read(
        self,
        session: Session,
        it: AsyncIterator[cs.AgentMessage | Undecodable],
        last: int,
        refused: list[errors.InvalidArgument],
    ) -> None:
        """Apply the agent's messages after the Hello; stop at the first one the broker cannot read (the
        servicer then ends the stream with `refused`)."""
        position = 0
        try:
            async for msg in it:
                position += 1
                bad = _unreadable(msg, position)
                if bad:
                    refused.append(_refusal(position, last, bad))
                    _log.warning(
                        "unreadable agent message ends the stream",
                        extra={
                            "cluster": session.cluster,
                            "position": position,
                            "after_sequence": last,
                            "fields": [v.field for v in bad],
                        },
                    )
                    return
                assert isinstance(msg, cs.AgentMessage)
                last = msg.sequence
                try:
                    body = serde_agent.agent_message(msg, session.cluster, self.agents.clock())
                    await self.agents.sessions.receive(session, msg.sequence, body)
                except Exception:
                    _log.exception("agent message failed", extra={"cluster": session.cluster})
        except grpc.aio.AbortError:
            _log.info("agent stream aborted by the broker", extra={"cluster": session.cluster})
        except Exception as exc:
            _log.warning(
                "agent stream read ended", extra={"cluster": session.cluster, "error": repr(exc)}, exc_info=True
            )
        finally:
            session.close()


def _unreadable(msg: cs.AgentMessage | Undecodable | None, position: int) -> list[errors.FieldViolation]:
    """Why message `position` of an agent stream cannot be read (field paths `messages[<position>]...`)."""
    root = f"messages[{position}]"
    if msg is None:
        return [errors.FieldViolation(f"{root}.hello", "the stream must start with a Hello")]
    return request_violations(msg, root=root)


def _refusal(position: int, last_sequence: int, bad: list[errors.FieldViolation]) -> errors.InvalidArgument:
    what = "; ".join(f"{v.field}: {v.description}" for v in bad)
    return errors.InvalidArgument(
        f"agent message {position} (after sequence {last_sequence}) cannot be read: {what}",
        details=errors.ErrorDetails(
            reason="AGENT_MESSAGE_UNREADABLE",
            field_violations=tuple(bad),
            metadata=(("position", str(position)), ("after_sequence", str(last_sequence))),
        ),
    )


class ClusterAdminServicer(cs_grpc.ClusterServiceServicer):
    """ListClusters / GetCluster for tenants and admins; Cordon / Uncordon for admins."""

    def __init__(self, gate: Gate, clusters: ClusterPorts) -> None:
        self.gate = gate
        self.clusters = clusters
        self.edge = Edge(gate, Listener.TENANT)

    async def ListClusters(
        self, request: cs.ListClustersRequest, context: grpc.aio.ServicerContext
    ) -> cs.ListClustersResponse:
        try:
            caller = self.edge.caller(context, Method.LIST_CLUSTERS)
            validation.raise_if(validation.check_list_clusters(request))
            views = cluster_handlers.list_clusters(self.clusters, caller, region=request.region, role=request.role)
        except Exception as exc:
            await self.edge.fail(context, exc, Method.LIST_CLUSTERS)
        return cs.ListClustersResponse(clusters=[_summary(v) for v in views])

    async def GetCluster(
        self, request: cs.GetClusterRequest, context: grpc.aio.ServicerContext
    ) -> cs.GetClusterResponse:
        try:
            caller = self.edge.caller(context, Method.GET_CLUSTER)
            validation.raise_if(validation.check_cluster_request(request))
            view = cluster_handlers.get_cluster(self.clusters, caller, request.name)
        except Exception as exc:
            await self.edge.fail(context, exc, Method.GET_CLUSTER)
        return cs.GetClusterResponse(cluster=_summary(view, with_domains=True))

    async def _cordon(
        self, request: cs.CordonRequest | cs.UncordonRequest, on: bool, context: grpc.aio.ServicerContext
    ) -> cs.ClusterSummary:
        method = Method.CORDON if on else Method.UNCORDON
        caller: Caller | None = None
        try:
            caller = self.edge.caller(context, method)
            return await cordon(self.clusters, self.gate.audit, caller, request, on)
        except Exception as exc:
            await self.edge.fail(context, exc, method, caller, cluster=request.name)

    async def Cordon(self, request: cs.CordonRequest, context: grpc.aio.ServicerContext) -> cs.CordonResponse:
        return cs.CordonResponse(cluster=await self._cordon(request, True, context))

    async def Uncordon(self, request: cs.UncordonRequest, context: grpc.aio.ServicerContext) -> cs.UncordonResponse:
        return cs.UncordonResponse(cluster=await self._cordon(request, False, context))


async def cordon(
    clusters: ClusterPorts, audit: AuditLog, caller: Caller, request: cs.CordonRequest | cs.UncordonRequest, on: bool
) -> cs.ClusterSummary:
    """Cordon (`on`) or uncordon, for either edge (gRPC here, the fleet view's HTTP in broker.web)."""
    method = Method.CORDON if on else Method.UNCORDON
    validation.raise_if(validation.check_cluster_request(request, reason=True))
    view = await cluster_handlers.cordon(clusters, caller, request.name, on, request.reason)
    audit.record(caller, method, "ok", cluster=request.name, reason=request.reason)
    return _summary(view)


def _summary(view: cluster_handlers.ClusterView, with_domains: bool = False) -> cs.ClusterSummary:
    """The ClusterSummary of a cluster as read from its fleet snapshot (report ages at the snapshot's time)."""
    return serde_agent.cluster_summary(
        view.state, view.gpus(with_domains), view.fleet.now, view.stale, view.active_attempts, view.cordon_reason
    )
