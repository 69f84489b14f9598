"""Builders and fixtures for the store, lifecycle and queue tests (fake clock, jobs, attempts, stores)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from broker.domain.records import AttemptRecord, JobRecord, NewJob
from broker.domain.retry import RetryPolicy
from broker.domain.states import JobState
from broker.store.base import StoreOptions
from broker.store.sqlite import SqliteStore
from broker.store.writes import queued_job
from fleetplan.catalog import ReplicaPlacement
from tests.needs import missing

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
    tenant: str = "t1",
    *,
    queue: str = "default",
    gpus: float = 8,
    key: str | None = None,
    spec: bytes = b"spec",
    job_set: str = "",
    band: str = "default",
    priority: int = 0,
    preemptible: bool = False,
    labels: dict[str, str] | None = None,
    models: tuple[str, ...] = (),
    max_infra_retries: int | None = None,
) -> NewJob:
    return NewJob(
        tenant=tenant,
        queue=queue,
        spec=spec,
        job_set=job_set,
        priority_band=band,
        priority=priority,
        preemptible=preemptible,
        labels=tuple(sorted((labels or {}).items())),
        gpus=gpus,
        gpu_models=models,
        idempotency_key=key,
        max_infra_retries=max_infra_retries,
    )


def job_record(
    job_id: str = "job-1",
    *,
    state: JobState = JobState.QUEUED,
    attempt: int = 0,
    tenant: str = "t1",
    gpus: float = 8,
    infra_retries: int = 0,
    preemptible: bool = False,
    seq: int = 1,
    max_infra_retries: int | None = None,
    not_before: float = 0.0,
    band: str = "default",
    priority: int = 0,
    models: tuple[str, ...] = (),
    queue: str = "default",
) -> JobRecord:
    """A job as a submission creates it (no spec, no fingerprint, at T0), then put in the given state."""
    request = new_job(
        tenant,
        queue=queue,
        gpus=gpus,
        spec=b"",
        band=band,
        priority=priority,
        preemptible=preemptible,
        models=models,
        max_infra_retries=max_infra_retries,
    )
    return dataclasses.replace(
        queued_job(request, job_id, b"", T0),
        seq=seq,
        state=state,
        attempt=attempt,
        infra_retries=infra_retries,
        not_before=not_before,
        reason="",
        revision=1,
    )


def attempt_record(
    job_id: str = "job-1",
    number: int = 1,
    *,
    cluster: str = "c1",
    model: str = "H100",
    gpus: float = 8,
    started: bool = False,
    **kw: object,
) -> AttemptRecord:
    a = AttemptRecord(
        job_id=job_id,
        number=number,
        cluster=cluster,
        domain=("z1", "r1"),
        assignments=(ReplicaPlacement("w", 0, "n1"),),
        gpu_model=model,
        gpus=gpus,
        reserve_time=T0,
        start_time=T0 if started else None,
    )
    return dataclasses.replace(a, **kw) if kw else a  # type: ignore[arg-type]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


CONTRACT_OPTIONS = StoreOptions(retry=RetryPolicy(max_infra_retries=3, backoff_base_s=10.0, backoff_max_s=600.0))
"""The retry budget the contract suite's figures are written against (3 spent retries, 10 s doubling to 600 s)."""


@pytest.fixture(params=["memory", "file", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock) -> AsyncIterator[SqliteStore]:
    """The same tests run against every backend: SQLite in memory, SQLite on disk (WAL, reader thread), PostgreSQL."""
    if request.param == "postgres":
        from broker.store.postgres import PostgresStore

        dsn = await fresh_pg_database(request.getfixturevalue("pg_server"))
        s: SqliteStore = PostgresStore(
            dsn,
            clock=clock,
            id_gen=id_gen(),  # type: ignore[assignment]
            options=CONTRACT_OPTIONS,
        )
    else:
        path = ":memory:" if request.param == "memory" else str(tmp_path / "store.db")
        s = SqliteStore(path, clock=clock, id_gen=id_gen(), options=CONTRACT_OPTIONS)
    await s.open()
    yield s
    await s.close()


def sqlite_only(store: object) -> None:
    """Skip a test that drives the SQLite writer thread directly."""
    if not isinstance(store, SqliteStore):
        pytest.skip("drives the SQLite writer thread")


@pytest.fixture
async def file_store(tmp_path: Path, clock: FakeClock) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(str(tmp_path / "store.db"), clock=clock, id_gen=id_gen(), options=CONTRACT_OPTIONS)
    await s.open()
    yield s
    await s.close()


# -- PostgreSQL (the HA backend) -------------------------------------------------------------------------


def _pg_binaries() -> tuple[str, str] | None:
    import glob
    import os
    import shutil

    # Debian keeps the server binaries off PATH, under /usr/lib/postgresql/<version>/bin.
    path = ":".join([os.environ.get("PATH", ""), *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)])
    initdb, pg_ctl = shutil.which("initdb", path=path), shutil.which("pg_ctl", path=path)
    if not initdb or not pg_ctl:
        return None
    return initdb, pg_ctl


@contextmanager
def throwaway_pg_server(*settings: str, port: int) -> Iterator[str | None]:
    """A throwaway PostgreSQL server on a Unix socket with these server settings (``fsync=off``, ...); yields its DSN
    prefix ``postgresql://tandem@/?host=...&port=...`` (put a database name before ``?``), or None when PostgreSQL
    (or, running as root, ``runuser`` to run it as its own user) is not installed. Stopped and removed on exit."""
    import os
    import shutil
    import subprocess
    import tempfile

    bins = _pg_binaries()
    runuser = shutil.which("runuser")
    if bins is None or (os.geteuid() == 0 and runuser is None):
        yield None
        return
    initdb, pg_ctl = bins
    # not under pytest's tmp dir: the postgres user must be able to reach it
    base = Path(tempfile.mkdtemp(prefix="tandem-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0 and runuser is not None:  # postgres refuses to run as root
        shutil.chown(base, "postgres", "postgres")
        run_as = [runuser, "-u", "postgres", "--"]
    data = base / "data"
    options = " ".join([f"-k {base} -p {port} -c listen_addresses=''", *(f"-c {s}" for s in settings)])
    try:
        subprocess.run(
            [*run_as, initdb, "-D", str(data), "-A", "trust", "-U", "tandem"], check=True, capture_output=True
        )
        subprocess.run(
            [*run_as, pg_ctl, "-D", str(data), "-l", str(base / "log"), "-w", "-o", options, "start"],
            check=True,
            capture_output=True,
        )
        yield f"postgresql://tandem@/?host={base}&port={port}"
    finally:
        subprocess.run([*run_as, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A throwaway PostgreSQL server (no fsync: the tests need no durability); yields its DSN prefix (skips if
    PostgreSQL is absent)."""
    import os

    with throwaway_pg_server("fsync=off", port=55000 + os.getpid() % 5000) as server:
        if server is None:
            missing("PostgreSQL (initdb, pg_ctl; runuser when the tests run as root) or asyncpg")
        yield server


async def fresh_pg_database(server: str) -> str:
    """A new empty database on the test server; returns its DSN."""
    import asyncpg  # type: ignore[import-untyped]

    name = f"t{next(_db_counter)}"
    conn = await asyncpg.connect(server.replace("/?", "/postgres?"))
    try:
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    return server.replace("/?", f"/{name}?")


_db_counter = itertools.count(1)
