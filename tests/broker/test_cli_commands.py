"""The `tandem` command line against a real broker on loopback (run in a thread: it owns its event loop)."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
import yaml

from broker.launcher import cli
from broker.launcher.jobfile import JobFile, load_job_file, parse_duration, to_spec
from tandem.v1 import job_pb2
from tests.broker.hub_builders import TOKENS, Broker, broker, eventually, node, start_broker  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "job-torchrun-rack.yaml"


async def tandem(b: Broker, *argv: str, who: str = "alpha") -> tuple[int, str]:
    out = io.StringIO()
    code = await asyncio.to_thread(cli.main, ["--broker", b.tenant_addr, "--token", TOKENS[who], *argv], out)
    return code, out.getvalue()


def _job_file(tmp: Path, **changes: object) -> Path:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc.pop("regions", None)
    doc["podSets"][0]["gpuModels"] = []
    doc["podSets"][0].update(replicas=2, cpu="32", memory="64Gi")
    doc.update(changes)
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_example_job_file_maps_to_a_spec() -> None:
    jf = load_job_file(EXAMPLE)
    s = to_spec(jf)
    assert s.topology.required_level == "rack"
    assert s.framework == job_pb2.FRAMEWORK_TORCHRUN
    assert s.max_runtime.seconds == 24 * 3600 and s.start_timeout.seconds == 15 * 60
    ps = s.pod_sets[0]
    assert (ps.count, ps.shape.gpu_count, ps.shape.cpu_milli, ps.shape.memory_bytes) == (4, 8, 96000, 1 << 40)
    assert list(ps.shape.allowed_gpu_models) == ["NVIDIA-H100-80GB-HBM3"]


@pytest.mark.parametrize(("text", "seconds"), [("24h", 86400), ("1d2h", 93600), ("90s", 90), ("45m", 2700), (7, 7)])
def test_durations(text: str | int, seconds: int) -> None:
    assert parse_duration(text) == seconds


def test_unknown_job_file_field_is_refused() -> None:
    with pytest.raises(ValueError):
        JobFile.model_validate({"jobSet": "s", "podSets": [], "gpuz": 1})


async def test_submit_dry_run_get_list_cancel(broker: Broker, tmp_path: Path) -> None:
    path = _job_file(tmp_path)
    code, text = await tandem(broker, "submit", "-f", str(path), "--dry-run")
    assert (code, text) == (0, "valid (dry run: nothing stored)\n")
    code, text = await tandem(broker, "submit", "-f", str(path))
    assert code == 0
    job_id = text.strip()
    code, again = await tandem(broker, "submit", "-f", str(path))
    assert again.startswith(job_id) and "already submitted" in again
    await eventually(lambda: job_id in broker.hub.placer.book.waits)
    code, text = await tandem(broker, "get", job_id)
    assert code == 0
    assert "state:    QUEUED" in text and "position: 0" in text and "NO_FRESH_INVENTORY" in text
    code, text = await tandem(broker, "list")
    assert job_id in text and "QUEUED" in text
    code, text = await tandem(broker, "cancel", job_id)
    assert text.strip() == f"{job_id}: CANCELLED"


async def test_get_shows_attempts(broker: Broker, tmp_path: Path) -> None:
    agent = broker.agent("c1")
    await agent.connect([node("n1"), node("n2"), node("n3")])
    code, text = await tandem(broker, "submit", "-f", str(_job_file(tmp_path)))
    job_id = text.strip()
    d = await agent.expect("dispatch")
    agent.reject(d, [d.pod_sets[0].nodes[0].node], message="device plugin restarting")
    await agent.expect("dispatch")
    code, text = await tandem(broker, "get", job_id)
    assert "attempts:" in text
    lines = [line for line in text.splitlines() if line.startswith(("1 ", "2 "))]
    assert lines[0].split()[:2] == ["1", "c1"] and "REJECTED" in lines[0] and "device plugin restarting" in lines[0]
    assert lines[1].split()[:2] == ["2", "c1"] and "active" in lines[1]
    code, text = await tandem(broker, "list", "--cluster", "c1", "--gpu-model", "NVIDIA-H100-80GB-HBM3")
    assert code == 0 and job_id in text
    code, text = await tandem(broker, "list", "--cluster", "c2")
    assert code == 0 and job_id not in text
    await agent.close()


async def test_refusal_is_explained(broker: Broker, tmp_path: Path) -> None:
    path = _job_file(tmp_path, priority=5000)
    code, text = await tandem(broker, "submit", "-f", str(path))
    assert code == 1 and text.startswith("refused: INVALID_ARGUMENT") and "priority" in text
    code, text = await tandem(broker, "get", "No_Such")
    assert code == 1 and "INVALID_ARGUMENT" in text and "job_id" in text


async def test_clusters_table_and_cordon(broker: Broker) -> None:
    agent = broker.agent("c1")
    await agent.connect([node("n1"), node("n2", free=2, rack="r2")])
    await eventually(lambda: broker.hub.catalog.clusters["c1"].has_snapshot)
    code, text = await tandem(broker, "clusters")
    assert code == 0
    row = next(line for line in text.splitlines() if line.startswith("c1 "))
    assert "ready" in row and "NVIDIA-H100-80GB-HBM3: 10/16" in row
    assert "rack" in text and "z1/r2" in text
    code, text = await tandem(broker, "cordon", "c1", "--reason", "maintenance")
    assert code == 1 and "PERMISSION_DENIED" in text
    code, text = await tandem(broker, "cordon", "c1", "--reason", "maintenance", who="admin")
    assert code == 0 and "cordoned" in text
    code, text = await tandem(broker, "uncordon", "c1", "--reason", "done", who="admin")
    assert code == 0 and "ready" in text
    await agent.close()


async def test_watch_prints_transitions(broker: Broker, tmp_path: Path) -> None:
    code, text = await tandem(broker, "submit", "-f", str(_job_file(tmp_path)))
    job_id = text.strip()
    await tandem(broker, "cancel", job_id)
    code, text = await tandem(broker, "watch", "--from-revision", "1", "--max-events", "1")
    assert code == 0
    [line] = text.splitlines()
    assert job_id in line and "QUEUED -> CANCELLED" in line


def test_connection_options_go_before_or_after_the_subcommand(monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.launcher.cli import build_parser

    monkeypatch.delenv("TANDEM_BROKER", raising=False)
    parser = build_parser()
    after = parser.parse_args(["clusters", "--broker", "hub:7000", "--token", "t"])
    before = parser.parse_args(["--broker", "hub:7000", "--token", "t", "clusters"])
    assert (after.broker, after.token) == (before.broker, before.token) == ("hub:7000", "t")
    neither = parser.parse_args(["get", "job-1"])
    assert neither.broker == "127.0.0.1:50051" and neither.job_id == "job-1"
    # the subcommand's copy overrides only what it is given
    mixed = parser.parse_args(["--broker", "hub:7000", "cordon", "c1", "--reason", "x", "--token", "t2"])
    assert (mixed.broker, mixed.token, mixed.cluster) == ("hub:7000", "t2", "c1")
