"""The agent's start checks on the tenant namespaces' Pod Security labels (FLEET-NOTES H-1, H-2): the rule as a
table, then refused_tenants against the local API server (sim.kubeapi) with the shipped agent RBAC, the
RoleBindings render-rbac prints, and the agent ServiceAccount's own token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from extender import kube
from extender.agent.config import AgentConfig
from extender.agent.preflight import (
    AUDIT_LABEL,
    ENFORCE_LABEL,
    TENANT_NAMESPACE_LABEL,
    WARN_LABEL,
    pod_security_problem,
    refused_tenants,
    render_rbac,
)
from sim.kubeapi import KubeAPIServer, write_kubeconfig

pytestmark = pytest.mark.timeout(60)

AGENT_RBAC = Path(__file__).resolve().parents[2] / "manifests" / "base" / "agent-rbac.yaml"
FENCED = {TENANT_NAMESPACE_LABEL: "true"}
EXCEPTION = {ENFORCE_LABEL: "privileged", WARN_LABEL: "baseline", AUDIT_LABEL: "baseline", **FENCED}


def labels(enforce: str | None = None) -> dict[str, str]:
    """A fenced tenant namespace's labels with that enforce level (None: no enforce label)."""
    return {**FENCED, ENFORCE_LABEL: enforce} if enforce is not None else dict(FENCED)


# (id, namespace labels, tenant level, extra capabilities, None = accepted / a text the refusal names)
RULES: list[tuple[str, dict[str, str], str, list[str], str | None]] = [
    ("baseline enforces baseline", labels("baseline"), "baseline", [], None),
    ("restricted enforces baseline", labels("restricted"), "baseline", [], None),
    ("restricted enforces restricted", labels("restricted"), "restricted", [], None),
    ("label missing", labels(), "baseline", [], f"label {ENFORCE_LABEL} is missing"),
    ("privileged", labels("privileged"), "baseline", [], f"label {ENFORCE_LABEL} is privileged"),
    (
        "baseline for a restricted tenant",
        labels("baseline"),
        "restricted",
        [],
        "weaker than the tenant's Pod Security level restricted",
    ),
    ("not a level", labels("strict"), "baseline", [], f"label {ENFORCE_LABEL}=strict is not a Pod Security level"),
    ("exception namespace", EXCEPTION, "baseline", ["IPC_LOCK"], None),
    (
        "exception warns stronger",
        {**EXCEPTION, WARN_LABEL: "restricted", AUDIT_LABEL: "restricted"},
        "baseline",
        ["IPC_LOCK"],
        None,
    ),
    (
        "exception but enforcing baseline",
        labels("baseline"),
        "baseline",
        ["IPC_LOCK"],
        f"need {ENFORCE_LABEL}=privileged",
    ),
    ("exception, enforce missing", labels(), "baseline", ["IPC_LOCK"], f"{ENFORCE_LABEL} is missing"),
    (
        "exception without warn",
        {k: v for k, v in EXCEPTION.items() if k != WARN_LABEL},
        "baseline",
        ["IPC_LOCK"],
        f"label {WARN_LABEL} is missing",
    ),
    (
        "exception auditing privileged",
        {**EXCEPTION, AUDIT_LABEL: "privileged"},
        "baseline",
        ["IPC_LOCK"],
        f"label {AUDIT_LABEL}=privileged",
    ),
    ("exception warns below the level", EXCEPTION, "restricted", ["IPC_LOCK"], f"label {WARN_LABEL}=baseline"),
    (
        "exception not fenced",
        {k: v for k, v in EXCEPTION.items() if k != TENANT_NAMESPACE_LABEL},
        "baseline",
        ["IPC_LOCK"],
        f"label {TENANT_NAMESPACE_LABEL} is missing",
    ),
]


@pytest.mark.parametrize(("ns_labels", "level", "extra", "why"), [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_pod_security_labels_rule(ns_labels: dict[str, str], level: str, extra: list[str], why: str | None) -> None:
    problem = pod_security_problem(ns_labels, level, extra)
    if why is None:
        assert problem is None
    else:
        assert problem is not None and why in problem, problem


# ----------------------------------------------------------------------------------- against the API server

CONFIG = AgentConfig(
    cluster_name="c",
    tenants={
        "plain": ["team-plain"],
        "unlabelled": ["team-unlabelled"],
        "strict": ["team-baseline"],
        "nccl": ["team-ib"],
        "nccl-misconfigured": ["team-baseline-2"],
        "shared": ["team-plain", "team-open"],
        "ghost": ["team-missing"],
    },
    tenant_pod_security={"strict": "restricted"},
    tenant_extra_capabilities={"nccl": ["IPC_LOCK"], "nccl-misconfigured": ["IPC_LOCK"]},
)
NAMESPACES = {
    "team-plain": labels("baseline"),
    "team-unlabelled": {},
    "team-baseline": labels("baseline"),
    "team-ib": EXCEPTION,
    "team-baseline-2": labels("baseline"),
    "team-open": labels("privileged"),
}


@pytest.fixture
async def agent_client(tmp_path: Path) -> AsyncIterator[kube.KubeClient]:
    bindings = tmp_path / "bindings.yaml"
    present = {t: ns for t, ns in CONFIG.tenants.items() if t != "ghost"}  # a binding would make its namespace
    bindings.write_text(render_rbac(CONFIG.model_copy(update={"tenants": present})))
    server = KubeAPIServer(rbac_paths=[AGENT_RBAC, bindings], seed=5)
    await server.start()
    made: list[kube.KubeClient] = []

    async def client(token: str, name: str) -> kube.KubeClient:
        path = tmp_path / f"kubeconfig-{name}"
        write_kubeconfig(path, server.url, token, namespace="tandem-system")
        c = kube.KubeClient(await kube.load_api_client(kubeconfig=str(path)), retries=0)
        made.append(c)
        return c

    try:
        admin = await client(server.admin_token, "admin")
        for name, ns_labels in NAMESPACES.items():  # some exist already: the RoleBindings' namespaces
            if await admin.get(kube.api_path("", "v1", "namespaces", name=name)) is None:
                await admin.create(
                    kube.api_path("", "v1", "namespaces"),
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                )
            await admin.patch(
                kube.api_path("", "v1", "namespaces", name=name),
                {"metadata": {"labels": ns_labels}},
                content_type="application/merge-patch+json",
            )
        yield await client(server.service_account_token("tandem-system", "tandem-agent"), "agent")
    finally:
        for c in made:
            await c.api.close()  # type: ignore[no-untyped-call]
        await server.stop()


async def test_tenants_whose_namespaces_enforce_less_than_their_level_are_refused(
    agent_client: kube.KubeClient,
) -> None:
    refused = await refused_tenants(agent_client, CONFIG)
    assert set(refused) == {"unlabelled", "strict", "nccl-misconfigured", "shared", "ghost"}, refused
    assert refused["unlabelled"].startswith(f"namespace team-unlabelled: label {ENFORCE_LABEL} is missing")
    assert "team-baseline: label" in refused["strict"] and "level restricted" in refused["strict"]
    assert f"need {ENFORCE_LABEL}=privileged" in refused["nccl-misconfigured"]
    assert refused["shared"].startswith(f"namespace team-open: label {ENFORCE_LABEL} is privileged")
    assert refused["ghost"] == "namespace team-missing: does not exist"


async def test_a_fully_labelled_fleet_refuses_no_one(agent_client: kube.KubeClient) -> None:
    ok = AgentConfig(
        cluster_name="c",
        tenants={"plain": ["team-plain"], "nccl": ["team-ib"]},
        tenant_extra_capabilities={"nccl": ["IPC_LOCK"]},
    )
    assert await refused_tenants(agent_client, ok) == {}


def test_the_agent_config_reads_levels_and_exceptions() -> None:
    cfg = AgentConfig.model_validate(
        {
            "cluster_name": "c",
            "tenants": {"a": ["ns"], "b": ["ns"]},
            "tenant_pod_security": {"b": "restricted"},
            "tenant_extra_capabilities": {"a": ["IPC_LOCK"]},
        }
    )
    assert (cfg.pod_security("a"), cfg.pod_security("b"), cfg.pod_security("unknown")) == (
        "baseline",
        "restricted",
        "baseline",
    )
    with pytest.raises(ValueError):
        AgentConfig.model_validate({"tenant_pod_security": {"a": "privileged"}})
