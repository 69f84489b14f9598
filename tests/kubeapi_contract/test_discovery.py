"""Discovery, health and version endpoints, out-of-scope encodings, and the standalone entry point."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from tests.kubeapi_contract.builders import configmap
from tests.kubeapi_contract.kubehttp import KubeHTTP, expect
from tests.kubeapi_contract.targets import MANIFESTS, REPO, Target


async def test_discovery_documents(target: Target) -> None:
    version = expect(await target.admin.get("/version"), 200)
    assert version["major"] == "1" and version["gitVersion"].startswith("v1.")
    assert expect(await target.admin.get("/api"), 200)["versions"] == ["v1"]
    groups = {g["name"]: g for g in expect(await target.admin.get("/apis"), 200)["groups"]}
    for group in ("batch", "coordination.k8s.io", "resource.k8s.io", "scheduling.k8s.io", "rbac.authorization.k8s.io"):
        assert any(v["version"] == "v1" for v in groups[group]["versions"])
    core = {r["name"]: r for r in expect(await target.admin.get("/api/v1"), 200)["resources"]}
    assert core["pods"]["namespaced"] and core["pods"]["kind"] == "Pod" and "watch" in core["pods"]["verbs"]
    assert core["pods/binding"]["kind"] == "Binding" and core["pods/binding"]["verbs"] == ["create"]
    assert not core["nodes"]["namespaced"] and "pods/status" in core
    batch = expect(await target.admin.get("/apis/batch/v1"), 200)
    assert batch["groupVersion"] == "batch/v1" and "jobs/status" in [r["name"] for r in batch["resources"]]
    assert expect(await target.admin.get("/apis/example.com/v1"), 404)["reason"] == "NotFound"


async def test_health_endpoints_answer_without_credentials(target: Target) -> None:
    anonymous = target.client(None)
    for path in ("/healthz", "/readyz", "/livez"):
        reply = await anonymous.get(path)
        assert reply.status == 200 and reply.body == "ok"


async def test_only_json_is_served(target: Target) -> None:
    target.fake("a real server also speaks protobuf")
    ns = await target.namespace()
    reply = await target.admin.request(
        "GET", f"/api/v1/namespaces/{ns}/configmaps", headers={"Accept": "application/vnd.kubernetes.protobuf"}
    )
    assert expect(reply, 406)["reason"] == "NotAcceptable"
    mixed = await target.admin.request(
        "GET",
        f"/api/v1/namespaces/{ns}/configmaps",
        headers={"Accept": "application/vnd.kubernetes.protobuf, application/json"},
    )
    assert expect(mixed, 200)["kind"] == "ConfigMapList"
    reply = await target.admin.request(
        "POST", f"/api/v1/namespaces/{ns}/configmaps", b"\x0a\x00", content_type="application/vnd.kubernetes.protobuf"
    )
    assert expect(reply, 415)["reason"] == "UnsupportedMediaType"
    yaml_body = f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-yaml\n  namespace: {ns}\ndata:\n  k: v\n"
    created = await target.admin.request(
        "POST", f"/api/v1/namespaces/{ns}/configmaps", yaml_body, content_type="application/yaml"
    )
    assert expect(created, 201)["data"] == {"k": "v"}


async def test_standalone_server_prints_its_url_and_admin_token(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("fixed-admin-token\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "sim.kubeapi",
        "--port",
        "0",
        "--rbac",
        str(MANIFESTS),
        "--admin-token-file",
        str(token_file),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        info = json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
        assert info["admin_token"] == "fixed-admin-token" and info["url"].startswith("http://127.0.0.1:")
        client = KubeHTTP(info["url"], info["admin_token"])
        try:
            expect(await client.post("/api/v1/namespaces/default/configmaps", configmap("c", "default")), 201)
            scheduler_role = await client.get("/apis/rbac.authorization.k8s.io/v1/clusterroles/tandem-extender-read")
            assert expect(scheduler_role, 200)["rules"][0]["verbs"] == ["get", "list", "watch"]
        finally:
            await client.close()
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 30) == 0
