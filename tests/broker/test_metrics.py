"""Broker queue gauges refreshed from the placer's job book (unit: a stand-in book, real JobRecords)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from broker.domain.records import JobRecord
from broker.metrics import Metrics
from tests.broker.store_builders import T0, FakeClock, job_record


def _book(clock: FakeClock, *jobs: JobRecord) -> SimpleNamespace:
    return SimpleNamespace(queued={j.job_id: j for j in jobs}, held_gpus_by_cluster=dict, clock=clock)


def _queued(job_id: str, tenant: str, created: float, updated: float | None = None) -> JobRecord:
    return dataclasses.replace(
        job_record(job_id, tenant=tenant), create_time=created, update_time=created if updated is None else updated
    )


def test_oldest_wait_is_now_minus_the_oldest_submission_per_tenant_and_empty_tenants_drop_out() -> None:
    m, clock = Metrics(), FakeClock()

    def oldest_wait(tenant: str) -> float | None:
        return m.registry.get_sample_value("tandem_queue_oldest_wait_seconds", {"tenant": tenant})

    # a1 was submitted first and re-queued lately: submission time counts, not the latest change.
    a1, a2 = _queued("a1", "alpha", T0 - 100, updated=T0 - 5), _queued("a2", "alpha", T0 - 40)
    b1 = _queued("b1", "beta", T0 - 10)
    book = _book(clock, a2, a1, b1)
    m.refresh_queue(book)
    assert oldest_wait("alpha") == 100
    assert oldest_wait("beta") == 10
    assert m.registry.get_sample_value("tandem_broker_queue_length", {"tenant": "alpha"}) == 2

    clock.advance(60)
    m.refresh_queue(book)
    assert oldest_wait("alpha") == 160

    m.refresh_queue(book, now=T0 + 1000)  # an explicit now wins over the book's clock
    assert oldest_wait("beta") == 1010

    # beta's job leaves the queue: its series goes, like its queue length (not a stale value, not 0).
    book.queued.pop("b1")
    m.refresh_queue(book)
    assert oldest_wait("beta") is None
    assert m.registry.get_sample_value("tandem_broker_queue_length", {"tenant": "beta"}) is None
    assert oldest_wait("alpha") == 160


def test_oldest_wait_never_goes_negative_on_clock_skew() -> None:
    m = Metrics()
    m.refresh_queue(_book(FakeClock(), _queued("a1", "alpha", T0 + 30)))
    assert m.registry.get_sample_value("tandem_queue_oldest_wait_seconds", {"tenant": "alpha"}) == 0.0
