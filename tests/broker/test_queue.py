"""Queue bookkeeping tables: fair-share order, quotas, usage, position and "why it waits" without leaks."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.domain.states import JobState
from broker.scheduling.queue import Admission, QueueBook, QueueEntry, QueuePolicy, QueueSnapshot, ordinal
from fleetplan.decide import WaitReason
from tests.broker.store_builders import attempt_record, job_record

S = JobState
NOW = 1000.0
_seq = itertools.count(1)


def q(
    job_id: str,
    tenant: str = "a",
    *,
    gpus: float = 1,
    band: str = "default",
    prio: int = 0,
    seq: int | None = None,
    state: JobState = S.QUEUED,
    model: str = "",
    charged: float = 0.0,
    models: tuple[str, ...] = (),
    preemptible: bool = False,
    not_before: float = 0.0,
) -> QueueEntry:
    return QueueEntry(
        job_id=job_id,
        tenant=tenant,
        queue="default",
        band=band,
        priority=prio,
        seq=seq if seq is not None else next(_seq),
        state=state,
        gpus=gpus,
        gpu_models=models,
        preemptible=preemptible,
        not_before=not_before,
        charged_model=model,
        charged_gpus=charged,
    )


def running(
    job_id: str, tenant: str, model: str, gpus: float, *, state: JobState = S.RUNNING, preemptible: bool = False
) -> QueueEntry:
    return q(job_id, tenant, gpus=gpus, state=state, model=model, charged=gpus, preemptible=preemptible)


def snap(entries: list[QueueEntry], policy: QueuePolicy | None = None, now: float = NOW) -> QueueSnapshot:
    return QueueSnapshot.build(entries, policy or QueuePolicy(), now)


def order_ids(entries: list[QueueEntry], policy: QueuePolicy | None = None) -> list[str]:
    return [e.job_id for e in snap(entries, policy).order()]


# -- order -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,entries,policy,expected",
    [
        ("arrival within a tenant", [q("a1", seq=1), q("a2", seq=2), q("a3", seq=3)], None, ["a1", "a2", "a3"]),
        ("priority before arrival", [q("a1", seq=1), q("a2", seq=2, prio=5)], None, ["a2", "a1"]),
        (
            "tenants interleave by share",
            [q("a1", "a", seq=1), q("a2", "a", seq=2), q("b1", "b", seq=3), q("b2", "b", seq=4)],
            None,
            ["a1", "b1", "a2", "b2"],
        ),
        (
            "lowest current usage first",
            [running("r", "a", "H100", 8), q("a1", "a", seq=1), q("b1", "b", seq=2)],
            None,
            ["b1", "a1"],
        ),
        (
            "weights scale the share",
            [running("ra", "a", "H100", 4), running("rb", "b", "H100", 2), q("a1", "a", seq=1), q("b1", "b", seq=2)],
            QueuePolicy(tenant_weights={"a": 4.0}),
            ["a1", "b1"],
        ),
        (
            "model weights price usage",
            [running("ra", "a", "A100", 4), running("rb", "b", "H100", 3), q("a1", "a", seq=1), q("b1", "b", seq=2)],
            QueuePolicy(model_weights={"H100": 2.0}),
            ["a1", "b1"],
        ),
        (
            "band beats share",
            [running("r", "a", "H100", 64), q("b1", "b", seq=1), q("a1", "a", seq=2, band="high")],
            QueuePolicy(band_ranks={"high": 100, "default": 0}),
            ["a1", "b1"],
        ),
        (
            "band beats priority",
            [q("a1", seq=1, prio=1000), q("a2", seq=2, band="prod")],
            QueuePolicy(band_ranks={"prod": 10}),
            ["a2", "a1"],
        ),
        (
            "big jobs use up share faster",
            [
                q("a1", "a", gpus=8, seq=1),
                q("a2", "a", gpus=8, seq=2),
                q("b1", "b", gpus=1, seq=3),
                q("b2", "b", gpus=1, seq=4),
                q("b3", "b", gpus=1, seq=5),
            ],
            None,
            ["a1", "b1", "b2", "b3", "a2"],
        ),
        ("equal share: priority then arrival", [q("b1", "b", seq=1), q("a1", "a", seq=2, prio=3)], None, ["a1", "b1"]),
        ("back-off excluded", [q("a1", seq=1, not_before=NOW + 5), q("a2", seq=2)], None, ["a2"]),
        ("held jobs are not queued", [running("r", "a", "H100", 1), q("a1", seq=1)], None, ["a1"]),
    ],
)
def test_order(name: str, entries: list[QueueEntry], policy: QueuePolicy | None, expected: list[str]) -> None:
    assert order_ids(entries, policy) == expected, name


# -- usage & quotas ----------------------------------------------------------------------------------


def test_usage_counts_every_state_that_holds_capacity() -> None:
    entries = [running(f"j{s.value}", "a", "H100", 1, state=s) for s in S if not s.terminal and s is not S.QUEUED]
    entries.append(q("waiting", "a", gpus=64))
    s = snap(entries)
    assert s.usage.used("a", "H100") == 8  # RESERVED..RUNNING, LOST, CANCELLING, PREEMPTED
    assert s.usage.cost["a"] == 8


H100_16 = QueuePolicy(quotas={("a", "H100"): 16, ("a", "*"): 4})


@pytest.mark.parametrize(
    "used,model,gpus,preemptible,expected",
    [
        (8, "H100", 8, False, Admission(True)),
        (8, "H100", 9, False, False),
        (16, "H100", 1, True, "borrow"),
        (0, "A100", 4, False, Admission(True)),  # falls under the "*" quota
        (0, "A100", 5, False, False),
        (0, "H100", 0, False, Admission(True)),  # CPU-only jobs never hit GPU quotas
    ],
)
def test_admit(used: float, model: str, gpus: float, preemptible: bool, expected: object) -> None:
    s = snap([running("r", "a", "H100", used)] if used else [], H100_16)
    a = s.admit("a", model, gpus, preemptible=preemptible)
    if expected is False:
        assert not a.allowed and a.violation is not None and a.violation.quota == f"gpu/{model}"
    elif expected == "borrow":
        assert a.allowed and a.borrowing and a.violation is not None
    else:
        assert a == expected


def test_wildcard_quota_pools_other_models() -> None:
    s = snap([running("r1", "a", "A100", 2), running("r2", "a", "L4", 2)], H100_16)
    assert not s.admit("a", "T4", 1, preemptible=False).allowed
    assert s.admit("a", "H100", 16, preemptible=False).allowed
    assert s.admit("b", "H100", 1000, preemptible=False).allowed  # no quota = unlimited


def test_charges_within_a_cycle() -> None:
    s = snap([], H100_16)
    u = s.charge(s.usage, "a", "H100", 12)
    assert s.admit("a", "H100", 4, preemptible=False, usage=u).allowed
    assert not s.admit("a", "H100", 5, preemptible=False, usage=u).allowed


# -- position & why it waits -------------------------------------------------------------------------


def test_position_counts_only_own_tenant() -> None:
    entries = [q("b1", "b", seq=1), q("a1", "a", seq=2), q("b2", "b", seq=3), q("a2", "a", seq=4), q("a3", "a", seq=5)]
    s = snap(entries)
    assert [s.position(j) for j in ("a1", "a2", "a3", "b1", "b2")] == [0, 1, 2, 0, 1]
    assert s.position("missing") is None


def test_why_waiting_explains_with_own_data_only() -> None:
    entries = [running(f"ra{i}", "a", "H100", 8) for i in range(2)] + [
        q("secret-b-job", "b", gpus=8, seq=1, models=("H100",)),
        q("a1", "a", gpus=8, seq=2, models=("H100",)),
        q("a2", "a", gpus=8, seq=3, models=("H100",)),
        q("a3", "a", gpus=8, seq=4, models=("H100",)),
    ]
    s = snap(entries, QueuePolicy(quotas={("a", "H100"): 16}))
    w = s.why_waiting("a3")
    assert w.reason is WaitReason.QUOTA_EXCEEDED
    assert w.reasons == (WaitReason.QUOTA_EXCEEDED, WaitReason.FAIR_SHARE, WaitReason.QUEUED_BEHIND_OTHERS)
    assert w.position == 2 and w.quota == "gpu/H100"
    assert w.message == (
        "3rd in your tenant's queue; quota for H100 exhausted: 16/16 GPUs in use (needs 8); tenant over fair share"
    )
    assert "secret" not in w.message and " b" not in w.message


@pytest.mark.parametrize(
    "entries,job,hint,reason,message",
    [
        ([q("a1", seq=1)], "a1", None, WaitReason.QUEUED_BEHIND_OTHERS, "1st in your tenant's queue"),
        (
            [q("a1", seq=1, not_before=NOW + 30)],
            "a1",
            None,
            WaitReason.RETRY_BACKOFF,
            "1st in your tenant's queue; retry back-off for 30s",
        ),
        (
            [q("a1", seq=1)],
            "a1",
            WaitReason.TOPOLOGY_FRAGMENTED,
            WaitReason.TOPOLOGY_FRAGMENTED,
            "1st in your tenant's queue; needs 64 GPUs in one rack; largest free rack has 40",
        ),
        (
            [running("r", "a", "H100", 8), q("a1", "a", seq=1), q("b1", "b", seq=2)],
            "a1",
            None,
            WaitReason.FAIR_SHARE,
            "1st in your tenant's queue; tenant over fair share",
        ),
        (
            [q("a1", "a", gpus=4, preemptible=True, models=("H100",))],
            "a1",
            None,
            WaitReason.QUEUED_BEHIND_OTHERS,
            "1st in your tenant's queue",
        ),  # preemptible jobs may borrow: quota does not block them
        ([running("r", "a", "H100", 8, state=S.RUNNING)], "r", None, WaitReason.UNSPECIFIED, "not waiting"),
    ],
)
def test_why_waiting_cases(
    entries: list[QueueEntry], job: str, hint: WaitReason | None, reason: WaitReason, message: str
) -> None:
    s = snap(entries, QueuePolicy(quotas={("a", "H100"): 8}))
    hint_message = "needs 64 GPUs in one rack; largest free rack has 40" if hint else ""
    w = s.why_waiting(job, hint=hint, hint_message=hint_message)
    assert (w.reason, w.message) == (reason, message)


def test_over_fair_share_needs_someone_waiting() -> None:
    s = snap([running("r", "a", "H100", 64), q("a1", "a", seq=1)])
    assert not s.over_fair_share("a")


@pytest.mark.parametrize(
    "n,text",
    [
        (1, "1st"),
        (2, "2nd"),
        (3, "3rd"),
        (4, "4th"),
        (11, "11th"),
        (12, "12th"),
        (13, "13th"),
        (21, "21st"),
        (102, "102nd"),
        (111, "111th"),
    ],
)
def test_ordinal(n: int, text: str) -> None:
    assert ordinal(n) == text


# -- the book ----------------------------------------------------------------------------------------


def test_book_follows_job_changes() -> None:
    book = QueueBook(QueuePolicy())
    j = job_record("j1", state=S.QUEUED, attempt=0, gpus=8, seq=1)
    book.on_job(j, None)
    assert [e.job_id for e in book.snapshot(NOW).order()] == ["j1"]
    running_job = job_record("j1", state=S.RUNNING, attempt=1, gpus=8, seq=1)
    book.on_job(running_job, attempt_record("j1", 1, model="A100", gpus=8))
    s = book.snapshot(NOW)
    assert s.order() == () and s.usage.used("t1", "A100") == 8
    book.on_job(job_record("j1", state=S.SUCCEEDED, attempt=1, seq=1), None)
    assert len(book) == 0


def test_book_loads_from_store_lists() -> None:
    jobs = [job_record("j1", state=S.RUNNING, attempt=2, seq=1), job_record("j2", seq=2)]
    attempts = [attempt_record("j1", 2, model="H100", gpus=4)]
    book = QueueBook(QueuePolicy())
    book.load(jobs, attempts)
    s = book.snapshot(NOW)
    assert s.usage.used("t1", "H100") == 4 and [e.job_id for e in s.order()] == ["j2"]


def test_policy_from_tenancy() -> None:
    from broker.scheduling.queue import policy_from_tenancy
    from broker.tenancy.policy import parse_policy

    pol = parse_policy(
        "tenants:\n"
        "  - {name: a, weight: 2, quotas: {H100: 16, '*': 4}, priority_bands: [default, high]}\n"
        "  - {name: b}\n"
        "priority_bands: {default: 0, high: 100}\n"
    )
    qp = policy_from_tenancy(pol, model_weights={"H100": 2.0})
    assert (qp.tenant_weight("a"), qp.tenant_weight("b")) == (2.0, 1.0)
    assert (qp.quota("a", "H100"), qp.quota("a", "A100"), qp.quota("b", "H100")) == (16, 4, None)
    assert (qp.band_rank("high"), qp.band_rank("default"), qp.model_weight("H100")) == (100, 0, 2.0)


# -- fair-share preemption and drain holds -------------------------------------------------------------


def test_drain_hold_is_charged_and_explained() -> None:
    holder = q("a1", "a", gpus=64, model="H100", charged=24.0, models=("H100",))
    holder = QueueEntry(**{**{f: getattr(holder, f) for f in holder.__dataclass_fields__}, "drain_hold": True})
    s = snap([holder, q("b1", "b", gpus=8)], QueuePolicy(quotas={("a", "H100"): 100}))
    assert s.usage.used("a", "H100") == 24
    assert [e.job_id for e in s.order()] == ["b1", "a1"]  # its held idle GPUs count for fair share
    w = s.why_waiting("a1")
    assert WaitReason.DRAINING_DOMAIN in w.reasons
    assert "holding a domain while it drains (24 idle GPUs charged to you)" in w.message


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from("abc"),
            st.sampled_from([1.0, 4.0, 8.0]),
            st.booleans(),
            st.booleans(),
            st.booleans(),
            st.sampled_from([(), ("H100",)]),
            st.sampled_from(["default", "high"]),
        ),
        min_size=1,
        max_size=30,
    ),
    st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from([8.0, 16.0])), max_size=4),
    st.sets(st.integers(0, 29), max_size=5),
)
def test_why_all_waiting_is_why_waiting_for_each_job(
    raw: list[tuple[str, float, bool, bool, bool, tuple[str, ...], str]],
    held_gpus: list[tuple[str, float]],
    hinted: set[int],
) -> None:
    """The one-pass form the fleet view counts with gives every queued job exactly its own answer."""
    entries = [running(f"r{i}", t, "H100", g) for i, (t, g) in enumerate(held_gpus)]
    for i, (tenant, gpus, backing_off, preemptible, held, models, band) in enumerate(raw):
        e = q(
            f"{tenant}{i}",
            tenant,
            gpus=gpus,
            band=band,
            models=models,
            preemptible=preemptible,
            not_before=NOW + 30 if backing_off else 0.0,
        )
        entries.append(dataclasses.replace(e, held=held))
    s = snap(entries, QueuePolicy(quotas={("a", "H100"): 8, ("b", "*"): 16}, band_ranks={"high": 10, "default": 0}))
    hints = {
        e.job_id: (WaitReason.INSUFFICIENT_CAPACITY, "no room")
        for i, e in enumerate(x for x in entries if x.state is S.QUEUED)
        if i in hinted
    }
    batch = s.why_all_waiting(hints)
    assert set(batch) == {e.job_id for e in entries if e.state is S.QUEUED}
    for job_id, info in batch.items():
        hint, message = hints.get(job_id, (None, ""))
        assert info == s.why_waiting(job_id, hint=hint, hint_message=message)


def test_one_wait_reason_enum_matches_the_wire_enum() -> None:
    from tandem.v1 import job_pb2

    wire = {name.removeprefix("WAIT_REASON_") for name in job_pb2.WaitReason.keys()}
    assert wire == {r.value for r in WaitReason}
