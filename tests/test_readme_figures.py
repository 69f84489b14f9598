"""README.md's benchmark table is what scripts/readme_figures.py renders from bench/results/.

* the committed table matches the committed results (a bench re-run that changes bench/results/ fails
  here until `python scripts/readme_figures.py` is run);
* the renderer quotes the worst row, not only the best: picked from a small hand-made result.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


SCRIPTS = REPO_ROOT / "scripts"


def _load_scripts() -> tuple[ModuleType, ModuleType, ModuleType]:
    """The script and the two modules beside it, imported as running it imports them (its directory on sys.path)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    return (
        importlib.import_module("readme_figures"),
        importlib.import_module("bench_results"),
        importlib.import_module("readme_rows"),
    )


figures, bench_results, readme_rows = _load_scripts()


def test_readme_table_matches_committed_results() -> None:
    diff = figures.check()
    assert diff == "", f"README.md's benchmark table is stale; run python scripts/readme_figures.py\n{diff}"


def test_every_benchmark_has_a_row() -> None:
    table = figures.render_table(bench_results.load_results())
    for name in bench_results.BENCHMARKS:
        assert f"| `{name}`" in table, name


def test_worst_and_best_pick_the_extremes() -> None:
    rows = [{"scenario": "a", "p99": 4.7}, {"scenario": "b", "p99": 17.0}, {"scenario": "c", "p99": 2.4}]
    assert bench_results.worst(rows, "p99")["scenario"] == "b"
    assert bench_results.best(rows, "p99")["scenario"] == "c"
    rates = [{"mode": "batched", "per_s": 2184.3}, {"mode": "single", "per_s": 446.2}]
    assert bench_results.worst(rates, "per_s", higher_is_better=True)["mode"] == "single"
    assert bench_results.best(rates, "per_s", higher_is_better=True)["mode"] == "batched"
    with pytest.raises(bench_results.FiguresError):
        bench_results.worst([], "p99")


def _extender_row(
    nodes: int, cluster: str, mode: str, cached: bool, p50: float, p99: float, passed: int, per_s: float
) -> dict[str, Any]:
    return {
        "nodes": nodes,
        "cluster": cluster,
        "mode": mode,
        "cached": cached,
        "candidates": nodes,
        "passed": passed,
        "pair_p50_ms": p50,
        "pair_p99_ms": p99,
        "pairs_per_s": per_s,
        "load_1m": 0.5,
    }


def test_extender_row_names_the_worst_scenario() -> None:
    """At the largest node count the new-pod-shape scenario is the slowest here: it is named as worst."""
    extender = {
        "rows": [
            _extender_row(500, "mixed", "names", False, 3.9, 99.0, 126, 258.7),  # other node count: ignored
            _extender_row(5000, "mixed", "names", True, 3.2, 4.7, 1251, 314.7),
            _extender_row(5000, "mixed", "names", False, 13.4, 14.6, 1251, 73.6),
            _extender_row(5000, "prefiltered", "names", True, 4.2, 9.9, 5000, 200.7),
            _extender_row(5000, "mixed", "nodelist", True, 213.3, 344.5, 1251, 4.6),
        ],
        "decide_in_process": [{"nodes": 5000, "pair_p50_ms": 1.9, "pair_p99_ms": 2.3}],
        "churn_in_process": [{"nodes": 5000, "pair_after_bind_p50_ms": 3.5, "pair_after_bind_p99_ms": 6.6}],
    }
    results = bench_results.Results(
        json={"extender": extender}, md={"extender": "Goal: pair p99 <= 5 ms at 5,000 nodes in names mode."}
    )
    label, text = readme_rows.extender_row(results)
    assert "5,000 candidate nodes" in label
    assert "mixed cluster, a new pod shape per request (worst p99): p50 13.4 ms, p99 14.6 ms, 74 pairs/s" in text
    assert "mixed cluster, same pod shape (best): p50 3.2 ms, p99 4.7 ms" in text
    assert "99.0 ms" not in text
    assert "goal p99 ≤ 5 ms: met by 1 of 3" in text
    assert "worst p99 345 ms" in text


def test_missing_markers_are_an_error() -> None:
    with pytest.raises(bench_results.FiguresError):
        figures.splice("# README without markers\n", "| a | b |\n")


def test_splice_replaces_only_the_block() -> None:
    readme = f"before\n{figures.BEGIN}\nold table\n{figures.END}\nafter\n"
    assert figures.splice(readme, "| new |\n") == f"before\n{figures.BEGIN}\n\n| new |\n\n{figures.END}\nafter\n"


def test_check_reports_a_stale_table(tmp_path: Path) -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    begin = readme.index(figures.BEGIN)
    stale = readme[:begin] + readme[begin:].replace("| `extender`", "| `extender` (edited by hand)", 1)
    path = tmp_path / "README.md"
    path.write_text(stale, encoding="utf-8")
    diff = figures.check(path)
    assert "-| `extender` (edited by hand)" in diff
    assert "+| `extender`, " in diff
    assert figures.write(path) and figures.check(path) == ""
