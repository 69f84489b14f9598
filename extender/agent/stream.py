"""The agent's end of ClusterService.Connect: one bidirectional stream, dialled out from the cluster.

The cluster dials the broker (pull model: the hub holds no cluster credentials). Mutual TLS with a
client certificate naming the cluster; `insecure` (development only) sends the cluster name in the
`x-tandem-cluster` header instead. A stream numbers its own messages from 1 (the Hello) and tracks the
broker's sequence it has applied and the agent sequence the broker has acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from extender.agent import wire
from extender.agent.config import AgentConfig
from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import cluster_service_pb2_grpc as cs_grpc

__all__ = ["Stream", "StreamClosed", "open_channel"]

_MAX_MESSAGE = 64 << 20
"""Snapshots of 5,000 nodes are ~5 MB; the broker's agent listener allows 64 MiB."""


class StreamClosed(Exception):
    """The stream ended; `code` is the gRPC status (None when it ended without one)."""

    def __init__(self, code: grpc.StatusCode | None, details: str) -> None:
        super().__init__(f"{code.name if code else 'closed'}: {details}")
        self.code = code
        self.details = details


def open_channel(config: AgentConfig) -> grpc.aio.Channel:
    """The channel to the broker's agent listener (mutual TLS unless `insecure`)."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", _MAX_MESSAGE),
        ("grpc.max_receive_message_length", _MAX_MESSAGE),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
    ]
    if config.insecure:
        return grpc.aio.insecure_channel(config.broker, options=options)
    if not (config.tls_cert_file and config.tls_key_file and config.tls_ca_file):
        raise ValueError("the broker link needs tls_cert_file, tls_key_file and tls_ca_file (or insecure: true)")
    creds = grpc.ssl_channel_credentials(
        config.tls_ca_file.read_bytes(), config.tls_key_file.read_bytes(), config.tls_cert_file.read_bytes()
    )
    if config.tls_server_name:
        options.append(("grpc.ssl_target_name_override", config.tls_server_name))
    return grpc.aio.secure_channel(config.broker, creds, options=options)


class Stream:
    """One Connect call. `send` queues an agent message and returns its sequence; `messages` yields the
    broker's messages as domain values (WireError for one the agent cannot use is yielded, not raised)."""

    def __init__(self, channel: grpc.aio.Channel, config: AgentConfig, clock: Any) -> None:
        self._stub = cs_grpc.ClusterServiceStub(channel)
        self._config = config
        self._queue: asyncio.Queue[cs.AgentMessage | None] = asyncio.Queue()
        self._outbox = wire.Outbox(clock=clock)
        self._call: Any = None
        self.applied = 0
        """Highest broker sequence the agent has applied (reported in heartbeats)."""
        self.acked = 0
        """Highest agent sequence the broker has acknowledged."""
        self.welcome: wire.WelcomeMsg | None = None
        self.closed = False

    async def _requests(self) -> AsyncIterator[cs.AgentMessage]:
        while True:
            msg = await self._queue.get()
            if msg is None:
                return
            yield msg

    def send(self, **body: Any) -> int:
        """Queue one message (e.g. `send(heartbeat=...)`); its sequence number."""
        if self.closed:
            raise StreamClosed(None, "stream closed")
        msg = self._outbox.message(**body)
        self._queue.put_nowait(msg)
        return msg.sequence

    async def open(self, hello: cs.Hello, timeout_s: float = 30.0) -> wire.WelcomeMsg:
        """Send the Hello and wait for the Welcome."""
        metadata = (("x-tandem-cluster", self._config.cluster_name),) if self._config.insecure else None
        self._call = self._stub.Connect(self._requests(), metadata=metadata)
        self.send(hello=hello)
        try:
            first = await asyncio.wait_for(self._call.read(), timeout_s)
        except grpc.aio.AioRpcError as e:
            raise StreamClosed(e.code(), e.details() or "") from e
        except TimeoutError as e:
            raise StreamClosed(grpc.StatusCode.DEADLINE_EXCEEDED, "no Welcome") from e
        if first is grpc.aio.EOF:
            raise StreamClosed(None, "stream ended before the Welcome")
        msg = wire.inbound(first)
        if not isinstance(msg, wire.WelcomeMsg):
            raise StreamClosed(grpc.StatusCode.INTERNAL, "the first broker message is not a Welcome")
        self.applied = first.sequence
        self.welcome = msg
        return msg

    async def messages(self) -> AsyncIterator[tuple[int, wire.Inbound | wire.WireError]]:
        """(broker sequence, message) until the stream ends; raises StreamClosed with the status."""
        assert self._call is not None
        while True:
            try:
                raw = await self._call.read()
            except grpc.aio.AioRpcError as e:
                self.closed = True
                raise StreamClosed(e.code(), e.details() or "") from e
            if raw is grpc.aio.EOF:
                self.closed = True
                raise StreamClosed(None, "the broker ended the stream")
            try:
                msg: wire.Inbound | wire.WireError | None = wire.inbound(raw)
            except wire.WireError as e:
                msg = e
            if isinstance(msg, wire.AckMsg):
                self.acked = max(self.acked, msg.sequence)
            if msg is not None:
                yield raw.sequence, msg

    def applied_upto(self, sequence: int) -> None:
        self.applied = max(self.applied, sequence)

    async def close(self) -> None:
        """End the stream from this side (a step-down closes its stream first)."""
        self.closed = True
        self._queue.put_nowait(None)
        if self._call is not None:
            self._call.cancel()
            with contextlib.suppress(Exception):
                await self._call
