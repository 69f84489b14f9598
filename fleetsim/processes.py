"""The child processes of a fleet on one machine, and waiting on them: spawning `tandem-extender`, free ports,
health checks, and polling a condition while watching that no process it needs has died."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

__all__ = ["REPO", "Proc", "WaitFailed", "free_port", "http_ok", "spawn", "wait_for"]

REPO = Path(__file__).resolve().parents[1]
"""The repository root: the working directory of every child process."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WaitFailed(AssertionError):
    """A condition was not reached in time, or a process it needs exited (an AssertionError, so a test that
    waits on it fails rather than errors)."""


@dataclass
class Proc:
    """A child process with its output in a log file (shown when a wait fails)."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    stopped: bool = False
    """Stopped on purpose (a crash of it is not a failure)."""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    async def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int:
        self.stopped = True
        if self.alive():
            self.popen.send_signal(sig)
        deadline = time.monotonic() + timeout_s
        while self.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.alive():
            self.popen.kill()
            await asyncio.sleep(0.1)
        return self.popen.wait()


def spawn(name: str, args: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> Proc:
    """`tandem-extender <args>` as a child process, its output appended to `log`."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log.open("ab") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "extender.main", *args], cwd=REPO, env=full_env, stdout=out, stderr=subprocess.STDOUT
        )
    return Proc(name, popen, log)


async def http_ok(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


async def wait_for(
    check: Callable[[], Any],
    timeout_s: float = 30.0,
    what: str = "condition",
    procs: Iterable[Proc] = (),
    *,
    interval_s: float = 0.05,
) -> Any:
    """Poll an async or sync predicate until truthy (and return its value); WaitFailed with the processes'
    last log lines on timeout or when one of them exits."""
    procs = list(procs)
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        for p in procs:
            if not p.alive() and not p.stopped:
                raise WaitFailed(f"{p.name} exited ({p.popen.returncode}) while waiting for {what}:\n{p.tail()}")
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)
            raise WaitFailed(f"timed out waiting for {what}\n{logs}")
        await asyncio.sleep(interval_s)
