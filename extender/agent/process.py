"""`tandem-extender agent`: wire the agent's parts together and run them until SIGTERM.

Two modes:
* `--kube` (the Deployment): list+watch the cluster with the extender's code, elect a leader on the Lease,
  and, as leader, stream to the broker and carry out its orders.
* `--inventory-file F` (read-only): report a file snapshot; Hello says `capabilities.dispatch = false`, so
  the broker lists the cluster but never places there, and any Dispatch is rejected AGENT_NOT_READY.

/healthz, /readyz (inventory synced and reservations loaded: a restarted agent is not ready until it knows
what the cluster holds) and /metrics are served on `listen`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from aiohttp import web
from prometheus_client import generate_latest

from extender import kube as kube_mod
from extender.agent.agent import Agent
from extender.agent.config import AgentProcessConfig
from extender.agent.lease import LeaderElector
from extender.agent.model import check_name_budget
from extender.agent.tracker import Tee
from extender.inventory import Inventory
from extender.main import load_inventory_files

__all__ = ["run_agent", "health_app"]

log = logging.getLogger("tandem.agent")


def health_app(agent: Agent, elector: LeaderElector | None) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        missing = []
        if not agent.inv.synced:
            missing.append("inventory not synced")
        if not agent.inv.reservations_loaded:
            missing.append("reservations not loaded")
        if not agent.read_only and not agent.preflight_done.is_set():
            missing.append("start checks not done")
        if missing:
            return web.Response(status=503, text="; ".join(missing))
        role = "read-only" if agent.read_only else ("leader" if elector and elector.is_leader else "follower")
        return web.Response(text=f"ready ({role})")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(agent.metrics.registry), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


async def _lead(agent: Agent, elector: LeaderElector) -> None:
    """As long as this replica leads: the broker stream and the cluster's workloads; on losing the Lease,
    close the stream and stop every write in flight (the client's guard already refuses new ones)."""
    while True:
        epoch = await elector.wait_leading()
        agent.metrics.leader.set(1)
        log.info("leading", extra={"detail": {"epoch": epoch, "identity": agent.identity}})
        work = asyncio.get_running_loop().create_task(_leader_work(agent, epoch))
        await elector.wait_lost()
        agent.metrics.leader.set(0)
        log.warning("lost the agent Lease: stepping down", extra={"detail": {"epoch": epoch}})
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        await agent.stop()


async def _preflight(agent: Agent) -> None:
    """Every replica runs the start checks (read-only), so a follower is ready to lead at once."""
    while not agent.preflight_done.is_set():
        try:
            await agent.preflight()
        except Exception:
            await asyncio.sleep(5)


async def _leader_work(agent: Agent, epoch: int) -> None:
    await agent.preflight_done.wait()
    async with asyncio.TaskGroup() as group:
        group.create_task(agent.sessions(epoch))
        group.create_task(agent.follow_loop())


async def run_agent(process: AgentProcessConfig) -> None:
    """Run until SIGTERM / SIGINT; as leader, hand the Lease over on the way out."""
    check_name_budget()
    config = process.agent
    inv = Inventory(config.extender)
    tasks: list[asyncio.Task[None]] = []
    elector: LeaderElector | None = None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if process.watch_cluster:
        api = await kube_mod.load_api_client(kubeconfig=process.kube.kubeconfig, in_cluster=process.kube.in_cluster)
        client = kube_mod.KubeClient(api, field_manager="tandem-agent", timeout_s=config.kube_api_timeout_s)
        agent = Agent(config, inv, client)
        elector = LeaderElector(client, config.lease, agent.identity)
        client.guard = elector.may_write
        watcher = kube_mod.Watcher(
            api,
            Tee(inv, agent.tracker),
            kube_mod.KubeSettings.from_config(config.extender),
            kinds=kube_mod.INVENTORY_KINDS | {kube_mod.Kind.JOB},
        )
        tasks += [
            loop.create_task(watcher.run(), name="watch"),
            loop.create_task(elector.run(), name="lease"),
            loop.create_task(_preflight(agent), name="preflight"),
            loop.create_task(_lead(agent, elector), name="lead"),
        ]
    else:
        load_inventory_files(inv, process.inventory_files)
        agent = Agent(config, inv, None, read_only=True)
        agent.preflight_done.set()
        tasks.append(loop.create_task(agent.sessions(0), name="sessions"))
    runner = web.AppRunner(health_app(agent, elector), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, config.host, config.port).start()
    log.info(
        "agent running",
        extra={
            "detail": {
                "cluster": config.cluster_name,
                "broker": config.broker,
                "read_only": agent.read_only,
                "identity": agent.identity,
            }
        },
    )
    try:
        await stop.wait()
    finally:
        if elector is not None and elector.is_leader and agent.stream is not None:
            await agent.stream.close()  # a step-down closes its stream first
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if elector is not None:
            await elector.release()
        await agent.stop()
        await runner.cleanup()
