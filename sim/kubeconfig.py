"""Credentials from a kubeconfig file (server, CA, token / token file / client certificate), for the raw client."""

from __future__ import annotations

import base64
import dataclasses
import os
import ssl
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Credentials", "load_kubeconfig"]


@dataclasses.dataclass(frozen=True)
class Credentials:
    """How to reach one API server: its URL, whom to trust, who we are."""

    server: str
    token: str | None = None
    ca_pem: bytes | None = None
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None
    insecure_skip_tls_verify: bool = False

    def ssl_context(self) -> ssl.SSLContext | bool:
        """False (no TLS) for http://; otherwise a context trusting the CA (or the system store)."""
        if not self.server.startswith("https://"):
            return False
        ctx = ssl.create_default_context(cadata=self.ca_pem.decode() if self.ca_pem else None)
        if self.insecure_skip_tls_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.client_cert_pem and self.client_key_pem:
            _load_cert_chain(ctx, self.client_cert_pem, self.client_key_pem)
        return ctx


def _load_cert_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl only loads certificates from files: write them to private temporary files for the call."""
    with tempfile.TemporaryDirectory() as tmp:
        cert_path, key_path = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        for path, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(str(cert_path), str(key_path))


def _named(entries: Any, name: str, what: str) -> Mapping[str, Any]:
    for entry in entries or []:
        if entry.get("name") == name:
            return entry.get(what) or {}
    raise ValueError(f"kubeconfig: no {what} named {name!r}")


def _data_or_file(section: Mapping[str, Any], key: str, base: Path) -> bytes | None:
    data = section.get(f"{key}-data")
    if data:
        return base64.b64decode(data)
    path = section.get(key)
    if path:
        p = Path(path)
        return (p if p.is_absolute() else base / p).read_bytes()
    return None


def load_kubeconfig(path: str | Path, context: str | None = None) -> Credentials:
    """Credentials of ``context`` (default: current-context). Exec and auth-provider plugins are not run."""
    path = Path(path)
    doc = yaml.safe_load(path.read_text()) or {}
    ctx_name = context or doc.get("current-context")
    if not ctx_name:
        raise ValueError(f"{path}: no current-context")
    ctx = _named(doc.get("contexts"), ctx_name, "context")
    cluster = _named(doc.get("clusters"), str(ctx.get("cluster")), "cluster")
    user = _named(doc.get("users"), str(ctx.get("user")), "user") if ctx.get("user") else {}
    base = path.parent
    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = Path(user["tokenFile"]).read_text().strip()
    return Credentials(
        server=str(cluster["server"]).rstrip("/"),
        token=str(token) if token else None,
        ca_pem=_data_or_file(cluster, "certificate-authority", base),
        client_cert_pem=_data_or_file(user, "client-certificate", base),
        client_key_pem=_data_or_file(user, "client-key", base),
        insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
    )
