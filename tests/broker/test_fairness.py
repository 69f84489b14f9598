"""Fair share by water-filling, and the rules of who may preempt whom (broker.scheduling.fairness)."""

from __future__ import annotations

import itertools
import random

import pytest

from broker.domain.states import JobState as S
from broker.scheduling import fairness as f
from broker.scheduling.queue import QueueEntry, QueuePolicy, QueueSnapshot

NOW = 10_000.0


def run(
    job_id: str,
    tenant: str,
    gpus: float,
    *,
    model: str = "H100",
    preemptible: bool = True,
    band: str = "",
    priority: int = 0,
    seq: int = 1,
    state: S = S.RUNNING,
) -> QueueEntry:
    return QueueEntry(
        job_id,
        tenant,
        "q",
        band,
        priority,
        seq,
        state,
        gpus,
        (model,),
        preemptible,
        charged_model=model,
        charged_gpus=gpus,
    )


def wait(
    job_id: str,
    tenant: str,
    gpus: float,
    *,
    model: str = "H100",
    preemptible: bool = False,
    band: str = "",
    priority: int = 0,
    seq: int = 100,
) -> QueueEntry:
    return QueueEntry(job_id, tenant, "q", band, priority, seq, S.QUEUED, gpus, (model,), preemptible)


def snap(entries: list[QueueEntry], policy: QueuePolicy | None = None) -> QueueSnapshot:
    return QueueSnapshot.build(entries, policy or QueuePolicy(), NOW)


def reason(
    s: QueueSnapshot,
    capacity: float,
    p: QueueEntry,
    v: QueueEntry,
    knobs: f.TenantKnobs | None = None,
    running_s: float = 3600.0,
) -> f.PreemptReason | None:
    shares = f.shares_of(s, capacity)
    return f.victim_reason(
        s, shares, p, v.charged_model, p.gpus, v, knobs or f.TenantKnobs(), running_s=running_s, min_runtime_s=900.0
    )


# -- water-filling -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "capacity,weights,demands,expected",
    [
        (64, {"a": 1, "b": 1, "c": 2}, {"a": 100, "b": 100, "c": 100}, {"a": 16, "b": 16, "c": 32}),
        # a asks for less than its share: what it leaves goes to the others by weight
        (64, {"a": 1, "b": 1, "c": 2}, {"a": 4, "b": 100, "c": 100}, {"a": 4, "b": 20, "c": 40}),
        # everyone satisfied: shares are the demands
        (64, {"a": 1, "b": 3}, {"a": 8, "b": 8}, {"a": 8, "b": 8}),
        # nobody asks
        (64, {"a": 1}, {"a": 0}, {"a": 0}),
        # cascade: two caps in turn
        (100, {"a": 1, "b": 1, "c": 1}, {"a": 10, "b": 30, "c": 100}, {"a": 10, "b": 30, "c": 60}),
    ],
)
def test_water_fill(
    capacity: float, weights: dict[str, float], demands: dict[str, float], expected: dict[str, float]
) -> None:
    got = f.water_fill(capacity, weights, demands)
    assert got == pytest.approx(expected)


def test_water_fill_never_exceeds_demand_or_capacity() -> None:
    rng = random.Random(7)
    for _ in range(500):
        tenants = [f"t{i}" for i in range(rng.randint(1, 6))]
        weights = {t: rng.choice([0.5, 1, 2, 3]) for t in tenants}
        demands = {t: rng.choice([0, 4, 8, 64, 200]) for t in tenants}
        cap = rng.choice([0, 16, 64, 512])
        got = f.water_fill(cap, weights, demands)
        assert all(got[t] <= demands[t] + 1e-6 for t in tenants)
        assert sum(got.values()) == pytest.approx(min(cap, sum(demands.values())), abs=1e-6)


def test_shares_count_queued_demand() -> None:
    s = snap([run("a1", "a", 32), wait("b1", "b", 16), wait("b2", "b", 64)])
    sh = f.shares_of(s, 64)
    assert sh.demand == {"a": 32, "b": 80}
    assert sh.fair == pytest.approx({"a": 32, "b": 32})


# -- who may preempt whom ------------------------------------------------------------------------------


def test_a_job_that_is_not_preemptible_is_never_a_victim() -> None:
    pol = QueuePolicy(quotas={("b", "H100"): 0}, band_ranks={"high": 10})
    victim = run("b1", "b", 32, preemptible=False)
    s = snap([victim, wait("a1", "a", 8, band="high")], pol)
    assert reason(s, 32, s.entries["a1"], victim) is None


def test_owner_reclaims_borrowed_gpus() -> None:
    pol = QueuePolicy(quotas={("a", "H100"): 16, ("b", "H100"): 16})
    borrower = run("b1", "b", 32)
    s = snap([borrower, wait("a1", "a", 16)], pol)
    assert reason(s, 32, s.entries["a1"], borrower, running_s=0) is f.PreemptReason.RECLAIM  # no minimum runtime
    assert reason(s, 32, s.entries["a1"], borrower, f.TenantKnobs(reclaim="Never"), running_s=0) is None
    assert reason(s, 32, s.entries["a1"], borrower, f.TenantKnobs(reclaim="LowerPriority"), running_s=0) is None


def test_a_job_that_would_borrow_preempts_only_borrowers_below_its_threshold() -> None:
    pol = QueuePolicy(quotas={("a", "H100"): 0, ("b", "H100"): 0})
    borrower = run("b1", "b", 8, priority=1)
    s = snap([borrower, wait("a1", "a", 8, preemptible=True, priority=5)], pol)
    assert reason(s, 8, s.entries["a1"], borrower) is None
    assert (
        reason(s, 8, s.entries["a1"], borrower, f.TenantKnobs(borrow_preempt_max_priority=1)) is f.PreemptReason.RECLAIM
    )
    assert reason(s, 8, s.entries["a1"], borrower, f.TenantKnobs(borrow_preempt_max_priority=0)) is None


def test_a_higher_band_preempts_a_lower_one_of_any_tenant() -> None:
    pol = QueuePolicy(band_ranks={"high": 10})
    low = run("b1", "b", 8)
    s = snap([low, wait("a1", "a", 8, band="high")], pol)
    assert reason(s, 8, s.entries["a1"], low, running_s=0) is f.PreemptReason.PRIORITY_BAND
    s2 = snap([run("b1", "b", 8, band="high"), wait("a1", "a", 8)], pol)
    assert reason(s2, 8, s2.entries["a1"], s2.entries["b1"]) is None


def test_fair_share_preemption_needs_the_victim_tenant_over_and_the_preemptor_under() -> None:
    hog = [run(f"b{i}", "b", 8, seq=i) for i in range(4)]
    s = snap(hog + [wait("a1", "a", 8)])
    assert reason(s, 32, s.entries["a1"], hog[3]) is f.PreemptReason.FAIR_SHARE
    assert reason(s, 32, s.entries["a1"], hog[3], running_s=60) is None  # minimum runtime
    assert reason(s, 32, s.entries["a1"], hog[3], f.TenantKnobs(fair_share_preemption=False)) is None


def test_a_tenant_just_under_its_fair_share_is_never_a_fair_share_victim() -> None:
    # capacity 64, both want everything: fair share 32 each. b holds 31.68 = 0.99 of it.
    b = run("b1", "b", 31.68)
    s = snap([b, run("a0", "a", 8), wait("a1", "a", 24), wait("b2", "b", 64)])
    assert f.shares_of(s, 64).fair["b"] == pytest.approx(32)
    assert reason(s, 64, s.entries["a1"], b) is None
    # protection is a knob of the preemptor's rules: a fraction of 0.9 leaves 0.99 unprotected, but the final
    # share rule still holds: a with its 24 (32) would be above b without its job (0)
    assert reason(s, 64, s.entries["a1"], b, f.TenantKnobs(protected_fraction=0.9)) is None


def test_no_preemption_for_a_gap_smaller_than_the_job() -> None:
    # fair share 16 each of 32; a holds 12: a 8-GPU job would take it to 20, past its share.
    s = snap([run("a0", "a", 12), run("b1", "b", 20), wait("a1", "a", 8), wait("b2", "b", 8)])
    assert reason(s, 32, s.entries["a1"], s.entries["b1"]) is None


def test_within_tenant_knobs() -> None:
    low = run("a0", "a", 8, priority=1, seq=1)
    s = snap([low, wait("a1", "a", 8, priority=5, seq=2)])
    assert reason(s, 8, s.entries["a1"], low) is None  # Never by default
    assert (
        reason(s, 8, s.entries["a1"], low, f.TenantKnobs(within_tenant="LowerPriority"))
        is f.PreemptReason.WITHIN_TENANT
    )
    equal_newer = run("a2", "a", 8, priority=5, seq=9)
    s2 = snap([equal_newer, wait("a1", "a", 8, priority=5, seq=2)])
    knobs = f.TenantKnobs(within_tenant="LowerOrNewerEqualPriority")
    assert reason(s2, 8, s2.entries["a1"], equal_newer, knobs) is f.PreemptReason.WITHIN_TENANT
    assert reason(s2, 8, s2.entries["a1"], equal_newer, f.TenantKnobs(within_tenant="LowerPriority")) is None


def test_final_share_rule_is_checked_over_the_whole_set_of_victims() -> None:
    hog = [run(f"b{i}", "b", 8, seq=i) for i in range(4)]
    s = snap(hog + [wait("a1", "a", 16)])
    sh = f.shares_of(s, 32)
    one = [(hog[3], f.PreemptReason.FAIR_SHARE, 8.0)]
    two = [(hog[3], f.PreemptReason.FAIR_SHARE, 8.0), (hog[2], f.PreemptReason.FAIR_SHARE, 8.0)]
    three = two + [(hog[1], f.PreemptReason.FAIR_SHARE, 8.0)]
    assert f.final_share_ok(sh, "a", 8.0, one)
    assert f.final_share_ok(sh, "a", 16.0, two)  # b keeps 16, a gets 16
    assert not f.final_share_ok(sh, "a", 16.0, three)  # b would keep 8 < a's 16


def test_fair_share_preemptions_never_cycle() -> None:
    """Random fleets of equal 8-GPU jobs: apply every allowed fair-share preemption, one at a time, and the
    fleet never comes back to an allocation it had (each one shrinks the largest share gap)."""
    rng = random.Random(11)
    for _ in range(60):
        tenants = ["a", "b", "c"]
        weights = {t: rng.choice([1.0, 2.0]) for t in tenants}
        held = {t: rng.randint(0, 6) for t in tenants}
        seen = {tuple(held[t] for t in tenants)}
        for step in range(50):  # noqa: B007 - the last step is read after the loop
            entries: list[QueueEntry] = []
            for t in tenants:
                entries += [run(f"{t}{i}", t, 8, seq=i) for i in range(held[t])]
                entries += [wait(f"{t}-w{i}", t, 8, seq=100 + i) for i in range(4)]
            s = snap(entries, QueuePolicy(tenant_weights=weights))
            cap = 8.0 * sum(held.values())
            moves = [
                (p, v)
                for p, v in itertools.permutations(tenants, 2)
                if held[v] > 0 and reason(s, cap, s.entries[f"{p}-w0"], s.entries[f"{v}{held[v] - 1}"]) is not None
            ]
            if not moves:
                break
            p, v = rng.choice(moves)
            held[p] += 1
            held[v] -= 1
            state = tuple(held[t] for t in tenants)
            assert state not in seen, (weights, state)
            seen.add(state)
        assert step < 49


def test_decayed_usage_forgets_with_its_half_life() -> None:
    d = f.DecayedUsage(3600.0)
    d.observe(0.0, {"a": 64.0})
    assert d.observe(3600.0, {"a": 0.0})["a"] == pytest.approx(32.0)
    assert d.observe(7200.0, {"a": 0.0})["a"] == pytest.approx(16.0)
    now = f.DecayedUsage(0.0)
    assert now.observe(5.0, {"a": 3.0}) == {"a": 3.0}


def test_tenant_usage_rows_show_borrowed_gpus() -> None:
    pol = QueuePolicy(quotas={("a", "H100"): 16})
    s = snap([run("a1", "a", 24), wait("b1", "b", 8)], pol)
    rows = {r.tenant: r for r in f.tenant_usage(s, f.shares_of(s, 32))}
    assert rows["a"].gpus == {"H100": 24} and rows["a"].borrowed == {"H100": 8} and rows["a"].quotas == {"H100": 16}
    assert rows["b"].demand_cost == 8 and rows["b"].fair_share_cost == 8


def test_a_tenants_own_jobs_follow_its_within_tenant_knob_even_across_bands() -> None:
    pol = QueuePolicy(band_ranks={"high": 10})
    own_low = run("a0", "a", 8)
    s = snap([own_low, wait("a1", "a", 8, band="high")], pol)
    assert reason(s, 8, s.entries["a1"], own_low) is None  # Never: not even from a higher band
    assert (
        reason(s, 8, s.entries["a1"], own_low, f.TenantKnobs(within_tenant="LowerPriority"))
        is f.PreemptReason.WITHIN_TENANT
    )
