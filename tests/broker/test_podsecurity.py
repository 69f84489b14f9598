"""The broker's judgement of untrusted pod templates (FLEET-NOTES H-1, H-4): every control of the Pod Security
Standards' baseline and restricted levels on the pod and on every container kind, with exact field paths;
capability names normalised and per-tenant extra capabilities; Tandem's own rules; the tenant's policy
threaded from the (reloaded) policy file to a SubmitJobs answer over real gRPC.

Each case starts from a real-format template that passes its level and changes one thing, so the set of
fields reported is exactly the one the rule names."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.rpc import error_details_pb2
from pydantic import ValidationError

from broker.api import validation
from broker.tenancy import podsecurity
from broker.tenancy.policy import PolicyFile, TenantPolicy, parse_policy
from tandem.v1 import job_pb2
from tandem.v1 import job_service_pb2 as svc
from tests.broker.hub_builders import Broker, policy_doc, spec, start_broker, write_policy
from tests.fixtures import fixture_json

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]
DELETE = object()
"""A mutation value: remove the field."""
KINDS = podsecurity.CONTAINER_KINDS


def _container(name: str, command: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "image": "nvcr.io/nvidia/pytorch:25.10-py3",
        "command": command,
        "imagePullPolicy": "IfNotPresent",
    }


def baseline_spec() -> dict[str, Any]:
    """A torchrun worker as a launcher writes it: GPUs, /dev/shm, a config map, a checkpoint PVC, a data
    fetcher init container, a debug ephemeral container (so every container kind is present)."""
    trainer = _container("trainer", ["torchrun", "train.py", "--config", "/etc/train/7b.yaml"])
    trainer.update(
        {
            "env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "NCCL_IB_HCA", "value": "mlx5"}],
            "ports": [{"name": "c10d", "containerPort": 29500, "protocol": "TCP"}],
            "resources": {
                "requests": {"cpu": "96", "memory": "1Ti"},
                "limits": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8"},
            },
            "volumeMounts": [
                {"name": "dshm", "mountPath": "/dev/shm"},
                {"name": "config", "mountPath": "/etc/train"},
                {"name": "ckpt", "mountPath": "/ckpt"},
            ],
            "readinessProbe": {"tcpSocket": {"port": 29500}, "periodSeconds": 10},
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "initialDelaySeconds": 60},
        }
    )
    fetch = _container("fetch-data", ["python", "-m", "fetch", "--to", "/ckpt/data"])
    fetch["volumeMounts"] = [{"name": "ckpt", "mountPath": "/ckpt"}]
    debug = _container("debugger", ["sleep", "infinity"])
    return {
        "containers": [trainer],
        "initContainers": [fetch],
        "ephemeralContainers": [debug],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}},
            {"name": "config", "configMap": {"name": "llm-7b-config"}},
            {"name": "ckpt", "persistentVolumeClaim": {"claimName": "llm-checkpoints"}},
        ],
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "terminationGracePeriodSeconds": 120,
    }


def restricted_spec() -> dict[str, Any]:
    """The same worker hardened to the restricted level (runAsNonRoot at pod level only)."""
    s = baseline_spec()
    s["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    for kind in KINDS:
        for c in s[kind]:
            c["securityContext"] = {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "readOnlyRootFilesystem": True,
            }
    return s


_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def put(obj: dict[str, Any], path: str, value: Any) -> None:
    """Set (or with DELETE remove) `a.b[0].c` in obj, making the objects on the way."""
    keys: list[str | int] = [m.group(1) if m.group(1) is not None else int(m.group(2)) for m in _TOKEN.finditer(path)]
    cur: Any = obj
    for key, nxt in zip(keys, keys[1:]):
        if isinstance(key, int):
            cur = cur[key]
        else:
            cur = cur.setdefault(key, [] if isinstance(nxt, int) else {})
    last = keys[-1]
    if value is DELETE:
        del cur[last]
    elif isinstance(last, int) and last == len(cur):
        cur.append(value)
    else:
        cur[last] = value


def mutated(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for path, value in changes.items():
        put(out, path, value)
    return out


def fields(violations: list[Any]) -> set[str]:
    return {v.field for v in violations}


# ------------------------------------------------------------------------------- the bases pass their level


def test_the_real_format_bases_pass_their_levels() -> None:
    assert podsecurity.check(baseline_spec(), "baseline") == []
    assert podsecurity.check(restricted_spec(), "restricted") == []
    assert fields(podsecurity.check(baseline_spec(), "restricted")) == {
        f"spec.{k}[0].securityContext.{f}"
        for k in KINDS
        for f in ("allowPrivilegeEscalation", "runAsNonRoot", "seccompProfile.type", "capabilities.drop")
    }


def test_real_pods_from_a_cluster_pass_baseline() -> None:
    for pod in fixture_json("pending-pods.json")["items"]:
        assert podsecurity.check(pod["spec"], "baseline") == [], pod["metadata"]["name"]


# ------------------------------------------------------------------------------------------ baseline controls


def per_kind(control: str, name: str, suffix: str, value: Any, reported: str = "") -> list[tuple[Any, ...]]:
    """One case per container kind: set `<kind>[0].<suffix>` to value; the field reported (default: suffix)."""
    return [
        (control, f"{name} in {kind}", {f"{kind}[0].{suffix}": value}, {f"spec.{kind}[0].{reported or suffix}"})
        for kind in KINDS
    ]


# Refused at both levels with the same field, so it is a case of both lists.
SECCOMP_UNCONFINED_PER_KIND = per_kind(
    "Seccomp",
    "Unconfined",
    "securityContext.seccompProfile",
    {"type": "Unconfined"},
    "securityContext.seccompProfile.type",
)


# (control, id, changes to baseline_spec(), fields reported[, fields reported at restricted when they differ])
BASELINE_REFUSED: list[tuple[Any, ...]] = [
    (
        "HostProcess",
        "pod hostProcess",
        {"securityContext.windowsOptions.hostProcess": True},
        {"spec.securityContext.windowsOptions.hostProcess"},
    ),
    *per_kind("HostProcess", "hostProcess", "securityContext.windowsOptions.hostProcess", True),
    ("Host Namespaces", "hostNetwork", {"hostNetwork": True}, {"spec.hostNetwork"}),
    ("Host Namespaces", "hostPID", {"hostPID": True}, {"spec.hostPID"}),
    ("Host Namespaces", "hostIPC", {"hostIPC": True}, {"spec.hostIPC"}),
    *per_kind("Privileged Containers", "privileged", "securityContext.privileged", True),
    *per_kind(
        "Capabilities",
        "SYS_ADMIN",
        "securityContext.capabilities.add",
        ["SYS_ADMIN"],
        "securityContext.capabilities.add[0]",
    ),
    *[
        (
            "Capabilities",
            f"add {cap}",
            {"containers[0].securityContext.capabilities.add": ["NET_BIND_SERVICE", cap]},
            {"spec.containers[0].securityContext.capabilities.add[1]"},
        )
        for cap in (
            "DAC_READ_SEARCH",
            "SYS_RAWIO",
            "BPF",
            "PERFMON",
            "NET_RAW",
            "NET_ADMIN",
            "SYS_PTRACE",
            "SYS_MODULE",
            "IPC_LOCK",
            "ALL",
            "CAP_SYS_ADMIN",
            "cap_sys_admin",
            "sys_admin",
            "Cap_Bpf",
            " SYS_ADMIN",
            "",
        )
    ],
    (
        "Capabilities",
        "a capability that is not a string",
        {"containers[0].securityContext.capabilities.add": [7]},
        {"spec.containers[0].securityContext.capabilities.add[0]"},
    ),
    (
        "HostPath Volumes",
        "hostPath",
        {"volumes[3]": {"name": "host", "hostPath": {"path": "/"}}},
        {"spec.volumes[3].hostPath"},
    ),
    (
        "HostPath Volumes",
        "empty hostPath",
        {"volumes[3]": {"name": "host", "hostPath": {}}},
        {"spec.volumes[3].hostPath"},
    ),
    *per_kind("Host Ports", "hostPort", "ports", [{"containerPort": 80, "hostPort": 80}], "ports[0].hostPort"),
    (
        "Host Ports",
        "a second port",
        {"containers[0].ports[1]": {"containerPort": 443, "hostPort": 443}},
        {"spec.containers[0].ports[1].hostPort"},
    ),
    *per_kind(
        "Host Probes / Lifecycle Hooks", "liveness httpGet host", "livenessProbe.httpGet.host", "169.254.169.254"
    ),
    (
        "Host Probes / Lifecycle Hooks",
        "readiness tcpSocket host",
        {"containers[0].readinessProbe.tcpSocket.host": "10.0.0.1"},
        {"spec.containers[0].readinessProbe.tcpSocket.host"},
    ),
    (
        "Host Probes / Lifecycle Hooks",
        "startup probe host",
        {"containers[0].startupProbe": {"httpGet": {"host": "db", "port": 5432}}},
        {"spec.containers[0].startupProbe.httpGet.host"},
    ),
    (
        "Host Probes / Lifecycle Hooks",
        "preStop hook host",
        {"containers[0].lifecycle.preStop.httpGet": {"host": "localhost", "port": 9091, "path": "/quit"}},
        {"spec.containers[0].lifecycle.preStop.httpGet.host"},
    ),
    (
        "Host Probes / Lifecycle Hooks",
        "postStart hook host",
        {"initContainers[0].lifecycle.postStart.tcpSocket": {"host": "node", "port": 22}},
        {"spec.initContainers[0].lifecycle.postStart.tcpSocket.host"},
    ),
    (
        "AppArmor",
        "pod Unconfined",
        {"securityContext.appArmorProfile.type": "Unconfined"},
        {"spec.securityContext.appArmorProfile.type"},
    ),
    *per_kind("AppArmor", "Unconfined", "securityContext.appArmorProfile.type", "Unconfined"),
    (
        "SELinux",
        "pod type",
        {"securityContext.seLinuxOptions.type": "spc_t"},
        {"spec.securityContext.seLinuxOptions.type"},
    ),
    *per_kind("SELinux", "type", "securityContext.seLinuxOptions.type", "spc_t"),
    (
        "SELinux",
        "user",
        {"containers[0].securityContext.seLinuxOptions.user": "system_u"},
        {"spec.containers[0].securityContext.seLinuxOptions.user"},
    ),
    (
        "SELinux",
        "role",
        {"securityContext.seLinuxOptions.role": "system_r"},
        {"spec.securityContext.seLinuxOptions.role"},
    ),
    *per_kind("/proc Mount Type", "Unmasked", "securityContext.procMount", "Unmasked"),
    (
        "Seccomp",
        "pod Unconfined",
        {"securityContext.seccompProfile.type": "Unconfined"},
        {"spec.securityContext.seccompProfile.type"},
        {
            "spec.securityContext.seccompProfile.type",
            *(f"spec.{k}[0].securityContext.seccompProfile.type" for k in KINDS),
        },
    ),
    *SECCOMP_UNCONFINED_PER_KIND,
    *[
        (
            "Sysctls",
            name,
            {
                "securityContext.sysctls": [
                    {"name": "net.ipv4.tcp_syncookies", "value": "1"},
                    {"name": name, "value": "1"},
                ]
            },
            {"spec.securityContext.sysctls[1].name"},
        )
        for name in ("kernel.msgmax", "net.core.somaxconn", "vm.overcommit_memory", "kernel.shm_rmid_forced.x")
    ],
]

BASELINE_ALLOWED: list[tuple[str, dict[str, Any]]] = [
    (
        "every baseline capability",
        {"containers[0].securityContext.capabilities.add": sorted(podsecurity.BASELINE_CAPABILITIES)},
    ),
    (
        "capabilities spelt with CAP_ and in lower case",
        {"initContainers[0].securityContext.capabilities.add": ["CAP_CHOWN", "cap_kill", "net_bind_service"]},
    ),
    (
        "false where true is refused",
        {
            "hostNetwork": False,
            "hostPID": False,
            "hostIPC": False,
            "containers[0].securityContext.privileged": False,
            "securityContext.windowsOptions.hostProcess": False,
        },
    ),
    ("hostPort 0", {"containers[0].ports[0].hostPort": 0}),
    ("procMount Default", {"containers[0].securityContext.procMount": "Default"}),
    (
        "seccomp RuntimeDefault and Localhost",
        {
            "securityContext.seccompProfile.type": "RuntimeDefault",
            "containers[0].securityContext.seccompProfile": {"type": "Localhost", "localhostProfile": "trainer.json"},
        },
    ),
    (
        "AppArmor RuntimeDefault and Localhost",
        {
            "securityContext.appArmorProfile.type": "RuntimeDefault",
            "containers[0].securityContext.appArmorProfile": {"type": "Localhost", "localhostProfile": "k8s-trainer"},
        },
    ),
    (
        "SELinux container types",
        {
            "securityContext.seLinuxOptions": {"type": "container_t", "level": "s0:c1,c2"},
            "initContainers[0].securityContext.seLinuxOptions.type": "container_init_t",
            "containers[0].securityContext.seLinuxOptions": {"type": "container_kvm_t", "user": "", "role": ""},
        },
    ),
    (
        "every safe sysctl",
        {"securityContext.sysctls": [{"name": n, "value": "1"} for n in sorted(podsecurity.SAFE_SYSCTLS)]},
    ),
    ("empty probe host", {"containers[0].livenessProbe.httpGet.host": ""}),
    (
        "what only restricted refuses",
        {
            "containers[0].securityContext.allowPrivilegeEscalation": True,
            "securityContext.runAsUser": 0,
            "volumes[3]": {"name": "nfs", "nfs": {"server": "nas", "path": "/data"}},
        },
    ),
]


@pytest.mark.parametrize(
    ("control", "changes", "reported", "at_restricted"),
    [(c[0], c[2], c[3], c[4] if len(c) > 4 else c[3]) for c in BASELINE_REFUSED],
    ids=[c[1] for c in BASELINE_REFUSED],
)
@pytest.mark.parametrize("level", podsecurity.LEVELS)
def test_baseline_controls_refuse_at_both_levels(
    level: str, control: str, changes: dict[str, Any], reported: set[str], at_restricted: set[str]
) -> None:
    base = baseline_spec() if level == "baseline" else restricted_spec()
    got = podsecurity.check(mutated(base, changes), level)  # type: ignore[arg-type]
    assert fields(got) == (reported if level == "baseline" else at_restricted), got
    assert all(v.description for v in got)


@pytest.mark.parametrize("changes", [c[1] for c in BASELINE_ALLOWED], ids=[c[0] for c in BASELINE_ALLOWED])
def test_baseline_allows(changes: dict[str, Any]) -> None:
    assert podsecurity.check(mutated(baseline_spec(), changes), "baseline") == []


def test_apparmor_annotations() -> None:
    key = podsecurity.APPARMOR_ANNOTATION_PREFIX + "trainer"
    for value, ok in (
        ("runtime/default", True),
        ("localhost/k8s-trainer", True),
        ("", True),
        ("unconfined", False),
        ("docker-default", False),
    ):
        got = podsecurity.check(
            baseline_spec(), "baseline", annotations={key: value}, annotations_path="tpl.metadata.annotations"
        )
        assert fields(got) == (set() if ok else {f"tpl.metadata.annotations[{key!r}]"}), value


# ---------------------------------------------------------------------------------------- restricted controls

# (control, id, changes to restricted_spec(), fields reported at restricted)
RESTRICTED_REFUSED: list[tuple[Any, ...]] = [
    *[
        ("Volume Types", source, {"volumes[3]": {"name": "v", source: body}}, {f"spec.volumes[3].{source}"})
        for source, body in (
            ("nfs", {"server": "nas", "path": "/"}),
            ("gitRepo", {"repository": "x"}),
            ("awsElasticBlockStore", {"volumeID": "vol-1"}),
            ("iscsi", {"targetPortal": "t"}),
            ("cephfs", {"monitors": ["m"]}),
            ("flexVolume", {"driver": "d"}),
            ("azureFile", {"secretName": "s", "shareName": "s"}),
        )
    ],
    *per_kind(
        "Privilege Escalation", "allowPrivilegeEscalation true", "securityContext.allowPrivilegeEscalation", True
    ),
    *per_kind(
        "Privilege Escalation", "allowPrivilegeEscalation unset", "securityContext.allowPrivilegeEscalation", DELETE
    ),
    (
        "Running as Non-root",
        "pod false",
        {"securityContext.runAsNonRoot": False},
        {"spec.securityContext.runAsNonRoot", *(f"spec.{k}[0].securityContext.runAsNonRoot" for k in KINDS)},
    ),
    (
        "Running as Non-root",
        "unset everywhere",
        {"securityContext.runAsNonRoot": DELETE},
        {f"spec.{k}[0].securityContext.runAsNonRoot" for k in KINDS},
    ),
    *per_kind("Running as Non-root", "container false", "securityContext.runAsNonRoot", False),
    ("Running as Non-root user", "pod root", {"securityContext.runAsUser": 0}, {"spec.securityContext.runAsUser"}),
    *per_kind("Running as Non-root user", "root", "securityContext.runAsUser", 0),
    (
        "Seccomp",
        "unset everywhere",
        {"securityContext.seccompProfile": DELETE},
        {f"spec.{k}[0].securityContext.seccompProfile.type" for k in KINDS},
    ),
    (
        "Seccomp",
        "pod Unconfined",
        {"securityContext.seccompProfile.type": "Unconfined"},
        {
            "spec.securityContext.seccompProfile.type",
            *(f"spec.{k}[0].securityContext.seccompProfile.type" for k in KINDS),
        },
    ),
    *SECCOMP_UNCONFINED_PER_KIND,
    *per_kind("Capabilities", "drop ALL missing", "securityContext.capabilities.drop", ["NET_RAW"]),
    *per_kind(
        "Capabilities",
        "add CHOWN",
        "securityContext.capabilities.add",
        ["NET_BIND_SERVICE", "CHOWN"],
        "securityContext.capabilities.add[1]",
    ),
]

RESTRICTED_ALLOWED: list[tuple[str, dict[str, Any]]] = [
    (
        "every allowed volume type",
        {
            "volumes[3]": {"name": "s", "secret": {"secretName": "wandb"}},
            "volumes[4]": {"name": "p", "projected": {"sources": []}},
            "volumes[5]": {"name": "d", "downwardAPI": {"items": []}},
            "volumes[6]": {"name": "c", "csi": {"driver": "fsx.csi.aws.com"}},
            "volumes[7]": {"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
            "volumes[8]": {"name": "i", "image": {"reference": "registry/weights:7b"}},
        },
    ),
    (
        "runAsNonRoot on every container instead of the pod",
        {"securityContext.runAsNonRoot": DELETE, **{f"{k}[0].securityContext.runAsNonRoot": True for k in KINDS}},
    ),
    (
        "seccomp on every container instead of the pod",
        {
            "securityContext.seccompProfile": DELETE,
            **{
                f"{k}[0].securityContext.seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}
                for k in KINDS
            },
        },
    ),
    (
        "NET_BIND_SERVICE, and drop all in lower case",
        {"containers[0].securityContext.capabilities": {"drop": ["all"], "add": ["CAP_NET_BIND_SERVICE"]}},
    ),
    (
        "Windows pods: the Linux-only controls do not apply",
        {
            "os": {"name": "windows"},
            "securityContext.seccompProfile": DELETE,
            **{f"{k}[0].securityContext": {"runAsNonRoot": True} for k in KINDS},
        },
    ),
]


@pytest.mark.parametrize(
    ("control", "changes", "reported"),
    [c[0:1] + c[2:] for c in RESTRICTED_REFUSED],
    ids=[c[1] for c in RESTRICTED_REFUSED],
)
def test_restricted_controls(control: str, changes: dict[str, Any], reported: set[str]) -> None:
    got = podsecurity.check(mutated(restricted_spec(), changes), "restricted")
    assert fields(got) == reported, got


@pytest.mark.parametrize("changes", [c[1] for c in RESTRICTED_ALLOWED], ids=[c[0] for c in RESTRICTED_ALLOWED])
def test_restricted_allows(changes: dict[str, Any]) -> None:
    assert podsecurity.check(mutated(restricted_spec(), changes), "restricted") == []


def test_every_control_has_cases() -> None:
    named = {c[0] for c in BASELINE_REFUSED} | {c[0] for c in RESTRICTED_REFUSED}
    assert named == {c.name for c in podsecurity.CONTROLS}
    assert {c.name for c in podsecurity.CONTROLS if c.level == "restricted"} <= {c[0] for c in RESTRICTED_REFUSED}


# ------------------------------------------------------------------------------ tenant's extra capabilities


@pytest.mark.parametrize(
    ("level", "extra", "add", "reported"),
    [
        ("baseline", {"IPC_LOCK"}, ["IPC_LOCK"], set()),
        ("baseline", {"ipc_lock"}, ["CAP_IPC_LOCK", "CHOWN"], set()),
        ("baseline", {"CAP_IPC_LOCK"}, ["ipc_lock"], set()),
        (
            "baseline",
            {"IPC_LOCK"},
            ["IPC_LOCK", "SYS_ADMIN"],
            {"spec.containers[0].securityContext.capabilities.add[1]"},
        ),
        ("baseline", set(), ["IPC_LOCK"], {"spec.containers[0].securityContext.capabilities.add[0]"}),
        ("restricted", {"IPC_LOCK"}, ["IPC_LOCK", "NET_BIND_SERVICE"], set()),
        ("restricted", {"IPC_LOCK"}, ["IPC_LOCK", "CHOWN"], {"spec.containers[0].securityContext.capabilities.add[1]"}),
    ],
)
def test_extra_capabilities_are_allowed_on_top_of_the_level(
    level: str, extra: set[str], add: list[str], reported: set[str]
) -> None:
    base = restricted_spec() if level == "restricted" else baseline_spec()
    s = mutated(base, {"containers[0].securityContext.capabilities.add": add})
    got = podsecurity.check(s, level, extra_capabilities=frozenset(extra))  # type: ignore[arg-type]
    assert fields(got) == reported
    if got:
        assert "IPC_LOCK" in got[0].description  # the message names what the tenant may add


@pytest.mark.parametrize(
    ("name", "canonical"),
    [("CAP_SYS_ADMIN", "SYS_ADMIN"), ("cap_bpf", "BPF"), ("Net_Raw", "NET_RAW"), ("ALL", "ALL"), ("CAP_", "")],
)
def test_capability_names_are_normalised(name: str, canonical: str) -> None:
    assert podsecurity.capability(name) == canonical


@pytest.mark.parametrize(
    ("changes", "reported"),
    [
        ({"containers[0].securityContext": ["privileged"]}, {"spec.containers[0].securityContext"}),
        (
            {"containers[0].securityContext.capabilities.add": "SYS_ADMIN"},
            {"spec.containers[0].securityContext.capabilities.add"},
        ),
        ({"volumes": {"name": "x"}}, {"spec.volumes"}),
        ({"securityContext": "root"}, {"spec.securityContext"}),
        ({"containers[0].ports[0]": 80}, {"spec.containers[0].ports[0]"}),
    ],
)
def test_fields_of_the_wrong_type_are_violations(changes: dict[str, Any], reported: set[str]) -> None:
    assert fields(podsecurity.check(mutated(baseline_spec(), changes), "baseline")) == reported


def test_an_unknown_level_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="privileged"):
        podsecurity.check(baseline_spec(), "privileged")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ Tandem's own rules (H-4)

P = "t"


def template(**changes: Any) -> dict[str, Any]:
    tpl = {
        "metadata": {
            "labels": {"team": "llm", "app.kubernetes.io/name": "pretrain"},
            "annotations": {"example.com/owner": "llm-team"},
        },
        "spec": baseline_spec(),
    }
    for path, value in changes.items():
        put(tpl, path, value)
    return tpl


def judged(tpl: dict[str, Any], **tenant: Any) -> set[str]:
    policy = TenantPolicy(name="t1", **tenant) if tenant else None
    return fields(validation.check_pod_template(json.dumps(tpl), P, policy))


# (id, template changes, tenant policy fields, fields reported)
TANDEM_REFUSED: list[tuple[str, dict[str, Any], dict[str, Any], set[str]]] = [
    *[
        (f"agent-owned {key}", {f"spec.{key}": value}, {}, {f"{P}.spec.{key}"})
        for key, value in (
            ("nodeName", "h100-r1-n1"),
            ("schedulerName", "default-scheduler"),
            ("priority", 0),
            ("priorityClassName", "system-node-critical"),
            ("preemptionPolicy", "PreemptLowerPriority"),
            ("schedulingGates", [{"name": "example.com/mine"}]),
            ("hostname", "worker-0"),
            ("subdomain", "svc"),
            ("activeDeadlineSeconds", 3600),
            ("overhead", {"cpu": "250m"}),
        )
    ],
    ("restartPolicy OnFailure", {"spec.restartPolicy": "OnFailure"}, {}, {f"{P}.spec.restartPolicy"}),
    ("restartPolicy Always", {"spec.restartPolicy": "Always"}, {}, {f"{P}.spec.restartPolicy"}),
    ("namespace", {"metadata.namespace": "kube-system"}, {}, {f"{P}.metadata.namespace"}),
    ("no containers", {"spec.containers": []}, {}, {f"{P}.spec.containers"}),
    (
        "nodeAffinity",
        {
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "x", "operator": "Exists"}]}]
            }
        },
        {},
        {f"{P}.spec.affinity.nodeAffinity"},
    ),
    (
        "podAntiAffinity",
        {
            "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"team": "llm"}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        },
        {},
        {f"{P}.spec.affinity.podAntiAffinity"},
    ),
    (
        "podAffinity",
        {
            "spec.affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "podAffinityTerm": {"topologyKey": "zone"}}
            ]
        },
        {},
        {f"{P}.spec.affinity.podAffinity"},
    ),
    (
        "topologySpreadConstraints",
        {
            "spec.topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule"}
            ]
        },
        {},
        {f"{P}.spec.topologySpreadConstraints"},
    ),
    (
        "pod-level GPU request",
        {"spec.resources.requests": {"nvidia.com/gpu": "8"}},
        {},
        {f"{P}.spec.resources.requests['nvidia.com/gpu']"},
    ),
    (
        "pod-level hugepages",
        {"spec.resources.requests": {"hugepages-2Mi": "1Gi"}},
        {},
        {f"{P}.spec.resources.requests['hugepages-2Mi']"},
    ),
    (
        "pod-level limit without request",
        {"spec.resources": {"requests": {"cpu": "96"}, "limits": {"cpu": "96", "memory": "1Ti"}}},
        {},
        {f"{P}.spec.resources.limits['memory']"},
    ),
    ("pod-level claims", {"spec.resources.claims": [{"name": "gpu"}]}, {}, {f"{P}.spec.resources.claims"}),
    ("ServiceAccount", {"spec.serviceAccountName": "cluster-admin-sa"}, {}, {f"{P}.spec.serviceAccountName"}),
    ("deprecated serviceAccount", {"spec.serviceAccount": "builder"}, {}, {f"{P}.spec.serviceAccount"}),
    (
        "ServiceAccount not in the tenant's list",
        {"spec.serviceAccountName": "default"},
        {"service_accounts": ["trainer"]},
        {f"{P}.spec.serviceAccountName"},
    ),
    ("RuntimeClass", {"spec.runtimeClassName": "nvidia"}, {}, {f"{P}.spec.runtimeClassName"}),
    (
        "RuntimeClass not in the tenant's list",
        {"spec.runtimeClassName": "runc"},
        {"runtime_classes": ["kata"]},
        {f"{P}.spec.runtimeClassName"},
    ),
    (
        "own ResourceClaim",
        {"spec.resourceClaims": [{"name": "gpus", "resourceClaimName": "someone-elses"}]},
        {},
        {f"{P}.spec.resourceClaims[0].resourceClaimName"},
    ),
    (
        "own claim template",
        {"spec.resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "mine"}]},
        {},
        {f"{P}.spec.resourceClaims[0].resourceClaimTemplateName"},
    ),
    (
        "dnsPolicy None",
        {"spec.dnsPolicy": "None", "spec.dnsConfig": {"nameservers": ["1.1.1.1"]}},
        {},
        {f"{P}.spec.dnsPolicy"},
    ),
    (
        "toleration of another team's taint",
        {
            "spec.tolerations[1]": {
                "key": "dedicated",
                "operator": "Equal",
                "value": "inference",
                "effect": "NoSchedule",
            }
        },
        {},
        {f"{P}.spec.tolerations[1].key"},
    ),
    (
        "toleration of every taint",
        {"spec.tolerations[1]": {"operator": "Exists"}},
        {},
        {f"{P}.spec.tolerations[1].key"},
    ),
    (
        "toleration not in the tenant's list",
        {},
        {"toleration_keys": ["example.com/training"]},
        {f"{P}.spec.tolerations[0].key"},
    ),
    *[
        (f"label {key}", {"metadata.labels": {"team": "llm", key: "x"}}, {}, {f"{P}.metadata.labels[{key!r}]"})
        for key in (
            "tandem.dev/job",
            "tandem.dev/attempt",
            "kueue.x-k8s.io/queue-name",
            "batch.kubernetes.io/job-name",
            "jobset.sigs.k8s.io/jobset-name",
            "node.kubernetes.io/exclude",
            "kubernetes.io/hostname",
            "k8s.io/x",
            "app.kubernetes.io/managed-by",
        )
    ],
    (
        "annotation kubernetes.io",
        {"metadata.annotations": {"kubernetes.io/description": "x"}},
        {},
        {f"{P}.metadata.annotations['kubernetes.io/description']"},
    ),
]

TANDEM_ALLOWED: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("restartPolicy Never (the agent's own value)", {"spec.restartPolicy": "Never"}, {}),
    (
        "pod-level cpu and memory requests (modelled)",
        {"spec.resources": {"requests": {"cpu": "96", "memory": "1Ti"}, "limits": {"memory": "1Ti"}}},
        {},
    ),
    ("the default ServiceAccount", {"spec.serviceAccountName": "default"}, {}),
    ("an allowed ServiceAccount", {"spec.serviceAccountName": "trainer"}, {"service_accounts": ["default", "trainer"]}),
    ("an allowed RuntimeClass", {"spec.runtimeClassName": "kata"}, {"runtime_classes": ["kata"]}),
    ("any toleration with *", {"spec.tolerations[1]": {"operator": "Exists"}}, {"toleration_keys": ["*"]}),
    (
        "user and recommended labels",
        {
            "metadata.labels": {
                "team": "llm",
                "example.com/cost-center": "42",
                "app.kubernetes.io/component": "worker",
                "x-k8s.io/y": "z",
            }
        },
        {},
    ),
    ("dnsPolicy ClusterFirst", {"spec.dnsPolicy": "ClusterFirst"}, {}),
    ("empty agent-owned fields", {"spec.nodeName": "", "spec.schedulingGates": []}, {}),
]


@pytest.mark.parametrize(
    ("changes", "tenant", "reported"), [c[1:] for c in TANDEM_REFUSED], ids=[c[0] for c in TANDEM_REFUSED]
)
def test_tandem_rules_refuse(changes: dict[str, Any], tenant: dict[str, Any], reported: set[str]) -> None:
    assert judged(template(**changes), **tenant) == reported


@pytest.mark.parametrize(("changes", "tenant"), [c[1:] for c in TANDEM_ALLOWED], ids=[c[0] for c in TANDEM_ALLOWED])
def test_tandem_rules_allow(changes: dict[str, Any], tenant: dict[str, Any]) -> None:
    assert judged(template(**changes), **tenant) == set()


@pytest.mark.parametrize(
    ("key", "domain"),
    [
        ("tandem.dev/job", "tandem.dev"),
        ("gpu.tandem.dev/x", "tandem.dev"),
        ("kubernetes.io/hostname", "kubernetes.io"),
        ("node.kubernetes.io/x", "kubernetes.io"),
        ("topology.k8s.io/zone", "k8s.io"),
        ("batch.kubernetes.io/job-name", "kubernetes.io"),
        ("kueue.x-k8s.io/queue-name", "kueue.x-k8s.io"),
        ("jobset.sigs.k8s.io/jobset-name", "k8s.io"),
        ("Node.Kubernetes.IO/x", "kubernetes.io"),
        ("app.kubernetes.io/managed-by", "kubernetes.io"),
        ("app.kubernetes.io/name", None),
        ("x-k8s.io/y", None),
        ("example.com/kubernetes.io", None),
        ("notkubernetes.io/x", None),
        ("team", None),
        ("kubernetes.io", None),
        ("tandem.devx/y", None),
        ("kubectl.kubernetes.io/default-container", None),
        ("kubectl.kubernetes.io/last-applied-configuration", "kubernetes.io"),
    ],
)
def test_reserved_key_rule(key: str, domain: str | None) -> None:
    assert validation.reserved_key(key) == domain


def test_a_template_copied_from_a_running_pod_is_refused_for_what_the_agent_owns() -> None:
    """Server-defaulted pods from a cluster: their Pod Security is fine; what refuses them is scheduler,
    priority, the tolerations DefaultTolerationSeconds added, and a claim of their own."""
    for pod in fixture_json("pending-pods.json")["items"]:
        tpl = {"metadata": {"labels": pod["metadata"].get("labels") or {}}, "spec": pod["spec"]}
        got = {f.removeprefix(f"{P}.spec.") for f in judged(tpl)}
        names = {t.get("key") for t in pod["spec"]["tolerations"]}
        expected = {"schedulerName", "priority", "preemptionPolicy"}
        expected |= {
            f"tolerations[{i}].key"
            for i, t in enumerate(pod["spec"]["tolerations"])
            if t.get("key") != "nvidia.com/gpu"
        }
        expected |= {
            f"resourceClaims[{i}].resourceClaimName" for i, _ in enumerate(pod["spec"].get("resourceClaims", []))
        }
        assert got == expected, (pod["metadata"]["name"], names)


def test_the_shipped_example_job_template_passes() -> None:
    job = yaml.safe_load((REPO / "examples" / "job-torchrun-rack.yaml").read_text())
    (ps,) = job["podSets"]
    assert validation.check_pod_template(json.dumps(ps["template"]), P) == []


def test_check_untrusted_covers_every_pod_set_and_the_jobs_labels() -> None:
    s = job_pb2.JobSpec()
    for name, tpl in (("workers", template()), ("launcher", template(**{"spec.hostNetwork": True}))):
        s.pod_sets.add(name=name, count=1, pod_template_json=json.dumps(tpl))
    s.labels["kueue.x-k8s.io/queue-name"] = "team-a"
    s.labels["team"] = "llm"
    s.annotations["tandem.dev/attempt"] = "3"
    got = fields(validation.check_untrusted(s, None, "spec"))
    assert got == {
        "spec.pod_sets[1].pod_template_json.spec.hostNetwork",
        "spec.labels['kueue.x-k8s.io/queue-name']",
        "spec.annotations['tandem.dev/attempt']",
    }


# ------------------------------------------------------------------------------------------- the policy file


def test_tenant_policy_defaults_and_normalisation() -> None:
    t = TenantPolicy(name="t")
    assert (t.pod_security, t.extra_capabilities, t.service_accounts, t.runtime_classes, t.toleration_keys) == (
        "baseline",
        [],
        ["default"],
        [],
        ["nvidia.com/gpu"],
    )
    assert TenantPolicy(name="t", extra_capabilities=["cap_ipc_lock", "SYS_NICE"]).extra_capabilities == [
        "IPC_LOCK",
        "SYS_NICE",
    ]
    with pytest.raises(ValidationError):
        TenantPolicy(name="t", pod_security="privileged")  # type: ignore[arg-type]


def test_the_example_policy_has_an_nccl_tenant() -> None:
    pol = parse_policy((REPO / "examples" / "policy.yaml").read_text())
    assert any("IPC_LOCK" in t.extra_capabilities for t in pol.doc.tenants)
    assert all(t.pod_security in podsecurity.LEVELS for t in pol.doc.tenants)


def _ipc_lock_template() -> str:
    return json.dumps(template(**{"spec.containers[0].securityContext.capabilities.add": ["IPC_LOCK"]}))


def test_a_reloaded_policy_changes_the_verdict(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    write_policy(path, {"tenants": [{"name": "llm"}]})
    pf = PolicyFile(path, check_interval_s=0.0)
    field = f"{P}.spec.containers[0].securityContext.capabilities.add[0]"
    assert fields(validation.check_pod_template(_ipc_lock_template(), P, pf.current().tenants["llm"])) == {field}
    write_policy(path, {"tenants": [{"name": "llm", "extra_capabilities": ["IPC_LOCK"]}]})
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert validation.check_pod_template(_ipc_lock_template(), P, pf.current().tenants["llm"]) == []


# --------------------------------------------------------------------------------------------- over gRPC

TPL = "items[0].spec.pod_sets[0].pod_template_json"


@pytest.fixture
async def broker(tmp_path: Path):  # type: ignore[no-untyped-def]
    b = await start_broker(
        tmp_path, policy=policy_doc(beta={"pod_security": "restricted", "extra_capabilities": ["IPC_LOCK"]})
    )
    yield b
    await b.close()


def _gang(tpl: dict[str, Any], tenant: str = "") -> job_pb2.JobSpec:
    s = spec(gpus=8)
    s.tenant = tenant
    tpl["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "8"}}
    for kind in ("initContainers", "ephemeralContainers"):
        tpl["spec"].pop(kind)
    s.pod_sets[0].pod_template_json = json.dumps(tpl)
    return s


async def _submit(b: Broker, who: str, s: job_pb2.JobSpec) -> tuple[str, set[str]]:
    req = svc.SubmitJobsRequest(job_set_id="s", validate_only=True)
    req.items.add(idempotency_key="k", spec=s)
    result = (await b.client(who).submit_raw(req)).results[0]
    if result.WhichOneof("result") == "valid":
        return "valid", set()
    bad = error_details_pb2.BadRequest()
    assert any(d.Unpack(bad) for d in result.error.details if d.Is(error_details_pb2.BadRequest.DESCRIPTOR))
    assert result.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], result.error.message
    return "invalid", {v.field for v in bad.field_violations}


async def test_each_tenant_is_judged_by_its_own_level_and_exceptions(broker: Broker) -> None:
    ipc = {"spec.containers[0].securityContext.capabilities.add": ["IPC_LOCK"]}
    add = f"{TPL}.spec.containers[0].securityContext.capabilities.add[0]"
    # alpha: baseline, no exceptions
    assert await _submit(broker, "alpha", _gang(template(**ipc))) == ("invalid", {add})
    assert await _submit(broker, "alpha", _gang(template())) == ("valid", set())
    # beta: restricted, IPC_LOCK allowed
    hardened = {"metadata": template()["metadata"], "spec": restricted_spec()}
    put(hardened, "spec.containers[0].securityContext.capabilities.add", ["IPC_LOCK"])
    assert await _submit(broker, "beta", _gang(copy.deepcopy(hardened))) == ("valid", set())
    verdict, got = await _submit(broker, "beta", _gang(template(**ipc)))
    assert verdict == "invalid" and add not in got
    assert f"{TPL}.spec.containers[0].securityContext.runAsNonRoot" in got
    # an admin submitting for a tenant gets that tenant's verdict
    assert await _submit(broker, "admin", _gang(copy.deepcopy(hardened), tenant="beta")) == ("valid", set())
    assert (await _submit(broker, "admin", _gang(copy.deepcopy(hardened), tenant="alpha")))[0] == "invalid"


async def test_reserved_keys_and_agent_owned_fields_are_named_over_grpc(broker: Broker) -> None:
    s = _gang(template(**{"metadata.labels": {"tandem.dev/job": "someone-elses-gang"}, "spec.dnsPolicy": "None"}))
    s.labels["kueue.x-k8s.io/queue-name"] = "q"
    assert await _submit(broker, "alpha", s) == (
        "invalid",
        {
            f"{TPL}.metadata.labels['tandem.dev/job']",
            f"{TPL}.spec.dnsPolicy",
            "items[0].spec.labels['kueue.x-k8s.io/queue-name']",
        },
    )
