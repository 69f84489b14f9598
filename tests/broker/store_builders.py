"""Builders and fixtures for the store, lifecycle and queue tests (fake clock, jobs, attempts, stores)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from broker.records import AttemptRecord, JobRecord, NewJob, ReplicaPlacement
from broker.states import JobState
from broker.store.base import StoreOptions
from broker.store.sqlite import SqliteStore

T0 = 1_800_000_000.0


class FakeClock:
    """Injected clock: only moves when told."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> float:
        self.t += dt
        return self.t


def id_gen(prefix: str = "job") -> Callable[[], str]:
    counter = itertools.count(1)
    return lambda: f"{prefix}-{next(counter):05d}"


def new_job(
    tenant: str = "t1", *, queue: str = "default", gpus: float = 8, key: str | None = None,
    spec: bytes = b"spec", job_set: str = "", band: str = "default", priority: int = 0,
    preemptible: bool = False, labels: dict[str, str] | None = None, models: tuple[str, ...] = (),
    max_infra_retries: int | None = None,
) -> NewJob:
    return NewJob(
        tenant=tenant, queue=queue, spec=spec, job_set=job_set, priority_band=band, priority=priority,
        preemptible=preemptible, labels=tuple(sorted((labels or {}).items())), gpus=gpus, gpu_models=models,
        idempotency_key=key, max_infra_retries=max_infra_retries,
    )


def job_record(
    job_id: str = "job-1", *, state: JobState = JobState.QUEUED, attempt: int = 0, tenant: str = "t1",
    gpus: float = 8, infra_retries: int = 0, preemptible: bool = False, seq: int = 1,
    max_infra_retries: int | None = None, not_before: float = 0.0, band: str = "default",
    priority: int = 0, models: tuple[str, ...] = (), queue: str = "default",
) -> JobRecord:
    return JobRecord(
        job_id=job_id, seq=seq, tenant=tenant, queue=queue, job_set="", priority_band=band, priority=priority,
        preemptible=preemptible, labels=(), gpus=gpus, gpu_models=models, max_infra_retries=max_infra_retries,
        max_runtime_s=None, spec=b"", idempotency_key=None, fingerprint=b"", state=state, attempt=attempt,
        infra_retries=infra_retries, not_before=not_before, create_time=T0, update_time=T0, end_time=None,
        reason="", message="", revision=1,
    )


def attempt_record(
    job_id: str = "job-1", number: int = 1, *, cluster: str = "c1", model: str = "H100", gpus: float = 8,
    started: bool = False, **kw: object,
) -> AttemptRecord:
    a = AttemptRecord(
        job_id=job_id, number=number, cluster=cluster, domain=("z1", "r1"),
        assignments=(ReplicaPlacement("w", 0, "n1"),), gpu_model=model, gpus=gpus, reserve_time=T0,
        start_time=T0 if started else None,
    )
    return dataclasses.replace(a, **kw) if kw else a  # type: ignore[arg-type]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["memory", "file"])
async def store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> AsyncIterator[SqliteStore]:
    """The same tests run against the in-memory and the file-backed (WAL, reader thread) store."""
    path = ":memory:" if request.param == "memory" else str(tmp_path / "store.db")
    s = SqliteStore(path, clock=clock, id_gen=id_gen(), options=StoreOptions())
    await s.open()
    yield s
    await s.close()


@pytest.fixture
async def file_store(tmp_path: Path, clock: FakeClock) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(str(tmp_path / "store.db"), clock=clock, id_gen=id_gen())
    await s.open()
    yield s
    await s.close()
