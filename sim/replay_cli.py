"""`tandem-replay`: replay a pod list on a node list under FGD's protocol and compare policies."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from placement.scoring import DEFAULT_POLICY, POLICY_NAMES
from sim.replay import SEEDS, RunResult, replay_many
from sim.report import load_expected, summarise, table
from sim.trace import load_nodes, load_pods


def parse_seeds(text: str) -> tuple[int, ...]:
    """`42-51`, `42,45,47` or a mix such as `42-44,50`."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-", 1))
            if hi < lo:
                raise argparse.ArgumentTypeError(f"empty seed range {part!r}")
            seeds.extend(range(lo, hi + 1))
        else:
            seeds.append(int(part))
    if not seeds:
        raise argparse.ArgumentTypeError("no seeds given")
    return tuple(seeds)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tandem-replay", description=__doc__)
    p.add_argument("--nodes", type=Path, required=True, help="node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
    p.add_argument("--pods", type=Path, required=True, action="append", help="pod list CSV; repeat for several")
    p.add_argument(
        "--policy",
        action="append",
        choices=(*POLICY_NAMES, "all"),
        help=f"policy to replay; repeat for several (default: {DEFAULT_POLICY})",
    )
    p.add_argument("--seeds", type=parse_seeds, default=SEEDS, help="e.g. 42-51 (default)")
    p.add_argument("--json", type=Path, help="write the summary as JSON here")
    p.add_argument("--expected", type=Path, help="FGD's analysis_allo_discrete.csv, for the paper's figures")
    p.add_argument("--processes", type=int, default=None, help="worker processes (default: CPU count)")
    return p


def run(args: argparse.Namespace) -> dict[str, object]:
    policies: list[str] = args.policy or [DEFAULT_POLICY]
    if "all" in policies:
        policies = list(POLICY_NAMES)
    nodes = load_nodes(args.nodes)
    expected = load_expected(args.expected) if args.expected else None
    runs: list[RunResult] = []
    wall: dict[str, float] = {}
    for pods_path in args.pods:
        pods = load_pods(pods_path)
        start = time.perf_counter()
        runs.extend(replay_many(nodes, pods, policies, args.seeds, args.processes))
        wall[pods.name] = time.perf_counter() - start
    return summarise(runs, expected, wall)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        summary = run(args)
    except (OSError, KeyError, ValueError) as exc:
        print(f"tandem-replay: {exc}", file=sys.stderr)
        return 2
    print(table(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
