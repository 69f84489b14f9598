"""`tandem-extender serve` as a process, and the app over TLS."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import aiohttp
from aiohttp import web

from extender.app import make_app, ssl_context
from extender.config import ExtenderConfig, load_config
from extender.inventory import Inventory
from fleetsim.pki import Pki
from fleetsim.processes import free_port, http_ok, spawn, wait_for
from tests.extender.extender_support import FIXTURES, cluster_items, fixture_bytes

REPO = Path(__file__).resolve().parents[2]


async def test_serve_file_mode_answers_filter(tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "extender.yaml"
    cfg.write_text("url_prefix: /tandem\nreservation_namespace: tandem-system\n")
    inventory = str(FIXTURES / "cluster.json")
    serve = ["serve", "--inventory-file", inventory, "--listen", f"127.0.0.1:{port}", "--config", str(cfg)]
    proc = spawn("extender", serve, tmp_path / "extender.log")
    try:
        await wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), 60, "the extender ready", [proc])
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/tandem/filter", data=fixture_bytes("args-want-8-allnodes.json"), method="POST"
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            assert json.loads(r.read())["NodeNames"] == ["h100-r1-n2"]
    finally:
        await proc.stop()


def test_config_file_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("listen: 0.0.0.0:9000\ntopology:\n  rack: example.org/rack\n")
    cfg = load_config(path, listen="127.0.0.1:7000")
    assert cfg.listen == "127.0.0.1:7000" and cfg.port == 7000
    assert cfg.topology.keys[2] == "example.org/rack"
    path.write_text("no_such_field: 1\n")
    try:
        load_config(path)
    except ValueError as e:
        assert "no_such_field" in str(e)
    else:
        raise AssertionError("unknown config field accepted")


async def test_tls(tmp_path: Path) -> None:
    pki = Pki.create(tmp_path)
    cert, key = pki.issue("extender", server=True)
    cfg = ExtenderConfig(tls_cert_file=cert, tls_key_file=key)
    inv = Inventory(cfg)
    inv.load_list({"kind": "List", "items": cluster_items()})
    runner = web.AppRunner(make_app(inv))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context(cfg))
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        client_ctx = ssl.create_default_context(cafile=str(pki.ca_file))
        async with aiohttp.ClientSession() as s:
            async with s.post(
                f"https://127.0.0.1:{port}/filter", data=fixture_bytes("args-want-8-names.json"), ssl=client_ctx
            ) as r:
                assert r.status == 200
                assert (await r.json())["NodeNames"] == ["h100-r1-n2"]
    finally:
        await runner.cleanup()


def test_serve_with_no_inventory_source_and_no_cluster_fails_fast(tmp_path: Path) -> None:
    """Without --kube, --inventory-file or a cluster in the environment it would never become ready."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "KUBECONFIG")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    proc = subprocess.run(
        [sys.executable, "-m", "extender.main", "serve", "--listen", "127.0.0.1:0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert "no inventory source" in proc.stderr and "--kube" in proc.stderr
