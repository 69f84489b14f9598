"""Scale mode in small: three synthetic clusters of twenty recorded nodes against the real broker process.

Each cluster has two blocks of two five-node racks. Ten jobs: six 8 x 8-GPU gangs that need one block, two
4 x 8-GPU gangs that need one rack, two single 8-GPU pods. Six block gangs take eight nodes of every block,
so no rack keeps four nodes free for a rack gang while they all run: some job can only be placed after
another has finished, which checks that the agents' reports free capacity again.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from broker.api.serde_inventory import node_from_proto
from fleetsim.scale import (
    REPLICA_CPU_MILLI,
    FleetLayout,
    Histogram,
    JobKind,
    Phase,
    job_specs,
    percentile,
    record_inventory,
    run_scale,
)
from tandem.v1 import inventory_pb2 as inv

pytestmark = pytest.mark.timeout(180)

LAYOUT = FleetLayout(clusters=3, nodes=20, nodes_per_rack=5, racks_per_block=2)
MIX = (
    JobKind("1 x 8 GPUs", 1, "", 0.2),
    JobKind("4 x 8 GPUs, one rack", 4, "rack", 0.2),
    JobKind("8 x 8 GPUs, one block", 8, "block", 0.6),
)
RUN_SECONDS = (1.0, 1.5)


def test_recorded_nodes_are_the_encoders_label_trimmed_reports_renamed_per_cluster() -> None:
    layout = FleetLayout(clusters=12, nodes=20, nodes_per_rack=5, racks_per_block=2)
    recorded = record_inventory(layout)
    free = node_from_proto(inv.NodeInventory.FromString(recorded.node("sc011", 7, 0)))
    busy = node_from_proto(inv.NodeInventory.FromString(recorded.node("sc011", 7, 8)))
    assert free.name == busy.name == "sc011-n0007"
    assert free.labels["kubernetes.io/hostname"] == "sc011-n0007"
    assert free.topology == ("zone-a", "b00", "r001", None, "sc011-n0007")
    assert (free.free_whole_gpus, busy.free_whole_gpus) == (8, 0)
    assert busy.cpu_milli_free == free.cpu_milli_free - REPLICA_CPU_MILLI
    # The default allow-list drops the driver and GFD bookkeeping labels the fixture node carries.
    assert "nvidia.com/cuda.driver-version.full" not in free.labels
    assert free.labels["network.example.com/rack"] == "r001"
    assert recorded.reported_labels == len(free.labels) < recorded.raw_labels
    assert recorded.snapshot_bytes < recorded.untrimmed_snapshot_bytes
    snap = recorded.snapshot("sc003", 1, 0.0)
    assert [n.name for n in snap.nodes] == [layout.node_name("sc003", i) for i in range(layout.nodes)]
    with pytest.raises(ValueError):
        recorded.node("sc003", 0, 4)  # only free and whole-node variants were recorded


def test_histogram_quantile_interpolates_inside_the_bucket_as_promql_does() -> None:
    h = Histogram(((0.001, 10.0), (0.01, 30.0), (math.inf, 40.0)), 40.0, 0.5)
    assert h.quantile(0.25) == pytest.approx(0.001)
    assert h.quantile(0.5) == pytest.approx(0.001 + 0.009 * 0.5)
    assert h.quantile(0.99) == pytest.approx(0.01)  # in +Inf: the highest finite bound
    since = h.minus(Histogram(((0.001, 10.0), (0.01, 10.0), (math.inf, 10.0)), 10.0, 0.1))
    assert since.count == 30.0
    assert since.quantile(0.5) == pytest.approx(0.001 + 0.009 * 15 / 20)
    assert math.isnan(Histogram((), 0.0, 0.0).quantile(0.5))


def test_job_mix_keeps_its_proportions() -> None:
    kinds = [k.label for k, _ in job_specs(10, MIX, "scale")]
    assert kinds.count("8 x 8 GPUs, one block") == 6
    assert kinds.count("4 x 8 GPUs, one rack") == 2 and kinds.count("1 x 8 GPUs") == 2


async def test_small_fleet_places_every_job_within_what_each_cluster_holds(tmp_path: Path) -> None:
    result = await run_scale(
        tmp_path,
        LAYOUT,
        [Phase(jobs=10, rate_per_s=20.0)],
        mix=MIX,
        run_seconds=RUN_SECONDS,
        settle_s=0.5,
        place_timeout_s=60.0,
        drain_timeout_s=60.0,
    )
    phase, tally = result.phases[0], result.tally
    assert phase.refused == []
    assert phase.placed == 10 and len(tally.placements) == 10
    assert tally.redispatches == 0 and tally.stream_errors == []
    assert phase.final_states == {"SUCCEEDED": 10}

    # No node got more GPUs than it has, no cluster more than it holds.
    assert tally.overcommits == []
    assert set(tally.peak_gpus) <= set(LAYOUT.cluster_names())
    assert all(0 < peak <= LAYOUT.gpus_per_cluster for peak in tally.peak_gpus.values())
    # Gangs land in one domain of their level, with one node per 8-GPU replica.
    by_label = {k.label: k for k in MIX}
    for job_id, label in phase.kinds.items():
        kind, placed = by_label[label], tally.placements[job_id]
        assert len(placed.nodes) == kind.replicas
        if kind.level == "rack":
            assert len(placed.racks) == 1, placed
        if kind.level == "block":
            assert len(placed.blocks) == 1, placed
    # Some job could only go where another had finished.
    assert max(p.received for p in tally.placements.values()) > min(tally.finished_at)

    # The measurements are there and sane.
    assert result.connect_s > 0
    assert result.broker_rss_idle > 0 and result.broker_rss_connected > 0 and result.broker_rss_end > 0
    assert result.broker_rss_peak >= result.broker_rss_end
    assert phase.place_cpu_s > 0 and phase.total_cpu_s >= phase.place_cpu_s
    assert 0 < phase.cpu_ms_per_placed_job < 10_000
    assert phase.placed_per_s > 0 and phase.place_window_s >= phase.submit_s * 0.5
    assert phase.decisions.count >= 10  # every job was decided at least once
    assert 0 < phase.decisions.quantile(0.5) <= phase.decisions.quantile(0.99) < 1.0
    assert phase.time_to_placement.count == 10
    latency = phase.placement_latency_s.values()
    assert len(latency) == 10 and all(lat > 0 for lat in latency)
    assert percentile(latency, 99) >= percentile(latency, 50) > 0
