"""Replay: FGD's discrete allocation columns, runs on tiny clusters, the CLI, and the real trace."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from sim.replay import discrete_allocation, replay, replay_many
from sim.replay_cli import main, parse_seeds
from sim.report import load_expected
from sim.trace import EXPECTED_RESULTS, NODE_LIST, load_nodes, load_pods, trace_dir

# 40 nodes, 150 GPUs: big enough that the last events reach the 130 % column.
NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
    f"n{i:02d},32000,131072,{g},{m}\n" for i, (g, m) in enumerate([(4, "A"), (2, "B"), (8, "A"), (1, "B")] * 10)
)


def pods_csv(n: int = 40) -> str:
    shapes = [
        "4000,8192,1,1000,",
        "2000,4096,1,500,",
        "3000,4096,1,810,B",
        "8000,8192,2,1000,",
        "6000,4096,0,0,",
        "1000,1024,1,250,",
    ]
    rows = [f"p{i:03d},{shapes[i % len(shapes)]}" for i in range(n)]
    return "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + "\n".join(rows) + "\n"


@pytest.fixture()
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(NODES_CSV)
    pods = tmp_path / "openb_pod_list_tiny.csv"
    pods.write_text(pods_csv())
    return nodes, pods


def test_discrete_columns_average_events_by_rounded_arrived_load() -> None:
    total = 10  # GPUs: one percent is 100 milli
    arrived = [40, 60, 150, 250, 13_000]
    used = [40, 60, 150, 250, 9_000]
    cols = discrete_allocation(arrived, used, total)
    assert cols[0] == 0.4  # 0.4 rounds to column 0
    assert cols[1] == 0.6  # 0.6 rounds to 1
    assert cols[2] == pytest.approx((1.5 + 2.5) / 2)  # 1.5 and 2.5 both round half-to-even to 2
    assert cols[3] == pytest.approx((1.5 + 2.5) / 2)  # empty column: neighbours 2..4
    assert cols[50] is None  # no event within one column
    assert cols[130] == 90.0


def test_replay_of_tiny_cluster_is_consistent(tiny: tuple[Path, Path]) -> None:
    nodes, pods = load_nodes(tiny[0]), load_pods(tiny[1])
    run = replay(nodes, pods, "bestfit", 42)
    assert run.pods == len(run.arrived) == len(run.used)
    assert run.arrived[-1] > 1.3 * nodes.total_gpus * 1000 - 1000  # tuned up to the target
    assert all(u <= a for u, a in zip(run.used, run.arrived))
    assert run.used[-1] <= nodes.total_gpus * 1000
    assert run.failed > 0  # 130 % of capacity cannot all fit
    assert replay(nodes, pods, "bestfit", 42).allocation == run.allocation


def test_replay_many_matches_serial(tiny: tuple[Path, Path]) -> None:
    nodes, pods = load_nodes(tiny[0]), load_pods(tiny[1])
    runs = replay_many(nodes, pods, ["random", "tandem-frag"], (42, 43), processes=2)
    assert [(r.policy, r.seed) for r in runs] == [
        ("random", 42),
        ("random", 43),
        ("tandem-frag", 42),
        ("tandem-frag", 43),
    ]
    assert runs[1].allocation == replay(nodes, pods, "random", 43).allocation


def test_cli_writes_json(tiny: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.json"
    code = main(
        [
            "--nodes",
            str(tiny[0]),
            "--pods",
            str(tiny[1]),
            "--policy",
            "bestfit",
            "--policy",
            "fgd",
            "--seeds",
            "42-43",
            "--json",
            str(out),
            "--processes",
            "1",
        ]
    )
    assert code == 0
    summary = json.loads(out.read_text())
    assert set(summary["tiny"]) == {"bestfit", "fgd"}
    fgd = summary["tiny"]["fgd"]
    assert fgd["seeds"] == [42, 43] and len(fgd["alloc130"]) == 2
    assert None not in fgd["alloc130"]
    assert fgd["mean_alloc130"] == pytest.approx(statistics.fmean(fgd["alloc130"]), abs=0.01)
    assert fgd["decisions_per_second"] > 0
    assert "fgd" in capsys.readouterr().out


def test_cli_defaults_to_the_default_policy(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "o.json"
    assert (
        main(["--nodes", str(tiny[0]), "--pods", str(tiny[1]), "--seeds", "42", "--json", str(out), "--processes", "1"])
        == 0
    )
    assert list(json.loads(out.read_text())["tiny"]) == ["tandem-frag"]


def test_cli_reports_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--nodes", str(tmp_path / "none.csv"), "--pods", str(tmp_path / "p.csv")]) == 2
    assert "tandem-replay" in capsys.readouterr().err


def test_parse_seeds() -> None:
    assert parse_seeds("42-44,50") == (42, 43, 44, 50)


REAL = trace_dir()


def test_bestfit_on_the_real_default_trace_matches_the_paper() -> None:
    nodes = load_nodes(REAL / NODE_LIST)
    pods = load_pods(REAL / "openb_pod_list_default.csv")
    run = replay(nodes, pods, "bestfit", 42)
    paper = load_expected(REAL / EXPECTED_RESULTS)[("default", "bestfit")]
    assert nodes.total_gpus == 6212 and len(pods.names) == 8152
    alloc = run.column(130)
    assert alloc is not None and abs(alloc - paper.mean130) < 2.0
