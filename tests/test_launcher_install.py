"""The launcher side (`tandem`, `broker.launcher.client`, job files) runs on the base install alone.

A training launcher installs `tandem` without the `server` extra. These tests run the launcher in a
child interpreter where every module of the server extra's distributions fails to import, as it would
on such an install, and check that the base dependencies are exactly what the launcher imports.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _dist_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _modules_of(dists: set[str]) -> dict[str, set[str]]:
    """Top-level module -> the distributions in `dists` that install it."""
    out: dict[str, set[str]] = {}
    for module, owners in md.packages_distributions().items():
        for owner in owners:
            if owner.lower().replace("_", "-") in dists:
                out.setdefault(module, set()).add(owner.lower().replace("_", "-"))
    return out


BASE = {_dist_name(r) for r in PYPROJECT["project"]["dependencies"]}
SERVER = {_dist_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["server"]}

_CHILD = r"""
import importlib.abc, json, sys

AT_START = set(sys.modules)  # the interpreter's own (site hooks such as setuptools' distutils shim)

BLOCKED = set(json.loads(sys.argv[1]))
HUB = ("broker.domain", "broker.tenancy", "broker.store", "broker.scheduling", "broker.clusters", "broker.api",
       "broker.web", "broker.hub", "broker.config", "broker.metrics", "fleetplan", "extender", "sim")

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in BLOCKED or any(name == h or name.startswith(h + ".") for h in HUB):
            raise ModuleNotFoundError(f"No module named {name!r} (not in the launcher's install)")
        return None

sys.meta_path.insert(0, NotInstalled())

from broker.launcher import cli, client, jobfile

job = jobfile.load_job_file(sys.argv[2])
spec = jobfile.to_spec(job)
assert spec.pod_sets, "the example job file has pod sets"
try:
    cli.main(["--help"])
except SystemExit as exc:
    assert exc.code == 0, exc.code
print(json.dumps(sorted({m.split(".")[0] for m in set(sys.modules) - AT_START})))
"""


def _blocked_modules() -> list[str]:
    """Modules only the server extra's distributions install (a namespace shared with a base one stays)."""
    base_modules = set(_modules_of(BASE))
    return sorted(m for m in _modules_of(SERVER) if m not in base_modules)


@pytest.fixture(scope="module")
def launcher_modules() -> set[str]:
    """Top-level modules the launcher loaded, run once in a child where the server extra is not importable."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            json.dumps(_blocked_modules()),
            str(REPO / "examples" / "job-torchrun-rack.yaml"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_launcher_runs_without_the_server_extra(launcher_modules: set[str]) -> None:
    blocked = _blocked_modules()
    assert {"asyncpg", "kubernetes", "numpy", "aiohttp"} <= set(blocked)  # the block list is really in force
    assert not launcher_modules & set(blocked)


def test_the_base_dependencies_are_what_the_launcher_imports(launcher_modules: set[str]) -> None:
    """Every base dependency is imported by the launcher, and nothing it imports comes from elsewhere
    (the standard library, the project itself and the base dependencies' own dependencies aside)."""
    loaded = launcher_modules
    by_module = md.packages_distributions()
    used = {d.lower().replace("_", "-") for m in loaded for d in by_module.get(m, [])}
    assert BASE <= used, f"base dependencies the launcher never imports: {sorted(BASE - used)}"
    requires: set[str] = set(BASE)
    for dist in BASE:
        requires |= {_dist_name(r) for r in (md.requires(dist) or []) if "extra ==" not in r}
    for dist in list(requires):
        requires |= {_dist_name(r) for r in (md.requires(dist) or []) if "extra ==" not in r}
    own = {"tandem"}
    # grpc's namespace is shared by grpcio's add-ons; importing grpc does not need them installed.
    strays = used - requires - own - SERVER - {"grpcio-tools"}
    assert not strays, f"the launcher imports distributions that are not base dependencies: {sorted(strays)}"
