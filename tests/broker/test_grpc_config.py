"""The broker's typed config: YAML file plus CLI flags, defaults, and refusals."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from broker.config import BrokerConfig, load_config
from broker.domain.retry import RetryPolicy, backoff_s
from broker.hub import Hub


def test_defaults_have_small_tenant_and_large_agent_messages() -> None:
    cfg = load_config([])
    assert cfg.tenant_listener.max_message_bytes < cfg.agent_listener.max_message_bytes
    assert cfg.agent_listener.address != cfg.tenant_listener.address
    assert cfg.lost_after_s >= cfg.cluster_stale_after_s


def test_yaml_then_flags(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(
        "db_path: /var/lib/tandem/a.db\n"
        "cluster_stale_after_s: 12\n"
        "agent_listener:\n  address: 0.0.0.0:7000\n  tls: {cert_file: s.pem, key_file: s.key, client_ca_file: ca.pem}\n"
        "retry: {max_attempts: 3}\n"
    )
    cfg = load_config(["--config", str(tmp_path / "b.yaml"), "--listen", "127.0.0.1:9000", "--db", "x.db"])
    assert cfg.db_path == "x.db"  # the flag wins
    assert cfg.tenant_listener.address == "127.0.0.1:9000"
    assert cfg.agent_listener.address == "0.0.0.0:7000"
    assert cfg.agent_listener.tls.require_client_cert  # a client CA means mutual TLS
    assert cfg.agent_listener.max_message_bytes == BrokerConfig().agent_listener.max_message_bytes
    assert cfg.cluster_stale_after_s == 12 and cfg.retry.max_attempts == 3


@pytest.mark.parametrize(
    "text", ["unknown_field: 1\n", "cluster_stale_after_s: -1\n", "cluster_stale_after_s: 100\nlost_after_s: 10\n"]
)
def test_bad_config_is_refused(tmp_path: Path, text: str) -> None:
    (tmp_path / "b.yaml").write_text(text)
    with pytest.raises(pydantic.ValidationError):
        load_config(["--config", str(tmp_path / "b.yaml")])


def test_retry_backoff_grows_and_caps(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text("retry: {backoff_base_s: 5, backoff_factor: 2, backoff_max_s: 30}\n")
    r = load_config(["--config", str(tmp_path / "b.yaml")]).retry
    assert [backoff_s(r, n) for n in (0, 1, 2, 3, 4)] == [0.0, 5.0, 10.0, 20.0, 30.0]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("retry: {backoff_factor: 0.5}\n", "backoff_factor"),
        ("retry: {max_infra_retries: -1}\n", "max_infra_retries"),
        ("retry: {backoff_initial_s: 5}\n", "backoff_initial_s"),
    ],
)
def test_bad_retry_config_is_refused_naming_the_field(tmp_path: Path, text: str, says: str) -> None:
    (tmp_path / "b.yaml").write_text(text)
    with pytest.raises(pydantic.ValidationError, match=says):
        load_config(["--config", str(tmp_path / "b.yaml")])


def test_the_configured_retry_policy_is_the_stores() -> None:
    cfg = load_config(["--db", ":memory:", "--agent-insecure"])
    assert cfg.retry == RetryPolicy()  # one definition: the config's defaults are the domain's
    store = Hub.store_for(cfg)
    assert store._opts.retry is cfg.retry  # handed over as is, no conversion


@pytest.mark.parametrize(
    ("tls", "says"),
    [
        (
            {"cert_file": "s.pem", "key_file": "s.key", "client_ca_file": "ca.pem", "require_client_cert": False},
            "client_ca_file needs require_client_cert: true",
        ),
        ({"cert_file": "s.pem", "key_file": "s.key", "require_client_cert": True}, "require_client_cert needs"),
        ({"client_ca_file": "ca.pem", "require_client_cert": True}, "require_client_cert needs"),
        ({"cert_file": "s.pem"}, "cert_file and key_file go together"),
    ],
)
def test_a_tenant_listener_that_could_not_authenticate_as_written_is_refused(
    tmp_path: Path, tls: dict[str, object], says: str
) -> None:
    """H-5: a client CA whose certificates gRPC would never ask for, or a demand with nothing to verify
    against, is refused at start naming the fix, not discovered as UNAUTHENTICATED by launchers."""
    import yaml

    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"tenant_listener": {"tls": tls}}))
    with pytest.raises(pydantic.ValidationError, match=says):
        load_config(["--config", str(tmp_path / "b.yaml")])


def test_the_mtls_port_from_flags_is_mutual(tmp_path: Path) -> None:
    cfg = load_config(
        [
            "--mtls-listen",
            "0.0.0.0:50443",
            "--mtls-cert",
            "s.pem",
            "--mtls-key",
            "s.key",
            "--mtls-ca",
            "launchers-ca.pem",
        ]
    )
    assert cfg.tenant_mtls_listener is not None and cfg.tenant_mtls_listener.address == "0.0.0.0:50443"
    assert cfg.tenant_mtls_listener.tls.mutual  # a client CA there means mutual TLS
    with pytest.raises(pydantic.ValidationError, match="tenant_mtls_listener.tls needs"):
        load_config(["--mtls-listen", "0.0.0.0:50443", "--mtls-cert", "s.pem", "--mtls-key", "s.key"])
    assert load_config([]).tenant_mtls_listener is None
