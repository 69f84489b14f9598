"""`tandem-extender`: load the subcommand's one configuration object once, then run it.

* `serve`: fill the inventory (files or the kube API) and serve the extender verbs and the webhook
  (extender.config.ServeProcessConfig).
* `agent`: the cluster agent, a process of its own (extender.agent.config.AgentProcessConfig).
* `render-rbac`: print the RoleBindings the agent needs (its AgentConfig file alone).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from extender import webhook
from extender.agent.config import AgentProcessConfig, load_agent_config, load_agent_process_config
from extender.app import make_app, ssl_context
from extender.config import ServeProcessConfig, load_serve_config
from extender.inventory import Inventory
from jsonlogs import configure_json_logging

__all__ = ["main", "build_parser", "load_inventory_files"]

log = logging.getLogger("tandem.extender")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tandem-extender", description="Tandem kube-scheduler extender")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve the extender verbs")
    s.add_argument(
        "--inventory-file",
        action="append",
        type=Path,
        default=[],
        help="`kubectl get nodes,pods,resourceslices,resourceclaims,deviceclasses -A -o json` output (repeatable)",
    )
    s.add_argument("--listen", default=None, help="HOST:PORT (default from config: 127.0.0.1:8888)")
    s.add_argument("--config", type=Path, default=None, help="YAML/JSON ExtenderConfig file")
    s.add_argument("--kube", action="store_true", help="list+watch the cluster's API server")
    s.add_argument("--log-level", default=None, help="logging level (default from config)")
    a = sub.add_parser("agent", help="the cluster agent: inventory to the broker, its orders into the cluster")
    a.add_argument("--config", type=Path, default=None, help="YAML/JSON AgentConfig file")
    a.add_argument("--kube", action="store_true", help="watch and write the cluster (in a pod or via --kubeconfig)")
    a.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, else $KUBECONFIG)")
    a.add_argument(
        "--inventory-file",
        action="append",
        type=Path,
        default=[],
        help="read-only mode: report this file snapshot, create nothing (repeatable)",
    )
    a.add_argument("--broker", default=None, help="HOST:PORT of the broker's agent listener")
    a.add_argument("--cluster-name", default=None, help="this cluster's name (the client certificate's CN)")
    a.add_argument("--tls-cert", type=Path, default=None, help="client certificate (PEM)")
    a.add_argument("--tls-key", type=Path, default=None, help="client key (PEM)")
    a.add_argument("--tls-ca", type=Path, default=None, help="CA of the broker's certificate (PEM)")
    a.add_argument("--listen", default=None, help="HOST:PORT of /healthz, /readyz, /metrics")
    a.add_argument("--log-level", default=None, help="logging level (default INFO)")
    r = sub.add_parser("render-rbac", help="print the RoleBindings the agent needs in its tenant namespaces")
    r.add_argument("--config", type=Path, required=True, help="the agent's config (its tenants map)")
    return p


def load_inventory_files(inv: Inventory, paths: Sequence[Path]) -> None:
    """Read every file (a List or a single object) and load them as one full sync."""
    items: list[Any] = []
    for path in paths:
        obj = orjson.loads(path.read_bytes())
        if isinstance(obj, dict) and isinstance(obj.get("items"), list):
            items.extend(obj["items"])
        elif isinstance(obj, dict):
            items.append(obj)
        else:
            raise ValueError(f"{path}: expected a Kubernetes List or object")
    inv.load_list({"kind": "List", "items": items})


def _setup_logging(level: str) -> None:
    configure_json_logging(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


async def _serve(config: ServeProcessConfig, watch: bool) -> None:
    """Serve until cancelled; ``watch``: list+watch the cluster (--kube, or a cluster found in the environment)."""
    settings = config.extender
    inv = Inventory(settings)
    if config.inventory_files:
        load_inventory_files(inv, config.inventory_files)
        inv.snapshot()
        gc.freeze()  # the loaded inventory is long-lived: keep it out of every full collection
    app = make_app(inv, settings, extra_routes=webhook.add_routes)
    tasks: list[asyncio.Task[None]] = []
    if watch:
        from extender import kube as kube_mod  # imported lazily: file mode needs no cluster

        api = await kube_mod.load_api_client(kubeconfig=config.kube.kubeconfig, in_cluster=config.kube.in_cluster)
        watcher = kube_mod.Watcher(api, inv, kube_mod.KubeSettings.from_config(settings))
        tasks.append(asyncio.create_task(watcher.run(), name="kube-watch"))
    tasks.append(asyncio.create_task(_expire_reservations(inv), name="reservation-expiry"))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port, ssl_context=ssl_context(settings))
    await site.start()
    log.info(
        "extender serving",
        extra={"detail": {"listen": settings.listen, "nodes": len(inv.snapshot()), "ready": inv.ready}},
    )
    try:
        await asyncio.Event().wait()
    finally:
        for t in tasks:
            t.cancel()
        await runner.cleanup()


async def _expire_reservations(inv: Inventory, every_s: float = 5.0) -> None:
    """Expiry is a time, not an event: drop expired reservations so their holds end even with no agent."""
    while True:
        await asyncio.sleep(every_s)
        inv.expire_reservations()


def _agent(config: AgentProcessConfig) -> int:
    _setup_logging(config.log_level)
    if not config.agent.cluster_name or not config.agent.broker:
        print(
            "tandem-extender agent: --cluster-name and --broker are required (or set them in --config)", file=sys.stderr
        )
        return 2
    if config.watch_cluster == bool(config.inventory_files):
        print("tandem-extender agent: pass exactly one of --kube or --inventory-file", file=sys.stderr)
        return 2
    from extender.agent.process import run_agent  # imported lazily: the extender's serve needs no agent

    asyncio.run(run_agent(config))
    return 0


def _serve_main(config: ServeProcessConfig) -> int:
    _setup_logging(config.extender.log_level)
    watch = config.watch_cluster
    if not config.inventory_files and not watch:
        # Serving with nothing to read would never become ready: find the cluster, or say what is missing.
        if not config.kube.found():
            print(
                "tandem-extender serve: no inventory source: pass --kube (in a pod or with a kubeconfig) or "
                "--inventory-file FILE",
                file=sys.stderr,
            )
            return 2
        log.info("no inventory source given: watching the cluster found in the environment")
        watch = True
    try:
        asyncio.run(_serve(config, watch))
    except KeyboardInterrupt:
        return 0
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, load the subcommand's one configuration object (file + flags + environment,
    resolved once here) and run it."""
    args = build_parser().parse_args(argv)
    if args.command == "render-rbac":
        from extender.agent.preflight import render_rbac  # imported lazily: it pulls in the kube client

        sys.stdout.write(render_rbac(load_agent_config(args.config)))
        return 0
    if args.command == "agent":
        return _agent(
            load_agent_process_config(
                args.config,
                env=os.environ,
                kube=args.kube,
                kubeconfig=args.kubeconfig,
                inventory_files=args.inventory_file,
                log_level=args.log_level,
                broker=args.broker,
                cluster_name=args.cluster_name,
                tls_cert_file=args.tls_cert,
                tls_key_file=args.tls_key,
                tls_ca_file=args.tls_ca,
                listen=args.listen,
            )
        )
    return _serve_main(
        load_serve_config(
            args.config,
            env=os.environ,
            listen=args.listen,
            log_level=args.log_level,
            kube=args.kube,
            inventory_files=args.inventory_file,
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())
