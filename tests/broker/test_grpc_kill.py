"""SIGKILL the broker process mid-submission, restart it, retry what was not acknowledged: one job per key."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import grpc
import pytest

from broker.launcher.client import BrokerClient, SubmitItem
from tests.broker.broker_cli import launch_broker
from tests.broker.hub_builders import TOKENS, policy_doc, spec, write_policy

pytestmark = pytest.mark.timeout(120)


async def test_sigkill_during_concurrent_submissions_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    write_policy(tmp_path / "policy.yaml", policy_doc())
    broker = await asyncio.to_thread(launch_broker, tmp_path)
    proc, port = broker.proc, broker.tenant_port
    acked: dict[str, str] = {}
    attempted: list[str] = []
    killed = asyncio.Event()

    async def submitter(worker: int) -> None:
        async with BrokerClient(f"127.0.0.1:{port}", token=TOKENS["alpha"], timeout_s=10) as c:
            for i in range(400):
                if killed.is_set():
                    return
                key = f"w{worker}-{i}"
                attempted.append(key)
                try:
                    [res] = await c.submit("crash", [SubmitItem(key, spec(gpus=1))])
                except grpc.aio.AioRpcError:
                    return
                assert res.job_id, res.error_message
                acked[key] = res.job_id

    async def killer() -> None:
        while len(acked) < 150:
            await asyncio.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        killed.set()

    await asyncio.gather(killer(), *(submitter(w) for w in range(8)))
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    in_flight = [k for k in attempted if k not in acked]

    broker = await asyncio.to_thread(launch_broker, tmp_path)
    proc, port = broker.proc, broker.tenant_port
    try:
        async with BrokerClient(f"127.0.0.1:{port}", token=TOKENS["alpha"], timeout_s=10) as c:
            retried: dict[str, str] = {}
            for key in in_flight:
                [res] = await c.submit("crash", [SubmitItem(key, spec(gpus=1))])
                assert res.job_id
                retried[key] = res.job_id
            # Retrying an acknowledged key returns the very job acknowledged before the crash.
            for key in list(acked)[:20]:
                [res] = await c.submit("crash", [SubmitItem(key, spec(gpus=1))])
                assert res.duplicate and res.job_id == acked[key]
            ids: list[str] = []
            token = ""
            while True:
                page = await c.list(job_set_id="crash", page_size=1000, page_token=token)
                ids.extend(j.job_id for j in page.jobs)
                token = page.next_page_token
                if not token:
                    break
        every = {**acked, **retried}
        assert len(every) == len(set(attempted))
        assert sorted(ids) == sorted(set(every.values()))  # exactly one job per key, none extra
        assert set(acked.values()) <= set(ids)  # every acknowledged job survived
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    assert proc.returncode == 0  # graceful stop on SIGTERM
