"""The fleet report: figures from hand-made runs with known outcomes, and the files it writes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from fleetplan.catalog import Level
from fleetsim.model import ClusterSpec, FleetSpec, NodeGroup, Outcome, RunResult, TenantSpec, WorkItem
from fleetsim.report import write_report
from fleetsim.report_markdown import summary_table
from fleetsim.summary import gang_bucket, percentile, summarise, time_weighted_allocation

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RACK = Level("rack", "network.example.com/rack")


def group(name: str, nodes: int) -> NodeGroup:
    return NodeGroup(
        name,
        "NVIDIA-H100-80GB-HBM3",
        nodes=nodes,
        gpus_per_node=8,
        gpu_memory_mib=81559,
        cpu_cores=192,
        memory_gib=2048,
    )


FLEET = FleetSpec(
    "two",
    (
        ClusterSpec("a", "eu-west", "training", (RACK,), (group("ga", 1),)),
        ClusterSpec("b", "eu-north", "training", (RACK,), (group("gb", 1),)),
    ),
    (TenantSpec("big", 3.0), TenantSpec("small", 1.0), TenantSpec("idle", 1.0)),
)


def item(name: str, *, tenant: str = "big", replicas: int = 1, gpus: int = 1) -> WorkItem:
    return WorkItem(name, tenant, "gang" if replicas > 1 else "batch", 0.0, 100.0, replicas=replicas, gpus=gpus)


def started(
    name: str,
    wait: float,
    *,
    tenant: str = "big",
    replicas: int = 1,
    gpus: int = 1,
    domains: tuple[str, ...] = (),
    dispatches: int = 0,
    false_dispatches: int = 0,
    false_dispatch_causes: tuple[str, ...] = (),
    duplicates: int = 0,
) -> Outcome:
    """An item submitted at 0 that started after `wait` seconds and ran 100 s."""
    return Outcome(
        item(name, tenant=tenant, replicas=replicas, gpus=gpus),
        0.0,
        placed_s=wait,
        started_s=wait,
        finished_s=wait + 100.0,
        cluster="a",
        domains=domains,
        dispatches=dispatches,
        false_dispatches=false_dispatches,
        false_dispatch_causes=false_dispatch_causes,
        duplicates=duplicates,
    )


def run(
    outcomes: list[Outcome],
    *,
    mode: str = "fast",
    policy: str = "tandem",
    seed: int = 0,
    allocation: list[tuple[float, dict[str, float]]] | None = None,
    makespan_s: float = 0.0,
    fleet: FleetSpec = FLEET,
    notes: list[str] | None = None,
    latency: list[float] | None = None,
) -> RunResult:
    return RunResult(mode, policy, fleet, seed, outcomes, allocation or [], latency or [], 0, makespan_s, notes or [])


def only_group(summary: dict[str, Any]) -> dict[str, Any]:
    groups = summary["groups"]
    assert len(groups) == 1
    return dict(groups[0])


def test_percentile_interpolates_between_ranks() -> None:
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 95) == pytest.approx(19.05)
    assert percentile(values, 50) == pytest.approx(10.5)
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_queueing_delay_percentiles_overall_per_tenant_and_per_gang_size() -> None:
    outcomes = [started(f"j{i}", float(i), tenant="big" if i % 2 else "small") for i in range(1, 21)]
    outcomes += [
        started("g4", 500.0, replicas=4),
        started("g16", 900.0, replicas=16),
        started("g40", 1800.0, replicas=40),
    ]
    never = Outcome(item("late"), 0.0)
    g = only_group(summarise([run(outcomes + [never])]))
    delays = g["queueing_delay_s"]
    assert delays["not_started"] == 1
    ones = delays["per_gang_size"]["1"]
    assert ones["n"] == 20 and ones["p95"] == pytest.approx(19.05) and ones["p50"] == pytest.approx(10.5)
    assert delays["per_gang_size"]["2-7"]["p99"] == 500.0
    assert delays["per_gang_size"]["8-15"]["n"] == 0 and delays["per_gang_size"]["8-15"]["p95"] is None
    assert delays["per_gang_size"]["16-31"]["p50"] == 900.0
    assert delays["per_gang_size"]["32+"]["p50"] == 1800.0
    assert delays["large_gangs"]["n"] == 2 and delays["large_gangs"]["p50"] == pytest.approx(1350.0)
    # odd waits 1, 3, ..., 19 are "big"'s (plus the three gangs'), even ones "small"'s
    assert delays["per_tenant"]["small"]["n"] == 10
    assert delays["per_tenant"]["small"]["p50"] == pytest.approx(11.0)
    assert delays["overall"]["n"] == 23
    assert g["jobs"] == 24 and g["started"] == 23 and g["finished"] == 23


def test_gang_buckets() -> None:
    assert [gang_bucket(n) for n in (1, 2, 7, 8, 15, 16, 31, 32, 64)] == [
        "1",
        "2-7",
        "2-7",
        "8-15",
        "8-15",
        "16-31",
        "16-31",
        "32+",
        "32+",
    ]


def test_split_gangs_count_outcomes_on_more_than_one_domain() -> None:
    outcomes = [
        started("split", 1.0, replicas=4, domains=("r1", "r2", "r1", "r1")),
        started("whole", 1.0, replicas=4, domains=("r1", "r1", "r1", "r1")),
        started("one", 1.0, replicas=2, domains=("r3",)),
        started("none", 1.0),
    ]
    assert only_group(summarise([run(outcomes)]))["split_gangs"] == 1


def test_false_dispatch_rate_causes_replans_and_duplicates() -> None:
    outcomes = [
        started("a", 1.0, dispatches=1),
        started("b", 1.0, dispatches=2, false_dispatches=1, false_dispatch_causes=("GANG_TIMEOUT",)),
        started(
            "c",
            1.0,
            dispatches=3,
            false_dispatches=2,
            false_dispatch_causes=("REJECTED:NO_FIT", "GANG_TIMEOUT"),
            duplicates=2,
        ),
        Outcome(item("never"), 0.0),  # never dispatched
    ]
    g = only_group(summarise([run(outcomes)]))
    fd = g["false_dispatches"]
    assert (fd["count"], fd["dispatches"], fd["rate"]) == (3, 6, 0.5)
    assert fd["causes"] == {"GANG_TIMEOUT": 2, "REJECTED:NO_FIT": 1}
    assert g["replans"] == 3
    assert g["duplicates"] == 2


def test_no_dispatches_means_no_rate() -> None:
    g = only_group(summarise([run([Outcome(item("x"), 0.0)])]))
    assert g["false_dispatches"]["rate"] is None


def test_allocation_is_weighted_by_the_time_each_sample_holds() -> None:
    # a holds 8 GPUs for 10 s, then 0 for 30 s, then 4 for the last 10 s (until the makespan, 50 s).
    samples = [(0.0, {"a": 8.0, "b": 0.0}), (10.0, {"a": 0.0, "b": 8.0}), (40.0, {"a": 4.0, "b": 4.0})]
    fleet_pct, per_cluster = time_weighted_allocation(run([], allocation=samples, makespan_s=50.0))
    assert per_cluster == {"a": pytest.approx(30.0), "b": pytest.approx(70.0)}
    assert fleet_pct == pytest.approx(50.0)
    g = only_group(summarise([run([], allocation=samples, makespan_s=50.0)]))
    assert g["allocation"]["mean_pct"] == pytest.approx(50.0)
    assert g["allocation"]["per_cluster_pct"] == {"a": 30.0, "b": 70.0}


def test_allocation_without_elapsed_time_is_a_plain_mean_and_without_samples_none() -> None:
    fleet_pct, _ = time_weighted_allocation(run([], allocation=[(5.0, {"a": 8.0}), (5.0, {"a": 0.0})]))
    assert fleet_pct == pytest.approx(25.0)
    assert time_weighted_allocation(run([])) == (None, {"a": None, "b": None})


def test_allocation_over_seeds_mean_and_p50() -> None:
    runs = [
        run([], seed=s, allocation=[(0.0, {"a": a, "b": 0.0})], makespan_s=10.0)
        for s, a in ((0, 1.6), (1, 3.2), (2, 9.6))
    ]  # 10 %, 20 %, 60 % of 16 GPUs
    alloc = only_group(summarise(runs))["allocation"]
    assert alloc["mean_pct"] == pytest.approx(30.0)
    assert alloc["p50_over_seeds_pct"] == pytest.approx(20.0)
    assert alloc["per_seed_pct"] == {"0": 10.0, "1": 20.0, "2": 60.0}
    single = only_group(summarise(runs[:1]))["allocation"]
    assert single["p50_over_seeds_pct"] is None


def test_fair_share_deviation_against_weights_of_tenants_with_demand() -> None:
    # big (weight 3) and small (weight 1) each got 8 GPUs x 100 s; idle asked for nothing and is left out:
    # entitled 75 / 25 %, received 50 / 50 %.
    outcomes = [started("x", 0.0, tenant="big", gpus=8), started("y", 0.0, tenant="small", gpus=8)]
    fair = only_group(summarise([run(outcomes)]))["fair_share"]
    assert set(fair["per_tenant"]) == {"big", "small"}
    assert fair["per_tenant"]["big"]["entitled_pct"] == pytest.approx(75.0)
    assert fair["per_tenant"]["big"]["received_pct"] == pytest.approx(50.0)
    assert fair["per_tenant"]["big"]["deviation_pts"] == pytest.approx(-25.0)
    assert fair["per_tenant"]["small"]["deviation_pts"] == pytest.approx(25.0)
    assert fair["max_abs_deviation_pts"] == pytest.approx(25.0)


def test_fair_share_counts_an_unfinished_item_until_the_run_ends() -> None:
    running = Outcome(item("r", tenant="small", gpus=8), 0.0, placed_s=0.0, started_s=0.0)
    done = started("d", 0.0, tenant="big", gpus=8)  # 800 GPU-seconds
    fair = only_group(summarise([run([running, done], makespan_s=300.0)]))["fair_share"]
    # small: 8 GPUs x 300 s = 2400 of 3200 GPU-seconds
    assert fair["per_tenant"]["small"]["received_pct"] == pytest.approx(75.0)


def test_groups_per_mode_and_policy_with_decision_latency_and_makespan() -> None:
    runs = [
        run([started("a", 1.0)], mode="fast", policy="tandem", seed=0, makespan_s=100.0, latency=[0.001, 0.002, 0.003]),
        run([started("a", 1.0)], mode="fast", policy="tandem", seed=1, makespan_s=300.0),
        run([started("a", 1.0)], mode="fast", policy="round-robin", seed=0, makespan_s=50.0),
        run([started("a", 1.0)], mode="wire", policy="tandem", seed=0, makespan_s=60.0),
    ]
    summary = summarise(runs)
    keys = [(g["mode"], g["policy"]) for g in summary["groups"]]
    assert keys == [("fast", "tandem"), ("fast", "round-robin"), ("wire", "tandem")]
    tandem = summary["groups"][0]
    assert tandem["seeds"] == [0, 1] and tandem["jobs"] == 2
    assert tandem["makespan_s"]["mean"] == 200.0 and tandem["makespan_s"]["max"] == 300.0
    assert tandem["decision_latency_ms"]["p50"] == pytest.approx(2.0)
    assert tandem["decision_latency_ms"]["p99"] == pytest.approx(2.98)
    assert summary["groups"][1]["decision_latency_ms"] is None


def test_notes_say_which_runs_they_come_from_and_synthesised_topology() -> None:
    synthetic = FleetSpec(FLEET.name, FLEET.clusters, FLEET.tenants, synthesised_topology=True)
    runs = [
        run([], mode="wire", notes=["time compressed 60x", "shared"], fleet=synthetic),
        run([], mode="fast", notes=["shared"], fleet=synthetic),
    ]
    notes = summarise(runs)["notes"]
    assert any("synthesised" in n for n in notes)
    assert "time compressed 60x (wire/tandem seed 0)" in notes
    assert "shared" in notes


def test_summary_table_has_a_row_per_mode_and_policy() -> None:
    outcomes = [
        started("g", 600.0, replicas=16, dispatches=4, false_dispatches=1, false_dispatch_causes=("GANG_TIMEOUT",))
    ]
    runs = [
        run(outcomes, mode="fast", policy="aggregate", allocation=[(0.0, {"a": 8.0, "b": 0.0})], makespan_s=7200.0),
        run(outcomes, mode="wire", policy="tandem", makespan_s=60.0),
    ]
    lines = summary_table(summarise(runs)).splitlines()
    assert len(lines) == 4
    assert lines[0].split()[:2] == ["policy", "mode"]
    aggregate = lines[2].split()
    assert aggregate[:4] == ["aggregate", "fast", "1", "1"]
    assert "50.0" in aggregate and "25.00" in aggregate and "10.0" in aggregate  # alloc %, false %, wait min
    assert lines[2].endswith("2.0 h")
    assert lines[3].split()[:2] == ["tandem", "wire"]
    assert len({len(line) for line in lines[:2]}) == 1  # fixed width: header and rule align


def test_write_report_writes_markdown_json_and_pngs(tmp_path: Path) -> None:
    outcomes = [
        started(
            f"j{i}",
            10.0 * i,
            tenant=("big", "small")[i % 2],
            replicas=(1, 4, 16)[i % 3],
            domains=("r1", "r2") if i == 4 else ("r1",),
            dispatches=1 + (i == 5),
            false_dispatches=int(i == 5),
            false_dispatch_causes=("GANG_TIMEOUT|LOST",) if i == 5 else (),
        )
        for i in range(12)
    ]
    samples = [(60.0 * t, {"a": float(t % 9), "b": 4.0}) for t in range(30)]
    runs = [
        run(outcomes, mode="fast", policy=p, seed=s, allocation=samples, makespan_s=1800.0)
        for p in ("tandem", "aggregate")
        for s in (0, 1)
    ]
    runs.append(
        run(
            outcomes,
            mode="wire",
            policy="tandem",
            allocation=samples,
            makespan_s=1800.0,
            notes=["wire mode: time compressed 60x"],
        )
    )
    out = tmp_path / "sim" / "results" / "run1"
    report = write_report(runs, out)

    assert report == out / "report.md"
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == [
        "allocation-fast.png",
        "allocation-wire.png",
        "queueing-fast.png",
        "queueing-wire.png",
        "splits-false-dispatches.png",
    ]
    for name in pngs:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 1000

    loaded = json.loads((out / "report.json").read_text())
    assert loaded == summarise(runs)
    assert json.loads(json.dumps(loaded)) == loaded

    text = report.read_text()
    for name in pngs:
        assert f"({name})" in text
    assert "time compressed 60x" in text
    assert "NVIDIA-H100-80GB-HBM3" in text
    # every table's heading names the mode that produced it
    headings = [line for line in text.splitlines() if line.startswith("### ")]
    assert headings and all("(fast mode)" in h or "(wire mode)" in h for h in headings)
    assert any("(wire mode)" in h for h in headings) and any("(fast mode)" in h for h in headings)
    # every Markdown table row has as many cells as its header
    cells = [len(re.findall(r"(?<!\\)\|", line)) if line.startswith("|") else 0 for line in text.splitlines()]
    for previous, current in zip(cells, cells[1:]):
        assert current in (0, previous) or previous == 0


def test_write_report_refuses_no_results(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_report([], tmp_path)
