"""`python -m fleetsim` (`make demo`): the default fleet runs one training mix end to end, and is measured.

Two modes on the same workload (FLEET-NOTES S-1):
* wire mode — the real broker process, and per cluster a simulated Kubernetes API server with its
  kube-scheduler and Job controller stand-ins, the real extender and the real agent as processes;
  launchers submit over gRPC. Time is compressed; the report prints the factor and the pipeline's
  measured overhead. It shows the product doing its job, with Tandem's cluster choice.
* fast mode — the broker's own decision code (fleetplan) in virtual time, for every cluster choice
  (Tandem and the baselines) over several seeds: the headline comparison.

And the preemption experiment (fast mode, its own report under `preemption/`): one tenant floods the fleet
with long preemptible work, then the others' usual mix arrives; Tandem with and without the broker's
preemption decision on the same workloads (`fleetsim.workload.flood_then_mix`).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fleetsim.fast import run_fast
from fleetsim.model import FleetSpec, RunResult, WorkItem
from fleetsim.node_objects import node_objects
from fleetsim.report import write_report
from fleetsim.report_markdown import summary_table
from fleetsim.spec import default_fleet, load_fleet
from fleetsim.summary import summarise
from fleetsim.wire import run_wire
from fleetsim.workload import flood_then_mix, training_mix

__all__ = ["main", "FAST_POLICIES"]

REPO = Path(__file__).resolve().parents[1]
FAST_POLICIES = ("tandem", "aggregate", "round-robin", "multikueue", "merged")
PREEMPTION_POLICIES = ("tandem", "tandem-fair")
"""The preemption experiment (`workload.flood_then_mix`): the same flood and mix with and without preemption."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fleetsim", description=__doc__.splitlines()[0])
    p.add_argument("--fleet", help="fleet description (YAML); default: the built-in fleet")
    p.add_argument("--hours", type=float, default=1.0, help="simulated hours of arrivals (default 1)")
    p.add_argument("--load", type=float, default=0.8, help="offered GPU-hours / fleet GPU-hours (default 0.8)")
    p.add_argument("--seeds", type=int, default=5, help="fast-mode seeds per policy (default 5)")
    p.add_argument(
        "--compression",
        type=float,
        default=30.0,
        help="wire mode: simulated seconds per real second (default 30: the pipeline then stays under "
        "2 %% of the median job on 2 cores)",
    )
    p.add_argument(
        "--wire-tail",
        type=float,
        default=0.25,
        help="wire mode: simulated hours it runs past the last arrival (default 0.25)",
    )
    p.add_argument("--no-wire", action="store_true", help="fast mode only (no processes)")
    p.add_argument("--out", help="report directory (default sim/results/<timestamp>)")
    return p


def _fast(
    fleet: FleetSpec,
    workloads: dict[int, list[WorkItem]],
    progress: Progress,
    policies: Sequence[str] = FAST_POLICIES,
    what: str = "fast mode (virtual time)",
) -> list[RunResult]:
    runs = [(policy, seed) for seed in workloads for policy in policies]
    task = progress.add_task(what, total=len(runs))
    out = []
    for policy, seed in runs:
        out.append(run_fast(fleet, workloads[seed], policy=policy, seed=seed))
        progress.advance(task)
    return out


async def _wire(
    fleet: FleetSpec, items: list[WorkItem], compression: float, horizon_s: float, workdir: Path, progress: Progress
) -> RunResult:
    task = progress.add_task(f"wire mode ({compression:g}x, real processes)", total=len(items))

    def tick(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    nodes = {c.name: node_objects(c) for c in fleet.clusters}
    return await run_wire(
        fleet,
        nodes,
        items,
        compression=compression,
        workdir=workdir / "wire",
        seed=0,
        progress=tick,
        timeout_s=180.0 + 2.0 * horizon_s / compression,
        horizon_s=horizon_s,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console()
    out_dir_arg = args.out
    fleet = load_fleet(args.fleet) if args.fleet else default_fleet()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    out_dir = Path(out_dir_arg) if out_dir_arg else REPO / "sim" / "results" / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    # The simulated clusters' controllers log retries (conflicts, watch restarts): to the run's log, not the console.
    logging.basicConfig(
        filename=out_dir / "demo.log", level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    seeds = list(range(max(1, args.seeds)))
    workloads = {s: training_mix(fleet, hours=args.hours, load=args.load, seed=s) for s in seeds}
    console.print(
        f"[bold]Fleet {fleet.name}[/bold]: "
        + ", ".join(f"{c.name} ({c.region}, {c.role}, {c.gpus} GPUs)" for c in fleet.clusters)
    )
    console.print(
        f"Workload: training mix, {args.hours:g} simulated hours at load {args.load:g}: "
        f"{len(workloads[0])} jobs (seed 0); fast mode over seeds {seeds[0]}–{seeds[-1]}."
    )
    started = time.perf_counter()
    results: list[RunResult] = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        results += _fast(fleet, workloads, progress)
        floods = {s: flood_then_mix(fleet, hours=args.hours, load=args.load, seed=s) for s in seeds}
        flooded = _fast(fleet, floods, progress, PREEMPTION_POLICIES, "preemption: a flood, then the mix (fast)")
        if not args.no_wire:
            with tempfile.TemporaryDirectory(prefix="tandem-fleet-") as tmp:
                horizon_s = (args.hours + args.wire_tail) * 3600.0
                results.append(
                    asyncio.run(_wire(fleet, workloads[0], args.compression, horizon_s, Path(tmp), progress))
                )
    report = write_report(results, out_dir)
    flood_report = write_report(flooded, out_dir / "preemption")
    print(summary_table(summarise(results)))  # plain: a fixed-width table rich would wrap
    console.print(
        f"{len(results) + len(flooded)} runs in {time.perf_counter() - started:.0f} s. Report: {report}; "
        f"preemption: {flood_report}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
