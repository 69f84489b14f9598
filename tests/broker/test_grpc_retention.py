"""The hub's retention loop deletes finished jobs past the bound and keeps the rest."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from broker.launcher.client import SubmitItem
from tandem.v1 import job_pb2
from tests.broker.hub_builders import spec, start_broker

pytestmark = pytest.mark.timeout(60)


async def test_finished_jobs_are_deleted_after_retention_and_live_ones_stay(tmp_path: Path) -> None:
    now = [1_000_000.0]
    broker = await start_broker(tmp_path, clock=lambda: now[0], retention_s=1.0)  # the loop wakes every 0.1 s
    try:
        c = broker.client("alpha")
        [done, live] = await c.submit("run-r", [SubmitItem("k-done", spec(gpus=8)), SubmitItem("k-live", spec(gpus=8))])
        assert done.job_id and live.job_id
        await c.cancel(done.job_id, "finished for the test")
        assert (await c.get(done.job_id)).status.state == job_pb2.JOB_STATE_CANCELLED

        now[0] += 0.5  # not yet past the bound: still there after a few sweeps
        await asyncio.sleep(0.35)  # a few sweeps of the 0.1 s loop
        assert (await c.get(done.job_id)).status.state == job_pb2.JOB_STATE_CANCELLED

        now[0] += 5.0

        async def gone() -> bool:
            try:
                await c.get(done.job_id)
            except grpc.aio.AioRpcError as e:
                return bool(e.code() == grpc.StatusCode.NOT_FOUND)
            return False

        deadline = 50
        while not await gone():
            deadline -= 1
            assert deadline > 0, "the finished job was never compacted"
            await asyncio.sleep(0.1)
        assert (await c.get(live.job_id)).status.state == job_pb2.JOB_STATE_QUEUED
    finally:
        await broker.close()
