"""Summaries of replay runs beside FGD's published figures: a text table and a JSON document."""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.replay import MAX_COLUMN, RunResult

# FGD artifact policy names -> ours.
PAPER_POLICIES = {
    "01-Random": "random",
    "02-DotProd": "dotprod",
    "03-GpuClustering": "clustering",
    "04-GpuPacking": "packing",
    "05-BestFit": "bestfit",
    "06-FGD": "fgd",
}
COLUMNS = (100, MAX_COLUMN)


@dataclass(frozen=True)
class PaperFigures:
    """Published 10-seed results for one (workload, policy)."""

    seeds: tuple[int, ...]
    alloc100: tuple[float, ...]
    alloc130: tuple[float, ...]
    total_gpus: int

    @property
    def mean100(self) -> float:
        return statistics.fmean(self.alloc100)

    @property
    def mean130(self) -> float:
        return statistics.fmean(self.alloc130)

    def subset(self, seeds: Sequence[int]) -> PaperFigures:
        """The same figures restricted to the given seeds (all of them when none match)."""
        keep = [i for i, s in enumerate(self.seeds) if s in set(seeds)]
        if not keep:
            return self
        return PaperFigures(
            tuple(self.seeds[i] for i in keep),
            tuple(self.alloc100[i] for i in keep),
            tuple(self.alloc130[i] for i in keep),
            self.total_gpus,
        )

    @property
    def unallocated130(self) -> float:
        return self.total_gpus * (1 - self.mean130 / 100)


def load_expected(path: Path) -> dict[tuple[str, str], PaperFigures]:
    """analysis_allo_discrete.csv -> {(workload, our policy name): figures}; workload w/o prefix."""
    acc: dict[tuple[str, str], list[tuple[int, float, float, int]]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            policy = PAPER_POLICIES.get(row["sc_policy"])
            if policy is None or not row["100"] or not row["130"]:
                continue
            key = (row["workload"].removeprefix("openb_pod_list_"), policy)
            acc.setdefault(key, []).append(
                (int(row["seed"]), float(row["100"]), float(row["130"]), int(row["total_gpus"]))
            )
    out: dict[tuple[str, str], PaperFigures] = {}
    for key, rows in acc.items():
        rows.sort()
        out[key] = PaperFigures(
            tuple(r[0] for r in rows),
            tuple(r[1] for r in rows),
            tuple(r[2] for r in rows),
            rows[0][3],
        )
    return out


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def summarise(
    runs: Sequence[RunResult],
    expected: dict[tuple[str, str], PaperFigures] | None = None,
    wall_seconds: dict[str, float] | None = None,
) -> dict[str, Any]:
    """JSON-ready summary per workload and policy (means, per-seed values, paper figures)."""
    out: dict[str, Any] = {}
    for r in runs:
        wl = out.setdefault(r.workload, {})
        pol = wl.setdefault(
            r.policy,
            {
                "seeds": [],
                "alloc100": [],
                "alloc130": [],
                "unallocated130": [],
                "failed": [],
                "pods": [],
                "seconds": [],
            },
        )
        pol["seeds"].append(r.seed)
        pol["alloc100"].append(r.column(100))
        pol["alloc130"].append(r.column(MAX_COLUMN))
        pol["unallocated130"].append(r.unallocated_gpus())
        pol["failed"].append(r.failed)
        pol["pods"].append(r.pods)
        pol["seconds"].append(round(r.seconds, 3))
    for workload, policies in out.items():
        for name, pol in policies.items():
            pol["mean_alloc100"] = _round(_mean(pol["alloc100"]))
            pol["mean_alloc130"] = _round(_mean(pol["alloc130"]))
            pol["mean_unallocated130"] = _round(_mean(pol["unallocated130"]), 1)
            pol["decisions_per_second"] = round(sum(pol["pods"]) / max(sum(pol["seconds"]), 1e-9))
            if wall_seconds and workload in wall_seconds:
                pol["workload_wall_seconds"] = round(wall_seconds[workload], 1)
            fgd = (expected or {}).get((workload, "fgd"))
            fgd = None if fgd is None else fgd.subset(pol["seeds"])
            if fgd is not None and pol["mean_alloc130"] is not None:
                pol["vs_paper_fgd130"] = round(pol["mean_alloc130"] - fgd.mean130, 2)
            paper = (expected or {}).get((workload, name))
            if paper is not None:
                paper = paper.subset(pol["seeds"])
                pol["paper"] = {
                    "mean_alloc100": round(paper.mean100, 2),
                    "mean_alloc130": round(paper.mean130, 2),
                    "mean_unallocated130": round(paper.unallocated130, 1),
                    "seeds": list(paper.seeds),
                    "alloc130": list(paper.alloc130),
                }
    return out


def _round(v: float | None, digits: int = 2) -> float | None:
    return None if v is None else round(v, digits)


def _fmt(v: Any, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def table(summary: dict[str, Any], markdown: bool = False) -> str:
    """One row per (workload, policy): ours vs paper at 100 % and 130 %, unallocated GPUs, speed."""
    head = (
        "workload",
        "policy",
        "seeds",
        "ours@100",
        "paper@100",
        "ours@130",
        "paper@130",
        "Δ130",
        "vs paper FGD@130",
        "unalloc GPUs",
        "paper unalloc",
        "decisions/s",
    )
    rows: list[tuple[str, ...]] = []
    for workload, policies in summary.items():
        for name, pol in policies.items():
            paper = pol.get("paper", {})
            ours130, p130 = pol["mean_alloc130"], paper.get("mean_alloc130")
            delta = None if ours130 is None or p130 is None else ours130 - p130
            rows.append(
                (
                    workload,
                    name,
                    str(len(pol["seeds"])),
                    _fmt(pol["mean_alloc100"]),
                    _fmt(paper.get("mean_alloc100")),
                    _fmt(ours130),
                    _fmt(p130),
                    "—" if delta is None else f"{delta:+.2f}",
                    "—" if pol.get("vs_paper_fgd130") is None else f"{pol['vs_paper_fgd130']:+.2f}",
                    _fmt(pol["mean_unallocated130"], 0),
                    _fmt(paper.get("mean_unallocated130"), 0),
                    str(pol["decisions_per_second"]),
                )
            )
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{'<' if i < 2 else '>'}{w}}}" for i, w in enumerate(widths))
    return "\n".join([fmt.format(*head)] + [fmt.format(*r) for r in rows])
