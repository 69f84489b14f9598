"""The one configuration object per process: file, flags and environment resolved once, at load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from extender.agent.config import load_agent_process_config
from extender.config import KubeAccess, WebhookSettings, kube_access, load_serve_config


def test_serve_config_flag_then_file_then_environment(tmp_path: Path) -> None:
    path = tmp_path / "extender.yaml"
    path.write_text("listen: 0.0.0.0:9000\nlog_level: DEBUG\nwebhook_listen: 0.0.0.0:8443\n")
    env = {
        "TANDEM_WEBHOOK_LISTEN": "127.0.0.1:1",
        "TANDEM_WEBHOOK_TLS_CERT_FILE": "/certs/tls.crt",
        "TANDEM_WEBHOOK_TLS_KEY_FILE": "/certs/tls.key",
        "TANDEM_WEBHOOK_MAX_BODY_BYTES": "1024",
        "TANDEM_WEBHOOK_CERT_CHECK_INTERVAL_S": "5",
        "TANDEM_WEBHOOK_PATH": "",
    }
    cfg = load_serve_config(path, env=env, listen="127.0.0.1:7000", kube=True, inventory_files=[tmp_path / "a.json"])
    assert cfg.extender.listen == "127.0.0.1:7000" and cfg.extender.log_level == "DEBUG"
    assert cfg.watch_cluster and cfg.inventory_files == (tmp_path / "a.json",)
    assert cfg.extender.webhook == WebhookSettings(
        path="/mutate",
        listen="0.0.0.0:8443",
        tls_cert_file=Path("/certs/tls.crt"),
        tls_key_file=Path("/certs/tls.key"),
        cert_check_interval_s=5.0,
        max_body_bytes=1024,
    )
    assert load_serve_config(None, env={}).extender.webhook == WebhookSettings()


def test_serve_config_refuses_a_bad_environment_value_at_load() -> None:
    with pytest.raises(ValueError, match="webhook_max_body_bytes"):
        load_serve_config(None, env={"TANDEM_WEBHOOK_MAX_BODY_BYTES": "lots"})


def test_kube_access_from_flag_pod_or_kubeconfig(tmp_path: Path) -> None:
    assert kube_access({"KUBERNETES_SERVICE_HOST": "kubernetes.default.svc"}) == KubeAccess(in_cluster=True)
    assert kube_access({"KUBERNETES_SERVICE_HOST": "kubernetes.default.svc"}, "k.yaml") == KubeAccess(
        kubeconfig="k.yaml"
    )
    (tmp_path / ".kube").mkdir()
    home = {"HOME": str(tmp_path)}
    default = kube_access(home)
    assert default == KubeAccess(kubeconfig=str(tmp_path / ".kube" / "config")) and not default.found()
    (tmp_path / ".kube" / "config").write_text("{}")
    assert default.found()
    listed = kube_access({**home, "KUBECONFIG": os.pathsep.join(["~/missing", str(tmp_path / "b")])})
    assert listed.kubeconfig == os.pathsep.join([str(tmp_path / "missing"), str(tmp_path / "b")])
    assert not listed.found()  # $KUBECONFIG replaces ~/.kube/config, as kubectl does
    (tmp_path / "b").write_text("{}")
    assert listed.found()


def test_agent_config_flags_identity_and_log_level(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("cluster_name: a\nbroker: hub:50052\nextender:\n  log_level: WARNING\n")
    cfg = load_agent_process_config(
        path, env={"POD_NAME": "tandem-agent-7f9c"}, kube=True, kubeconfig="k.yaml", broker="other:1", listen=None
    )
    assert cfg.agent.broker == "other:1" and cfg.agent.cluster_name == "a" and cfg.agent.listen == "0.0.0.0:9091"
    assert (
        cfg.agent.identity.startswith("tandem-agent-7f9c_") and len(cfg.agent.identity) == len("tandem-agent-7f9c_") + 6
    )
    assert cfg.kube == KubeAccess(kubeconfig="k.yaml") and cfg.watch_cluster and cfg.inventory_files == ()
    assert cfg.log_level == "WARNING"
    assert load_agent_process_config(path, env={}, log_level="DEBUG").log_level == "DEBUG"
    path.write_text("identity: fixed\n")
    assert load_agent_process_config(path, env={"POD_NAME": "p"}).agent.identity == "fixed"
