"""Defaulting as the real types' SetDefaults_* functions do it, for the kinds Tandem writes and reads back.

Runs on every decoded object (create and update), before admission and validation, so a
client that reads its object back sees what it would see on a real cluster.
"""

from __future__ import annotations

import ipaddress
import random
from typing import Any

__all__ = ["ServiceIPs", "apply_defaults", "default_pod_spec"]

Obj = dict[str, Any]


def _default_container(container: Obj) -> None:
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    image = str(container.get("image") or "")
    if "imagePullPolicy" not in container and image:
        last = image.rsplit("/", 1)[-1]
        tagged = ":" in last and not last.endswith(":latest")
        container["imagePullPolicy"] = "IfNotPresent" if tagged or "@" in image else "Always"
    resources = container.setdefault("resources", {})
    limits = resources.get("limits") or {}
    if limits:
        requests = dict(resources.get("requests") or {})
        for name, value in limits.items():
            requests.setdefault(name, value)
        resources["requests"] = requests
    for port in container.get("ports") or []:
        port.setdefault("protocol", "TCP")


def default_pod_spec(spec: Obj) -> None:
    """SetDefaults_PodSpec and the container defaults (templates get these too)."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            _default_container(container)
    for toleration in spec.get("tolerations") or []:
        if toleration.get("operator") is None and "key" in toleration:
            toleration["operator"] = "Equal"


def _default_job(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
        spec["parallelism"] = 1
    spec.setdefault("parallelism", 1)
    if spec.get("backoffLimit") is None:
        spec["backoffLimit"] = 2147483647 if spec.get("backoffLimitPerIndex") is not None else 6
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    if "podReplacementPolicy" not in spec:
        spec["podReplacementPolicy"] = "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed"
    template = spec.setdefault("template", {})
    template.setdefault("metadata", {})
    default_pod_spec(template.setdefault("spec", {}))


def _default_service(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    spec.setdefault("internalTrafficPolicy", "Cluster")
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))


def _default_namespace(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("finalizers", ["kubernetes"])
    labels = obj["metadata"].setdefault("labels", {})
    labels.setdefault("kubernetes.io/metadata.name", obj["metadata"].get("name", ""))


def _default_rbac_binding(obj: Obj) -> None:
    for subject in obj.get("subjects") or []:
        if subject.get("kind") in ("User", "Group"):
            subject.setdefault("apiGroup", "rbac.authorization.k8s.io")


def _default_limit_range(obj: Obj) -> None:
    """SetDefaults_LimitRangeItem: default limit from max, default request from default, then from min."""
    for item in (obj.get("spec") or {}).get("limits") or []:
        if item.get("type") != "Container":
            continue
        default = item.setdefault("default", {})
        request = item.setdefault("defaultRequest", {})
        for key, value in (item.get("max") or {}).items():
            default.setdefault(key, value)
        for key, value in default.items():
            request.setdefault(key, value)
        for key, value in (item.get("min") or {}).items():
            request.setdefault(key, value)
        for key in ("default", "defaultRequest"):
            if not item[key]:
                item.pop(key)


def apply_defaults(kind: str, obj: Obj) -> None:
    """Default obj (a fresh, decoded object) in place."""
    if kind == "Pod":
        default_pod_spec(obj.setdefault("spec", {}))
    elif kind == "Job":
        _default_job(obj)
    elif kind == "Service":
        _default_service(obj)
    elif kind == "Namespace":
        _default_namespace(obj)
    elif kind == "PriorityClass":
        obj.setdefault("preemptionPolicy", "PreemptLowerPriority")
    elif kind in ("RoleBinding", "ClusterRoleBinding"):
        _default_rbac_binding(obj)
    elif kind == "Lease":
        obj.setdefault("spec", {})
    elif kind == "LimitRange":
        _default_limit_range(obj)


class ServiceIPs:
    """ClusterIP allocation from the default service CIDR (10.96.0.0/12), like the real allocator."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._used: set[str] = {"10.96.0.1"}
        self._net = ipaddress.ip_network("10.96.0.0/12")

    def allocate(self) -> str:
        while True:
            ip = str(self._net.network_address + self._rng.randrange(2, self._net.num_addresses - 1))
            if ip not in self._used:
                self._used.add(ip)
                return ip

    def release(self, ip: str) -> None:
        self._used.discard(ip)

    def assign(self, service: Obj, *, reserve: bool = True) -> None:
        """Fill clusterIP/clusterIPs and the IP family fields of a new Service (headless keeps None).

        A dry run shows an address without reserving it."""
        spec = service.setdefault("spec", {})
        if spec.get("type") == "ExternalName":
            return
        ip = spec.get("clusterIP")
        if ip in (None, ""):
            ip = self.allocate()
            if not reserve:
                self.release(ip)
        elif ip != "None" and reserve:
            self._used.add(str(ip))
        spec["clusterIP"] = ip
        spec["clusterIPs"] = [ip]
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
