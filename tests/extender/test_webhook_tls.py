"""The webhook's API-server-facing TLS listener: HTTPS /mutate, probes, and certificate rotation without restart."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509

from extender import webhook
from extender.config import ExtenderConfig, load_config
from fleetsim.pki import Pki
from tests.extender.test_webhook import PENDING, admission_review, as_created

SERVICE_DNS = "tandem-webhook.tandem-system.svc"


def issue(pki: Pki, serial: int) -> None:
    """The webhook's serving pair as its certificate manager leaves it: tls.crt and tls.key in the CA's directory."""
    cert, key = pki.issue(SERVICE_DNS, server=True, serial=serial)
    cert.replace(pki.dir / "tls.crt")
    key.replace(pki.dir / "tls.key")


class Listener:
    def __init__(self, app: web.Application, base: str, client_ctx: ssl.SSLContext, state: dict[str, Any]) -> None:
        self.app, self.base, self.client_ctx, self.state = app, base, client_ctx, state

    async def get(self, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as s:
            async with s.get(self.base + path, ssl=self.client_ctx, server_hostname="localhost") as r:
                return r.status, await r.text()

    async def served_serial(self) -> int:
        """Serial number of the certificate a new TLS handshake gets (verified against the CA)."""
        host, port = self.base.removeprefix("https://").rsplit(":", 1)
        _, writer = await asyncio.open_connection(host, int(port), ssl=self.client_ctx, server_hostname="localhost")
        try:
            der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
            return int(x509.load_der_x509_certificate(der).serial_number)
        finally:
            writer.close()

    async def post(self, path: str, body: Any) -> dict[str, Any]:
        async with aiohttp.ClientSession() as s:
            async with s.post(self.base + path, json=body, ssl=self.client_ctx, server_hostname="localhost") as r:
                assert r.status == 200
                result: dict[str, Any] = await r.json()
                return result


@pytest.fixture
async def listener(tmp_path: Path) -> AsyncIterator[Listener]:
    pki = Pki.create(tmp_path)
    issue(pki, serial=1001)
    state: dict[str, Any] = {"ready": False, "pki": pki}
    settings = webhook.WebhookSettings(
        listen="127.0.0.1:0",
        tls_cert_file=tmp_path / "tls.crt",
        tls_key_file=tmp_path / "tls.key",
        cert_check_interval_s=3600,
    )
    app = web.Application()
    webhook.add_routes(app, ExtenderConfig(), settings, ready=lambda: bool(state["ready"]))
    runner = web.AppRunner(app)
    await runner.setup()  # runs cleanup_ctx startup: the TLS listener is up now
    side: web.AppRunner = app[webhook.LISTENER_KEY]
    host, port = side.addresses[0][:2]
    client_ctx = ssl.create_default_context(cafile=str(pki.ca_file))
    yield Listener(app, f"https://{host}:{port}", client_ctx, state)
    await runner.cleanup()


async def test_mutate_over_tls_with_a_verified_certificate(listener: Listener) -> None:
    answer = await listener.post("/mutate", admission_review(as_created(PENDING["want-8"]), "team-a"))
    assert answer["response"]["allowed"] is True
    assert answer["response"]["patchType"] == "JSONPatch"


async def test_probes_follow_readiness(listener: Listener) -> None:
    assert await listener.get("/healthz") == (200, "ok")
    assert (await listener.get("/readyz"))[0] == 503
    listener.state["ready"] = True
    assert await listener.get("/readyz") == (200, "ready")


async def test_rotated_certificate_is_served_after_reload(listener: Listener, tmp_path: Path) -> None:
    assert await listener.served_serial() == 1001
    reloader = listener.app[webhook.CERTS_KEY]
    assert reloader.reload() is False  # unchanged files: nothing reloaded
    issue(listener.state["pki"], serial=2002)
    _bump_mtime(tmp_path)
    assert reloader.reload() is True
    assert await listener.served_serial() == 2002
    assert await listener.get("/healthz") == (200, "ok")


async def test_broken_new_pair_keeps_serving_the_old_certificate(listener: Listener, tmp_path: Path) -> None:
    reloader = listener.app[webhook.CERTS_KEY]
    (tmp_path / "tls.crt").write_text("-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n")
    _bump_mtime(tmp_path)
    with pytest.raises(ssl.SSLError):
        reloader.reload()
    assert await listener.served_serial() == 1001


def test_settings_from_environment() -> None:
    env = {
        "TANDEM_WEBHOOK_LISTEN": "0.0.0.0:8443",
        "TANDEM_WEBHOOK_TLS_CERT_FILE": "/certs/tls.crt",
        "TANDEM_WEBHOOK_TLS_KEY_FILE": "/certs/tls.key",
    }
    s = load_config(None, env=env).webhook
    assert (s.listen, s.tls_cert_file, s.tls_key_file, s.path) == (
        "0.0.0.0:8443",
        Path("/certs/tls.crt"),
        Path("/certs/tls.key"),
        "/mutate",
    )
    assert load_config(None, env={}).webhook.listen is None


def _bump_mtime(directory: Path) -> None:
    import os

    for name in ("tls.crt", "tls.key"):
        st = (directory / name).stat()
        os.utime(directory / name, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
