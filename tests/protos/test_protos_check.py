"""scripts/protos.py --check passes on the committed code and catches every kind of staleness."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "protos.py"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tandem_protos_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


protos = _load_script()


@pytest.fixture
def proto_copy(tmp_path: Path) -> Path:
    """A copy of protos/ (sources and committed generated code) to damage."""
    root = tmp_path / "protos"
    shutil.copytree(REPO_ROOT / "protos", root, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return root


def _run_check(*extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", *extra], capture_output=True, text=True, timeout=120, check=False
    )


def test_committed_code_is_up_to_date() -> None:
    result = _run_check()
    assert result.returncode == 0, result.stderr
    assert "up to date" in result.stdout


def test_check_fails_with_a_clear_message_on_stale_code(proto_copy: Path) -> None:
    generated = proto_copy / "tandem" / "v1" / "job_pb2.py"
    generated.write_text(generated.read_text() + "\n# hand edit\n")
    result = _run_check("--proto-root", str(proto_copy))
    assert result.returncode == 1
    assert "out of date" in result.stderr
    assert "differs: job_pb2.py" in result.stderr
    assert "python scripts/protos.py" in result.stderr


def test_compare_reports_an_edited_proto(proto_copy: Path) -> None:
    source = proto_copy / "tandem" / "v1" / "common.proto"
    text = source.read_text()
    source.write_text(text.replace("  uint32 attempt = 2;\n}", "  uint32 attempt = 2;\n  string extra = 3;\n}", 1))
    problems = protos.check(proto_copy)
    assert any(p.startswith("differs: common_pb2.py") for p in problems)
    assert any(p.startswith("differs: common_pb2.pyi") for p in problems)


def test_compare_reports_missing_and_leftover_files(proto_copy: Path) -> None:
    package = proto_copy / "tandem" / "v1"
    (package / "inventory_pb2.pyi").unlink()
    (package / "removed_pb2.py").write_text("# generated from a deleted .proto\n")
    problems = protos.check(proto_copy)
    assert "missing: inventory_pb2.pyi" in problems
    assert "not produced by any .proto (stale): removed_pb2.py" in problems
    assert len(problems) == 2


def test_write_repairs_a_stale_copy(proto_copy: Path) -> None:
    package = proto_copy / "tandem" / "v1"
    (package / "job_pb2.py").write_text("broken\n")
    (package / "removed_pb2_grpc.py").write_text("# leftover\n")
    protos.write(proto_copy)
    assert protos.check(proto_copy) == []
    assert not (package / "removed_pb2_grpc.py").exists()


def test_generation_is_deterministic(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    protos.generate(first)
    protos.generate(second)
    package = protos.PACKAGE_REL
    assert protos.compare_trees(first / package, second / package) == []
    names = sorted(p.name for p in (first / package).iterdir())
    # gRPC modules only for files that declare services.
    assert "job_service_pb2_grpc.py" in names and "cluster_service_pb2_grpc.pyi" in names
    assert "job_pb2_grpc.py" not in names


def test_installed_package_maps_tandem_to_protos(tmp_path: Path) -> None:
    """`pip install -e .` exposes protos/tandem as `tandem`, importable from any directory."""
    code = "import tandem.v1.job_service_pb2_grpc as m, pathlib; print(pathlib.Path(m.__file__).resolve().parent)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == REPO_ROOT / "protos" / "tandem" / "v1"
