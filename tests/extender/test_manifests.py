"""The shipped manifests: parse, validate against the Kubernetes 1.35 schema, and agree with the code and each other."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from extender import kube, webhook
from extender.config import ExtenderConfig
from tests.extender.test_webhook import PENDING, admission_review, as_created
from tests.needs import missing

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
K8S_VERSION = "1.35.0"  # the fixtures' version; kubernetes-validate ships schemas up to 1.37
CRD_KINDS = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}  # no schema: CRDs
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*", "escalate", "bind", "impersonate"}


def load_docs(under: Path = MANIFESTS) -> list[tuple[Path, dict[str, Any]]]:
    """Every manifest the kustomizations install (examples/ holds what a site writes itself)."""
    docs = []
    for path in sorted(under.rglob("*.yaml")):
        if under == MANIFESTS and path.is_relative_to(MANIFESTS / "examples"):
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path, doc))
    return docs


DOCS = load_docs()
OBJECTS = [d for _, d in DOCS if d.get("kind") != "Kustomization"]


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in OBJECTS if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, len(found))
    return found[0]


def scheduler_config() -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load(one("ConfigMap", "tandem-scheduler-config")["data"]["config.yaml"])
    return cfg


def extender_config() -> ExtenderConfig:
    return ExtenderConfig.model_validate(
        yaml.safe_load(one("ConfigMap", "tandem-extender-config")["data"]["config.yaml"])
    )


def pod_template() -> dict[str, Any]:
    tpl: dict[str, Any] = one("Deployment", "tandem-scheduler")["spec"]["template"]
    return tpl


def container(name: str) -> dict[str, Any]:
    (c,) = [c for c in pod_template()["spec"]["containers"] if c["name"] == name]
    found: dict[str, Any] = c
    return found


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        value, op = labels.get(e["key"]), e["operator"]
        if op == "In" and value not in e["values"] or op == "NotIn" and value in e["values"]:
            return False
        if op == "Exists" and value is None or op == "DoesNotExist" and value is not None:
            return False
    return True


# --------------------------------------------------------------------------------- parse & schema


def test_every_manifest_parses_and_is_named() -> None:
    assert len(OBJECTS) >= 20
    for obj in OBJECTS:
        assert obj.get("apiVersion") and obj.get("kind") and obj["metadata"].get("name"), obj


@pytest.mark.parametrize("obj", OBJECTS, ids=lambda o: f"{o['kind']}/{o['metadata']['name']}")
def test_validates_against_kubernetes_schema(obj: dict[str, Any]) -> None:
    if (obj["apiVersion"], obj["kind"]) in CRD_KINDS:
        pytest.skip("cert-manager CRD: no schema in kubernetes-validate; checked in test_cert_manager_overlay")
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_kustomizations_list_every_file() -> None:
    for kfile in MANIFESTS.rglob("kustomization.yaml"):
        listed = {(kfile.parent / r).resolve() for r in yaml.safe_load(kfile.read_text())["resources"]}
        assert all(p.exists() for p in listed), kfile
        local = {p.resolve() for p in kfile.parent.glob("*.yaml") if p.name != "kustomization.yaml"}
        assert local <= listed, (kfile, local - listed)


@pytest.mark.parametrize("overlay", ["", "cert-manager"])
def test_kustomize_builds(overlay: str) -> None:
    if shutil.which("kubectl") is None:
        missing("kubectl (with kustomize)")
    out = subprocess.run(["kubectl", "kustomize", str(MANIFESTS / overlay)], capture_output=True, text=True, check=True)
    built = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(out.stdout) if d}
    expected = {
        (o["kind"], o["metadata"]["name"])
        for o in OBJECTS
        if overlay or o["apiVersion"] not in {a for a, _ in CRD_KINDS}
    }
    assert built == expected


def test_cert_manager_overlay() -> None:
    cert = one("Certificate", "tandem-webhook")
    service = one("Service", "tandem-webhook")
    assert f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc" in cert["spec"]["dnsNames"]
    secrets = [v["secret"]["secretName"] for v in pod_template()["spec"]["volumes"] if "secret" in v]
    assert cert["spec"]["secretName"] in secrets
    assert one("Issuer", cert["spec"]["issuerRef"]["name"])
    mwc = one("MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "tandem-system/tandem-webhook"


# ---------------------------------------------------------------------------- scheduler configuration

# Field names of kubescheduler.config.k8s.io/v1 (kube-scheduler decodes strictly: an unknown field stops it).
KSC_FIELDS = {
    "apiVersion",
    "kind",
    "parallelism",
    "leaderElection",
    "clientConnection",
    "enableProfiling",
    "enableContentionProfiling",
    "percentageOfNodesToScore",
    "podInitialBackoffSeconds",
    "podMaxBackoffSeconds",
    "profiles",
    "extenders",
    "delayCacheUntilActive",
}
EXTENDER_FIELDS = {
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}
PROFILE_FIELDS = {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"}
LEADER_FIELDS = {
    "leaderElect",
    "leaseDuration",
    "renewDeadline",
    "retryPeriod",
    "resourceLock",
    "resourceName",
    "resourceNamespace",
}


def test_scheduler_configuration_fields_are_known() -> None:
    cfg = scheduler_config()
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1" and cfg["kind"] == "KubeSchedulerConfiguration"
    assert set(cfg) <= KSC_FIELDS
    assert set(cfg["leaderElection"]) <= LEADER_FIELDS
    for p in cfg["profiles"]:
        assert set(p) <= PROFILE_FIELDS
    for e in cfg["extenders"]:
        assert set(e) <= EXTENDER_FIELDS


def test_scheduler_configuration_values() -> None:
    cfg = scheduler_config()
    le = cfg["leaderElection"]
    assert le["leaderElect"] is True
    assert (le["resourceName"], le["resourceNamespace"], le["resourceLock"]) == (
        "tandem-scheduler",
        "tandem-system",
        "leases",
    )
    (profile,) = cfg["profiles"]
    assert profile["schedulerName"] == "tandem-scheduler"
    assert cfg["percentageOfNodesToScore"] == 100 and profile.get("percentageOfNodesToScore", 100) == 100
    (fit,) = [pc["args"] for pc in profile["pluginConfig"] if pc["name"] == "NodeResourcesFit"]
    strategy = fit["scoringStrategy"]
    assert strategy["type"] == "MostAllocated"
    weights = {r["name"]: r["weight"] for r in strategy["resources"]}
    assert set(weights) == {"cpu", "memory", "nvidia.com/gpu"}
    assert weights["nvidia.com/gpu"] > max(weights["cpu"], weights["memory"])
    (ext,) = cfg["extenders"]
    assert ext["nodeCacheCapable"] is True
    assert ext["managedResources"] == []
    assert ext["ignorable"] is False
    assert ext["enableHTTPS"] is False and ext["httpTimeout"] == "2s"
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["preemptVerb"]) == ("filter", "prioritize", "preempt")
    assert "bindVerb" not in ext  # kube-scheduler binds; the extender only advises


def test_extender_weight_dominates_plugin_scores() -> None:
    cfg = scheduler_config()
    (profile,) = cfg["profiles"]
    score = profile["plugins"]["score"]
    disabled = {p["name"] for p in score["disabled"]}
    assert {"NodeResourcesBalancedAllocation", "ImageLocality"} <= disabled
    enabled_weight = sum(p["weight"] for p in score["enabled"])
    headroom = 2  # score plugins a feature gate may add at weight 1 (VolumeBinding, DynamicResources)
    plugin_spread = 100 * (enabled_weight + headroom)  # each plugin scores 0..100
    one_extender_point = cfg["extenders"][0]["weight"] * 10  # 0..10 rescaled by 100/10
    assert one_extender_point > plugin_spread


def test_extender_url_matches_the_extender_config() -> None:
    (ext,) = scheduler_config()["extenders"]
    url = urlsplit(ext["urlPrefix"])
    xcfg = extender_config()
    assert url.scheme == "http" and url.hostname == "127.0.0.1"  # loopback only: plain HTTP stays in the pod
    assert (url.hostname, url.port) == (xcfg.host, xcfg.port)
    for verb, field in (
        ("filterVerb", "filter_verb"),
        ("prioritizeVerb", "prioritize_verb"),
        ("preemptVerb", "preempt_verb"),
    ):
        assert f"{url.path.rstrip('/')}/{ext[verb]}" == xcfg.verb_path(getattr(xcfg, field))


def test_scheduler_name_is_the_same_everywhere() -> None:
    name = scheduler_config()["profiles"][0]["schedulerName"]
    xcfg = extender_config()
    assert name == xcfg.scheduler_name == ExtenderConfig().scheduler_name == "tandem-scheduler"
    answer = webhook.review(admission_review(as_created(PENDING["want-8"]), "team-a"), xcfg)
    assert answer["response"]["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(answer["response"]["patch"]))[0]["value"] == name
    assert xcfg.reservation_namespace == le_ns() == "tandem-system"


def le_ns() -> str:
    ns: str = scheduler_config()["leaderElection"]["resourceNamespace"]
    return ns


# ---------------------------------------------------------------------------------------- webhook


def test_webhook_cannot_block_the_cluster() -> None:
    (hook,) = one("MutatingWebhookConfiguration")["webhooks"]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["timeoutSeconds"] <= 5
    assert hook["sideEffects"] == "None"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["namespaceSelector"] == {"matchLabels": {"tandem.dev/gpu-routing": "enabled"}}
    # The scheduler's own pods never go through the webhook (no dependency loop at startup).
    assert not selector_matches(hook["objectSelector"], pod_template()["metadata"]["labels"])
    assert selector_matches(hook["objectSelector"], PENDING["want-8"]["metadata"].get("labels") or {})
    assert not selector_matches(hook["objectSelector"], {"tandem.dev/gpu-routing": "disabled"})


def test_webhook_service_reaches_the_extender_listener() -> None:
    (hook,) = one("MutatingWebhookConfiguration")["webhooks"]
    ref = hook["clientConfig"]["service"]
    service = one("Service", ref["name"])
    assert service["metadata"]["namespace"] == ref["namespace"]
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]]
    assert selector_matches({"matchLabels": service["spec"]["selector"]}, pod_template()["metadata"]["labels"])
    ext = container("extender")
    (cport,) = [p for p in ext["ports"] if p["name"] == port["targetPort"]]
    settings = extender_config().webhook  # the ConfigMap alone decides
    assert settings.listen is not None and int(settings.listen.rsplit(":", 1)[1]) == cport["containerPort"]
    assert ref["path"] == settings.path
    mounts = {m["name"]: m["mountPath"] for m in ext["volumeMounts"]}
    assert settings.tls_cert_file is not None and settings.tls_key_file is not None
    assert str(settings.tls_cert_file.parent) == mounts["webhook-tls"] == str(settings.tls_key_file.parent)


# ------------------------------------------------------------------------------------- deployment


def test_pod_is_hardened_and_wired() -> None:
    tpl = pod_template()
    spec = tpl["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["priorityClassName"] == one("PriorityClass", "tandem-scheduler-critical")["metadata"]["name"]
    assert one("ServiceAccount", spec["serviceAccountName"])
    volumes = {v["name"]: v for v in spec["volumes"]}
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        for m in c["volumeMounts"]:
            v = volumes[m["name"]]
            if "configMap" in v:
                one("ConfigMap", v["configMap"]["name"])
    sched, ext = container("kube-scheduler"), container("extender")
    assert sched["image"].startswith("registry.k8s.io/kube-scheduler:")
    config_mount = {m["name"]: m["mountPath"] for m in sched["volumeMounts"]}["scheduler-config"]
    assert f"--config={config_mount}/config.yaml" in sched["command"]
    assert ext["image"] == "tandem:latest"
    assert ext["command"][:3] == ["tandem-extender", "serve", "--kube"]
    xmount = {m["name"]: m["mountPath"] for m in ext["volumeMounts"]}["extender-config"]
    assert f"--config={xmount}/config.yaml" in ext["command"]
    assert ext["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "webhook", "scheme": "HTTPS"}
    assert ext["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "webhook", "scheme": "HTTPS"}


def test_pdb_and_priority_classes() -> None:
    pdb = one("PodDisruptionBudget", "tandem-scheduler")
    assert selector_matches(pdb["spec"]["selector"], pod_template()["metadata"]["labels"])
    assert pdb["spec"]["minAvailable"] < one("Deployment", "tandem-scheduler")["spec"]["replicas"]
    gang, crit = one("PriorityClass", "tandem-gang"), one("PriorityClass", "tandem-scheduler-critical")
    assert 0 < gang["value"] < crit["value"] <= 1_000_000_000  # above 1e9 is reserved for system classes
    assert not gang["globalDefault"] and not crit["globalDefault"]


# ------------------------------------------------------------------------------------------- RBAC

# What the watcher lists and watches, per kube.Kind: (apiGroup, resource, namespace or None for cluster-wide).
WATCHED = {
    kube.Kind.NODE: ("", "nodes", None),
    kube.Kind.POD: ("", "pods", None),
    kube.Kind.RESOURCE_SLICE: ("resource.k8s.io", "resourceslices", None),
    kube.Kind.RESOURCE_CLAIM: ("resource.k8s.io", "resourceclaims", None),
    kube.Kind.DEVICE_CLASS: ("resource.k8s.io", "deviceclasses", None),
    kube.Kind.RESERVATION: ("", "configmaps", "tandem-system"),
    kube.Kind.JOB: ("batch", "jobs", None),
}
EXTENDER_WATCHES = {k: v for k, v in WATCHED.items() if k in kube.INVENTORY_KINDS}


def grants(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] and not r.get("resourceNames")
        for r in rules
    )


def bound_roles(sa: str = "tandem-scheduler") -> list[dict[str, Any]]:
    out = []
    for b in OBJECTS:
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding") and any(s["name"] == sa for s in b["subjects"]):
            ref = b["roleRef"]
            out.append(
                {
                    "binding": b,
                    "ref": ref,
                    "role": next(
                        (o for o in OBJECTS if o["kind"] == ref["kind"] and o["metadata"]["name"] == ref["name"]), None
                    ),
                }
            )
    return out


@pytest.mark.parametrize(("sa", "watched"), [("tandem-scheduler", EXTENDER_WATCHES), ("tandem-agent", WATCHED)])
def test_rbac_covers_every_watched_kind(sa: str, watched: dict[Any, tuple[str, str, str | None]]) -> None:
    assert set(WATCHED) == set(kube.Kind)
    for kind, (group, resource, namespace) in watched.items():
        for verb in ("list", "watch"):
            ok = [
                b
                for b in bound_roles(sa)
                if b["role"] is not None
                and (namespace is None) == (b["ref"]["kind"] == "ClusterRole")
                and (namespace is None or b["binding"]["metadata"]["namespace"] == namespace)
                and grants(b["role"]["rules"], group, resource, verb)
            ]
            assert ok, (kind, verb)


NAMESPACED_ONLY = {"tandem-agent-workloads"}
"""ClusterRoles with write verbs that may only be bound per namespace (RoleBindings), never cluster-wide."""


def test_rbac_is_least_privilege() -> None:
    builtin = {"system:kube-scheduler", "system:volume-scheduler", "extension-apiserver-authentication-reader"}
    for b in bound_roles():
        if b["role"] is None:
            assert b["ref"]["name"] in builtin, b["ref"]  # the stock scheduler's own roles, bound, not widened
    for b in bound_roles("tandem-agent"):
        assert b["role"] is not None, b["ref"]
    for b in (o for o in OBJECTS if o["kind"] == "ClusterRoleBinding"):
        assert b["roleRef"]["name"] not in NAMESPACED_ONLY, b  # workload writes never cluster-wide
    for role in (o for o in OBJECTS if o["kind"] in ("ClusterRole", "Role")):
        for rule in role["rules"]:
            assert "*" not in rule["resources"] and "*" not in rule["apiGroups"]
            writes = WRITE_VERBS & set(rule["verbs"])
            name = role["metadata"]["name"]
            if role["kind"] == "ClusterRole" and name not in NAMESPACED_ONLY:
                assert not writes, (name, rule)  # nothing cluster-scoped is written
            elif name == "tandem-agent-workloads":
                assert set(rule["resources"]) <= {
                    "jobs",
                    "services",
                    "pods",
                    "resourceclaimtemplates",
                    "events",
                    "resourcequotas",
                }, rule
            elif name == "tandem-agent":
                assert role["metadata"]["namespace"] == "tandem-system"
                assert rule["resources"] in (["configmaps"], ["leases"]), rule
                assert (
                    rule["resources"] != ["leases"]
                    or "update" not in writes
                    or rule["resourceNames"] == ["tandem-agent"]
                )
            elif writes:
                # Justified: kube-scheduler's leader Lease (create cannot be scoped by name; get/update are).
                assert name == "tandem-scheduler-leases", rule
                assert rule["resources"] == ["leases"] and writes <= {"create", "update"}
                assert "update" not in writes or rule["resourceNames"] == ["tandem-scheduler"]


def test_the_scheduler_and_the_agent_do_not_share_an_identity() -> None:
    """The agent writes workloads; kube-scheduler's token must not carry those grants, nor the reverse."""
    agent = one("Deployment", "tandem-agent")["spec"]["template"]["spec"]
    assert agent["serviceAccountName"] == "tandem-agent" != pod_template()["spec"]["serviceAccountName"]
    sched_roles = {b["ref"]["name"] for b in bound_roles()}
    assert not sched_roles & {"tandem-agent", "tandem-agent-read", "tandem-agent-workloads"}


def test_agent_rbac_grants_what_the_agent_checks_at_start() -> None:
    from extender.agent.preflight import NAMESPACED_RULES, SYSTEM_RULES

    (workloads,) = [
        o for o in OBJECTS if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "tandem-agent-workloads"
    ]
    for p in NAMESPACED_RULES:
        assert grants(workloads["rules"], p.group, p.resource, p.verb), str(p)
    (system,) = [o for o in OBJECTS if o["kind"] == "Role" and o["metadata"]["name"] == "tandem-agent"]
    for p in SYSTEM_RULES:
        assert any(
            p.group in r["apiGroups"]
            and p.resource in r["resources"]
            and p.verb in r["verbs"]
            and (not p.name or p.name in r.get("resourceNames", [p.name]))
            for r in system["rules"]
        ), str(p)


def test_render_rbac_binds_the_workload_role_in_every_tenant_namespace() -> None:
    from extender.agent.config import AgentConfig
    from extender.agent.preflight import render_rbac

    cfg = AgentConfig(cluster_name="c", tenants={"a": ["team-a", "shared"], "b": ["team-b", "shared"]})
    docs = list(yaml.safe_load_all(render_rbac(cfg)))
    assert sorted(d["metadata"]["namespace"] for d in docs) == ["shared", "team-a", "team-b"]
    for d in docs:
        assert d["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "tandem-agent-workloads",
        }
        assert d["subjects"] == [{"kind": "ServiceAccount", "name": "tandem-agent", "namespace": "tandem-system"}]
        kubernetes_validate.validate(d, "1.35.0", strict=True)
    (cm_role,) = [o for o in OBJECTS if o["kind"] == "Role" and o["metadata"]["name"] == "tandem-extender-reservations"]
    assert cm_role["metadata"]["namespace"] == "tandem-system" and cm_role["rules"][0]["verbs"] == [
        "get",
        "list",
        "watch",
    ]


def test_agent_config_is_valid_and_agrees_with_the_extender_and_the_deployment() -> None:
    from extender.agent.config import AgentConfig

    cfg = AgentConfig.model_validate(yaml.safe_load(one("ConfigMap", "tandem-agent-config")["data"]["config.yaml"]))
    xcfg = extender_config()
    for field in ("scheduler_name", "reservation_namespace", "reservation_label", "topology", "gang_job_label"):
        assert getattr(cfg.extender, field) == getattr(xcfg, field), field
    assert cfg.lease.name == "tandem-agent" and cfg.lease.namespace == "tandem-system"
    spec = one("Deployment", "tandem-agent")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["command"][:3] == ["tandem-extender", "agent", "--kube"]
    assert [p["containerPort"] for p in container["ports"]] == [cfg.port]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert str(cfg.tls_cert_file).startswith(mounts["agent-tls"]) and str(cfg.tls_ca_file).startswith(
        mounts["agent-tls"]
    )
    secret = next(v["secret"]["secretName"] for v in spec["volumes"] if v["name"] == "agent-tls")
    assert one("Certificate", "tandem-agent")["spec"]["secretName"] == secret
    assert one("Certificate", "tandem-agent")["spec"]["commonName"] == cfg.cluster_name
    classes = {o["metadata"]["name"]: o for o in OBJECTS if o["kind"] == "PriorityClass"}
    assert cfg.default_priority_class in classes and cfg.preemptible_priority_class in classes
    assert classes[str(cfg.preemptible_priority_class)]["preemptionPolicy"] == "Never"


# ------------------------------------------------------------------ admission policies and tenant namespaces (H-3)

AGENT_USER = "system:serviceaccount:tandem-system:tandem-agent"
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"
KCM = "system:kube-controller-manager"
GC = "system:serviceaccount:kube-system:generic-garbage-collector"
TENANT_USER = "alice@example.com"
POLICIES = {o["metadata"]["name"]: o for o in OBJECTS if o["kind"] == "ValidatingAdmissionPolicy"}
EXPRESSIONS = [
    (name, where, e["expression"])
    for name, p in POLICIES.items()
    for where in ("variables", "validations")
    for e in p["spec"][where]
]


def test_admission_policies_are_bound_to_the_tenant_namespaces_only() -> None:
    from extender.agent.preflight import TENANT_NAMESPACE_LABEL

    assert set(POLICIES) == {"tandem-fencing-jobs", "tandem-fencing-pods"}
    bindings = {o["spec"]["policyName"]: o for o in OBJECTS if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert set(bindings) == set(POLICIES)
    for name, policy in POLICIES.items():
        assert policy["spec"]["failurePolicy"] == "Fail"
        (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
        assert set(rule["operations"]) == {"CREATE", "UPDATE"} and "/" not in "".join(rule["resources"])
        b = bindings[name]["spec"]
        assert b["validationActions"] == ["Deny"]
        assert b["matchResources"]["namespaceSelector"] == {"matchLabels": {TENANT_NAMESPACE_LABEL: "true"}}
        text = json.dumps(policy)
        assert AGENT_USER in text
    agent = one("Deployment", "tandem-agent")
    assert (
        AGENT_USER == f"system:serviceaccount:{agent['metadata']['namespace']}:"
        f"{agent['spec']['template']['spec']['serviceAccountName']}"
    )


@pytest.mark.parametrize(
    ("policy", "where", "expression"), EXPRESSIONS, ids=[f"{n}-{w}-{i}" for i, (n, w, _) in enumerate(EXPRESSIONS)]
)
def test_every_cel_expression_compiles(policy: str, where: str, expression: str) -> None:
    import cel

    cel.compile(expression)


def admit(
    policy: str,
    operation: str,
    user: str,
    obj: dict[str, Any],
    old: dict[str, Any] | None = None,
    *,
    dry_run: bool = False,
) -> list[str]:
    """The messages of the validations that refuse this request (empty: admitted), evaluated as the API
    server does: variables in order, each seeing the earlier ones, then every validation."""
    import cel

    spec = POLICIES[policy]["spec"]
    request = {
        "operation": operation,
        "dryRun": dry_run,
        "userInfo": {"username": user, "groups": []},
        "resource": {"group": "batch" if "jobs" in policy else "", "resource": policy.rsplit("-", 1)[1]},
    }
    variables: dict[str, Any] = {}

    def run(expression: str) -> Any:
        ctx = cel.Context(variables={"request": request, "object": obj, "oldObject": old, "variables": variables})
        return cel.compile(expression).execute(ctx)

    for v in spec["variables"]:
        variables[v["name"]] = run(v["expression"])
    return [v["message"] for v in spec["validations"] if run(v["expression"]) is not True]


def gang_objects() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A Job as the agent renders it, its pod as the Job controller creates it (gated), and that pod pinned."""
    from extender.agent.pods import pin_patch, pod_for_dry_run
    from sim.kubeapi.patch import json_patch
    from tests.extender.test_agent_render import render

    job = render().jobs[0]
    pod = pod_for_dry_run(job, 0)
    pod["metadata"].update(name=pod["metadata"]["generateName"] + "x7k2p", resourceVersion="41")
    pinned = json_patch(pod, pin_patch(pod, "node-0007"))
    return job, pod, pinned


def with_(obj: dict[str, Any], change: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(obj))
    change(out)
    return out


def _ungated(pod: dict[str, Any]) -> dict[str, Any]:
    from extender.agent.pods import ungate_patch
    from sim.kubeapi.patch import json_patch

    ops = ungate_patch(pod)
    assert ops is not None
    return json_patch(pod, ops)


def _relabel(job_id: str) -> Any:
    def change(o: dict[str, Any]) -> None:
        o["metadata"]["labels"]["tandem.dev/job"] = job_id

    return change


def _own_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "notebook", "namespace": "team-a", "labels": {"app": "notebook"}},
        "spec": {"containers": [{"name": "main", "image": "jupyter/base-notebook"}]},
    }


def _own_job() -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "etl", "namespace": "team-a"},
        "spec": {
            "template": {
                "metadata": {"labels": {"app": "etl"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "etl:1"}]},
            }
        },
    }


def admission_cases() -> list[tuple[str, str, str, str, Any, Any, bool, bool]]:
    job, pod, pinned = gang_objects()
    tandem_label_job = with_(
        _own_job(), lambda o: o["spec"]["template"]["metadata"]["labels"].update({"tandem.dev/job": "train-42"})
    )
    finalized = with_(job, lambda o: o["metadata"].update(finalizers=["foregroundDeletion"]))
    scaled = with_(job, lambda o: o["spec"].update(parallelism=0))
    stranger = with_(_own_pod(), _relabel("train-42"))
    moved = json.loads(json.dumps(pinned))
    moved["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchFields"
    ][0]["values"] = ["node-0001"]
    selector = with_(pod, lambda o: o["spec"].update(nodeSelector={"kubernetes.io/hostname": "node-0001"}))
    annotated = with_(pinned, lambda o: o["metadata"]["annotations"].update({"example.com/note": "x"}))
    tracked_off = with_(_ungated(pinned), lambda o: o["metadata"].update(finalizers=[]))
    # (id, policy, operation, user, object, old object, dryRun, admitted)
    return [
        ("the agent creates its Job", "tandem-fencing-jobs", "CREATE", AGENT_USER, job, None, False, True),
        (
            "a tenant creates a Job with Tandem's labels",
            "tandem-fencing-jobs",
            "CREATE",
            TENANT_USER,
            job,
            None,
            False,
            False,
        ),
        (
            "a tenant's Job template with tandem.dev/job",
            "tandem-fencing-jobs",
            "CREATE",
            TENANT_USER,
            tandem_label_job,
            None,
            False,
            False,
        ),
        ("a tenant's own Job", "tandem-fencing-jobs", "CREATE", TENANT_USER, _own_job(), None, False, True),
        ("a tenant scales a Tandem Job", "tandem-fencing-jobs", "UPDATE", TENANT_USER, scaled, job, False, False),
        (
            "a tenant strips Tandem's labels off its Job",
            "tandem-fencing-jobs",
            "UPDATE",
            TENANT_USER,
            with_(job, lambda o: o["metadata"]["labels"].clear()),
            job,
            False,
            False,
        ),
        ("the agent updates its Job", "tandem-fencing-jobs", "UPDATE", AGENT_USER, scaled, job, False, True),
        (
            "the garbage collector finalizes a Tandem Job",
            "tandem-fencing-jobs",
            "UPDATE",
            GC,
            finalized,
            job,
            False,
            True,
        ),
        (
            "the controller manager may not change the spec",
            "tandem-fencing-jobs",
            "UPDATE",
            KCM,
            scaled,
            job,
            False,
            False,
        ),
        (
            "the Job controller creates a gang pod",
            "tandem-fencing-pods",
            "CREATE",
            JOB_CONTROLLER,
            pod,
            None,
            False,
            True,
        ),
        ("the controller manager creates a gang pod", "tandem-fencing-pods", "CREATE", KCM, pod, None, False, True),
        ("the agent's admission dry run", "tandem-fencing-pods", "CREATE", AGENT_USER, pod, None, True, True),
        ("the agent creates a gang pod for real", "tandem-fencing-pods", "CREATE", AGENT_USER, pod, None, False, False),
        (
            "a tenant creates a pod in another gang",
            "tandem-fencing-pods",
            "CREATE",
            TENANT_USER,
            pod,
            None,
            False,
            False,
        ),
        ("a tenant's own pod", "tandem-fencing-pods", "CREATE", TENANT_USER, _own_pod(), None, False, True),
        (
            "a tenant relabels its pod into a gang",
            "tandem-fencing-pods",
            "UPDATE",
            TENANT_USER,
            stranger,
            _own_pod(),
            False,
            False,
        ),
        (
            "a tenant moves a pod to another gang",
            "tandem-fencing-pods",
            "UPDATE",
            TENANT_USER,
            with_(pod, _relabel("train-99")),
            pod,
            False,
            False,
        ),
        ("the agent pins", "tandem-fencing-pods", "UPDATE", AGENT_USER, pinned, pod, False, True),
        ("a tenant pins", "tandem-fencing-pods", "UPDATE", TENANT_USER, pinned, pod, False, False),
        ("a tenant moves a pin", "tandem-fencing-pods", "UPDATE", TENANT_USER, moved, pinned, False, False),
        ("a tenant narrows nodeSelector", "tandem-fencing-pods", "UPDATE", TENANT_USER, selector, pod, False, False),
        ("the agent ungates", "tandem-fencing-pods", "UPDATE", AGENT_USER, _ungated(pinned), pinned, False, True),
        ("a tenant ungates", "tandem-fencing-pods", "UPDATE", TENANT_USER, _ungated(pinned), pinned, False, False),
        (
            "a tenant annotates a gated pod",
            "tandem-fencing-pods",
            "UPDATE",
            TENANT_USER,
            annotated,
            pinned,
            False,
            True,
        ),
        (
            "the Job controller drops its tracking finalizer",
            "tandem-fencing-pods",
            "UPDATE",
            JOB_CONTROLLER,
            tracked_off,
            _ungated(pinned),
            False,
            True,
        ),
        (
            "a tenant edits its own pod",
            "tandem-fencing-pods",
            "UPDATE",
            TENANT_USER,
            with_(_own_pod(), lambda o: o["metadata"]["labels"].update(app="lab")),
            _own_pod(),
            False,
            True,
        ),
    ]


ADMISSION = admission_cases()


@pytest.mark.parametrize(
    ("policy", "operation", "user", "obj", "old", "dry_run", "admitted"),
    [c[1:] for c in ADMISSION],
    ids=[c[0] for c in ADMISSION],
)
def test_admission_policy_decisions(
    policy: str,
    operation: str,
    user: str,
    obj: dict[str, Any],
    old: dict[str, Any] | None,
    dry_run: bool,
    admitted: bool,
) -> None:
    refused = admit(policy, operation, user, obj, old, dry_run=dry_run)
    assert (not refused) == admitted, refused


def test_the_example_tenant_namespace_is_what_the_agent_accepts() -> None:
    from extender.agent.preflight import pod_security_problem

    examples = [d for _, d in load_docs(MANIFESTS / "examples")]
    assert examples and {d["kind"] for d in examples} == {"Namespace"}
    for ns in examples:
        kubernetes_validate.validate(ns, K8S_VERSION, strict=True)
        labels = ns["metadata"]["labels"]
        assert selector_matches({"matchLabels": {"tandem.dev/tenant-namespace": "true"}}, labels)
        assert pod_security_problem(labels, "baseline", []) is None
        assert pod_security_problem(labels, "baseline", ["IPC_LOCK"]) is not None  # the IPC_LOCK case differs
    kustomized = {
        (MANIFESTS / k.parent / r).resolve()
        for k in MANIFESTS.rglob("kustomization.yaml")
        for r in yaml.safe_load(k.read_text())["resources"]
    }
    assert not any(p.is_relative_to(MANIFESTS / "examples") for p in kustomized)
