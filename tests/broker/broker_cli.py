"""The broker started from its command line as a child process, for the tests and benchmarks that kill or time it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fleetsim.processes import REPO


@dataclass(frozen=True)
class LaunchedBroker:
    """A running `python -m broker.main` and the ports its port-0 listeners were given."""

    proc: subprocess.Popen[str]
    tenant_port: int
    agent_port: int


def launch_broker(tmp: Path, *flags: str) -> LaunchedBroker:
    """The broker on loopback port 0 with a plaintext agent listener, its database `tmp/broker.db` and policy
    `tmp/policy.yaml` (written by the caller), plus `flags`; returns once it printed the ports it listens on."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "protos"), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "broker.main",
            "--listen",
            "127.0.0.1:0",
            "--agent-listen",
            "127.0.0.1:0",
            "--db",
            str(tmp / "broker.db"),
            "--policy",
            str(tmp / "policy.yaml"),
            "--metrics-port",
            "0",
            "--agent-insecure",
            *flags,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=str(tmp),
    )
    assert proc.stdout is not None
    ports = json.loads(proc.stdout.readline())
    return LaunchedBroker(proc, int(ports["tenant_port"]), int(ports["agent_port"]))
