"""A kubeconfig file pointing a client (kubectl, kubernetes.aio, client-go) at a server with a bearer token."""

from __future__ import annotations

from pathlib import Path

import yaml

__all__ = ["write_kubeconfig"]


def write_kubeconfig(path: Path, server_url: str, token: str, *, namespace: str = "default") -> None:
    """Write a one-cluster, one-user kubeconfig (file mode 0600: it holds a credential)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "tandem-fake", "cluster": {"server": server_url}}],
        "users": [{"name": "tandem-fake-user", "user": {"token": token}}],
        "contexts": [
            {
                "name": "tandem-fake",
                "context": {"cluster": "tandem-fake", "user": "tandem-fake-user", "namespace": namespace},
            }
        ],
        "current-context": "tandem-fake",
        "preferences": {},
    }
    path = Path(path)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
