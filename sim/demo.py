"""`python -m sim.demo`: FGD's main experiment (default trace, 130 % load) with Tandem's policy beside it."""

from __future__ import annotations

import os
import sys
import time

from placement.scoring import DEFAULT_POLICY
from sim.replay import SEEDS, replay_many
from sim.report import load_expected, summarise, table
from sim.trace import EXPECTED_RESULTS, NODE_LIST, load_nodes, load_pods, trace_dir

DEMO_POLICIES = ("random", "bestfit", "fgd", DEFAULT_POLICY)


def main() -> int:
    root = trace_dir()
    if not (root / NODE_LIST).exists():
        print(f"trace not found under {root}: run the demo from a checkout of the repository", file=sys.stderr)
        return 2
    seeds = SEEDS[: int(os.environ.get("TANDEM_DEMO_SEEDS", len(SEEDS)))]
    nodes = load_nodes(root / NODE_LIST)
    pods = load_pods(root / "openb_pod_list_default.csv")
    print(
        f"Replaying {pods.name}: {len(pods.names)} pods on {len(nodes.names)} nodes "
        f"({nodes.total_gpus} GPUs), load tuned to 130 %, seeds {seeds[0]}-{seeds[-1]}"
    )
    start = time.perf_counter()
    runs = replay_many(nodes, pods, DEMO_POLICIES, seeds)
    wall = time.perf_counter() - start
    expected_path = root / EXPECTED_RESULTS
    expected = load_expected(expected_path) if expected_path.exists() else None
    print(table(summarise(runs, expected)))
    print(
        f"{len(runs)} runs in {wall:.0f} s. 'paper' = FGD artifact means over the same seeds "
        f"(USENIX ATC'23); allocation = % of {nodes.total_gpus} GPUs allocated once the "
        f"arrived GPU request reaches 100 % / 130 % of capacity."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
