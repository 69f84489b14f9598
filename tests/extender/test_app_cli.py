"""`tandem-extender serve` as a process, and the app over TLS."""

from __future__ import annotations

import datetime
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from extender.app import make_app, ssl_context
from extender.config import ExtenderConfig, load_config
from extender.inventory import Inventory
from tests.extender.extender_support import FIXTURES, cluster_items, fixture_bytes

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str, scheme: str = "http") -> int:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}{path}", timeout=2) as r:
            return int(r.status)
    except OSError:
        return 0


def test_serve_file_mode_answers_filter(tmp_path: Path) -> None:
    port = _free_port()
    cfg = tmp_path / "extender.yaml"
    cfg.write_text("url_prefix: /tandem\nreservation_namespace: tandem-system\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "extender.main",
            "serve",
            "--inventory-file",
            str(FIXTURES / "cluster.json"),
            "--listen",
            f"127.0.0.1:{port}",
            "--config",
            str(cfg),
        ],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while _get(port, "/readyz") != 200:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
        import urllib.request

        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/tandem/filter", data=fixture_bytes("args-want-8-allnodes.json"), method="POST"
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            assert json.loads(r.read())["NodeNames"] == ["h100-r1-n2"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


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


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "tls.crt", tmp / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


async def test_tls(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    cfg = ExtenderConfig(tls_cert_file=cert, tls_key_file=key)
    inv = Inventory(cfg)
    inv.load_list({"kind": "List", "items": cluster_items()})
    runner = web.AppRunner(make_app(inv))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context(cfg))
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        client_ctx = ssl.create_default_context(cafile=str(cert))
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
