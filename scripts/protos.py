"""Regenerate (or check) the committed Python code for the tandem.v1 protos.

Usage, from anywhere:
    python scripts/protos.py           # rewrite protos/tandem/v1/*_pb2*.py[i]
    python scripts/protos.py --check   # exit 1 if the committed code is stale

Generation uses grpc_tools.protoc (its bundled google/protobuf/*.proto), the
google/rpc/*.proto files shipped by googleapis-common-protos, and the
mypy-protobuf plugins for the .pyi stubs. The output depends only on the
.proto files and the versions of those tools, so it is deterministic.
"""

from __future__ import annotations

import argparse
import difflib
import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO_ROOT / "protos"
PACKAGE_REL = Path("tandem") / "v1"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
_SERVICE_RE = re.compile(r"^\s*service\s+\w+", re.MULTILINE)


class ProtosError(RuntimeError):
    """Generation could not run (missing tool, protoc failure)."""


def proto_files(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """The package's .proto files, relative to the include root, sorted."""
    return sorted(p.relative_to(proto_root) for p in (proto_root / PACKAGE_REL).glob("*.proto"))


def _well_known_include() -> Path:
    import grpc_tools

    return Path(grpc_tools.__file__).resolve().parent / "_proto"


def _googleapis_include() -> Path:
    """Include root holding google/rpc/*.proto (from googleapis-common-protos)."""
    from google.rpc import status_pb2

    root = Path(status_pb2.__file__).resolve().parents[2]
    if not (root / "google" / "rpc" / "status.proto").is_file():
        raise ProtosError(f"google/rpc/status.proto not found under {root}")
    return root


def include_paths(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """protoc include roots: the package's, the well-known types', google/rpc's."""
    return [proto_root, _well_known_include(), _googleapis_include()]


def _plugin(name: str) -> Path:
    """Locate a protoc plugin installed next to the running interpreter, else on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return beside
    found = shutil.which(name)
    if found is None:
        raise ProtosError(f"{name} not found; install the dev extra (mypy-protobuf)")
    return Path(found)


def generate(out_root: Path, proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Generate code for every package .proto into out_root; return the files written."""
    from grpc_tools import protoc

    files = proto_files(proto_root)
    if not files:
        raise ProtosError(f"no .proto files under {proto_root / PACKAGE_REL}")
    out_root.mkdir(parents=True, exist_ok=True)
    out = str(out_root)
    args = [
        "grpc_tools.protoc",
        *(f"--proto_path={path}" for path in include_paths(proto_root)),
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out=quiet:{out}",
        f"--mypy_grpc_out=quiet:{out}",
        *(f.as_posix() for f in files),
    ]
    code = protoc.main(args)
    if code != 0:
        raise ProtosError(f"protoc failed with exit code {code}")
    # The gRPC plugins emit a module for every file; keep only those with services.
    for rel in files:
        if not _SERVICE_RE.search((proto_root / rel).read_text()):
            for suffix in ("_pb2_grpc.py", "_pb2_grpc.pyi"):
                (out_root / rel.parent / f"{rel.stem}{suffix}").unlink(missing_ok=True)
    return sorted(p for p in (out_root / PACKAGE_REL).iterdir() if is_generated(p))


def is_generated(path: Path) -> bool:
    """True for a file name protoc writes for this package."""
    return path.is_file() and path.name.endswith(GENERATED_SUFFIXES)


def compare_trees(expected_dir: Path, actual_dir: Path) -> list[str]:
    """Differences between freshly generated files and the committed ones, as messages."""
    expected = {p.name: p for p in expected_dir.iterdir() if is_generated(p)}
    actual = {p.name: p for p in actual_dir.iterdir() if is_generated(p)} if actual_dir.is_dir() else {}
    problems: list[str] = []
    for name in sorted(expected.keys() - actual.keys()):
        problems.append(f"missing: {name}")
    for name in sorted(actual.keys() - expected.keys()):
        problems.append(f"not produced by any .proto (stale): {name}")
    for name in sorted(expected.keys() & actual.keys()):
        if not filecmp.cmp(expected[name], actual[name], shallow=False):
            diff = difflib.unified_diff(
                actual[name].read_text().splitlines(),
                expected[name].read_text().splitlines(),
                fromfile=f"committed/{name}",
                tofile=f"regenerated/{name}",
                lineterm="",
                n=1,
            )
            excerpt = "\n".join(list(diff)[:12])
            problems.append(f"differs: {name}\n{excerpt}")
    return problems


def check(proto_root: Path = PROTO_ROOT) -> list[str]:
    """Regenerate into a temporary directory and compare with the committed code."""
    with tempfile.TemporaryDirectory(prefix="tandem-protos-") as tmp:
        generate(Path(tmp), proto_root)
        return compare_trees(Path(tmp) / PACKAGE_REL, proto_root / PACKAGE_REL)


def write(proto_root: Path = PROTO_ROOT) -> list[Path]:
    """Regenerate and replace the committed code; remove generated files of deleted protos."""
    target = proto_root / PACKAGE_REL
    with tempfile.TemporaryDirectory(prefix="tandem-protos-") as tmp:
        fresh = generate(Path(tmp), proto_root)
        fresh_names = {p.name for p in fresh}
        for old in target.iterdir():
            if is_generated(old) and old.name not in fresh_names:
                old.unlink()
        for path in fresh:
            shutil.copyfile(path, target / path.name)
    return [target / p.name for p in fresh]


def _tool_versions() -> str:
    from importlib import metadata

    names = ("grpcio-tools", "protobuf", "mypy-protobuf", "googleapis-common-protos")
    parts = []
    for name in names:
        try:
            parts.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name} (not installed)")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    parser.add_argument(
        "--proto-root",
        type=Path,
        default=PROTO_ROOT,
        help="include root holding tandem/v1 (default: the repo's protos/)",
    )
    opts = parser.parse_args(argv)
    root: Path = opts.proto_root.resolve()
    try:
        if opts.check:
            problems = check(root)
            if problems:
                print("protos: committed generated code is out of date:", file=sys.stderr)
                for problem in problems:
                    print(f"  {problem}", file=sys.stderr)
                print(
                    f"protos: regenerate with `python scripts/protos.py` (tools: {_tool_versions()})",
                    file=sys.stderr,
                )
                return 1
            print(f"protos: generated code is up to date ({len(proto_files(root))} .proto files)")
            return 0
        written = write(root)
        print(f"protos: wrote {len(written)} files under {root / PACKAGE_REL}")
        return 0
    except ProtosError as exc:
        print(f"protos: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
