"""Run the fake API server standalone: `python -m sim.kubeapi --port 0 --rbac manifests/`.

Prints one JSON line `{"url": ..., "admin_token": ...}` once it listens, then serves until
SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

import orjson

from sim.kubeapi.server import KubeAPIServer

__all__ = ["main"]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sim.kubeapi", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port (0: any free port)")
    parser.add_argument(
        "--rbac", action="append", default=[], type=Path, help="RBAC manifest file or directory (repeatable)"
    )
    parser.add_argument("--admin-token-file", type=Path, help="read the admin token from this file")
    parser.add_argument("--event-window", type=int, default=10_000, help="watch events kept for resumption")
    parser.add_argument("--watch-delay-max", type=float, default=0.1, help="largest per-watch delivery delay, s")
    parser.add_argument("--seed", type=int, default=None, help="seed of uids, names and delays")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    server = KubeAPIServer(
        rbac_paths=args.rbac, event_window=args.event_window, watch_delay_max_s=args.watch_delay_max, seed=args.seed
    )
    if args.admin_token_file is not None:
        token = args.admin_token_file.read_text().strip()
        server.add_token(token, "kubernetes-admin", ["system:masters"])
        server.admin_token = token
    await server.start(args.host, args.port)
    sys.stdout.write(orjson.dumps({"url": server.url, "admin_token": server.admin_token}).decode() + "\n")
    sys.stdout.flush()
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    try:
        await done.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    asyncio.run(_serve(_parse(argv)))


if __name__ == "__main__":
    main()
