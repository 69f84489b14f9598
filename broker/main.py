"""`tandem-broker`: load the config once, serve until SIGTERM/SIGINT, then stop gracefully."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Sequence

from broker.config import BrokerConfig, load_config
from broker.server import serve
from jsonlogs import configure_json_logging

__all__ = ["main", "run"]

_log = logging.getLogger("tandem.broker")


async def run(cfg: BrokerConfig) -> None:
    servers = await serve(cfg)
    # One line on stdout with the bound ports, so wrappers and tests can find a port-0 listener.
    print(
        json.dumps(
            {
                "event": "listening",
                "tenant_port": servers.tenant_port,
                "agent_port": servers.agent_port,
                "tenant_mtls_port": servers.tenant_mtls_port,
                "web_port": servers.web_port,
            }
        ),
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    _log.info("shutting down")
    await servers.stop(cfg.shutdown_grace_s)


def main(argv: Sequence[str] | None = None) -> int:
    configure_json_logging(logging.INFO)
    cfg = load_config(argv)
    asyncio.run(run(cfg))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
