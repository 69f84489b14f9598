"""The Pod Security Standards, baseline and restricted, as one rule set (kubernetes.io "Pod Security Standards").

The broker judges every untrusted pod template by its tenant's level *name* before anything reaches a
cluster (FLEET-NOTES H-1, H-2): an early INVALID_ARGUMENT naming each field, instead of a gang whose pods
the namespace's Pod Security admission refuses later. In the clusters the same levels are enforced by Pod
Security admission and the shipped ValidatingAdmissionPolicy; this module is the only Python copy.

Every control is one function registered in `CONTROLS` with the level that introduces it; `check` runs the
controls of the level and of the levels below it, over the pod spec and every container kind
(`containers`, `initContainers`, `ephemeralContainers`). Each violation names the exact field path.

Two departures from Pod Security admission, both from H-1:

* capability names are compared after stripping `CAP_` and upper-casing (`cap_sys_admin` is SYS_ADMIN);
* a tenant's `extra_capabilities` (e.g. IPC_LOCK for NCCL over InfiniBand) are allowed on top of the
  level's list. Such a tenant's namespaces enforce `privileged` and only warn / audit at the level, so
  for them this check is what holds the level (README, "Cluster manifests").

A field of the wrong JSON type (a list where an object belongs) is itself a violation: an untrusted
template is never read leniently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from broker.domain.errors import FieldViolation

__all__ = [
    "Level",
    "LEVELS",
    "CONTAINER_KINDS",
    "BASELINE_CAPABILITIES",
    "RESTRICTED_CAPABILITIES",
    "SAFE_SYSCTLS",
    "SELINUX_TYPES",
    "RESTRICTED_VOLUME_TYPES",
    "APPARMOR_ANNOTATION_PREFIX",
    "Control",
    "CONTROLS",
    "capability",
    "check",
]

Level = Literal["baseline", "restricted"]
LEVELS: tuple[Level, ...] = get_args(Level)
"""Weakest first: a level includes every control of the levels before it."""

CONTAINER_KINDS = ("containers", "initContainers", "ephemeralContainers")

BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
"""The only capabilities baseline lets a container add."""
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
"""The only capability restricted lets a container add (after dropping ALL)."""
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
        "net.ipv4.tcp_rmem",
        "net.ipv4.tcp_wmem",
    }
)
"""Namespaced sysctls isolated from other pods (the standards' list as of Kubernetes 1.32)."""
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
"""seLinuxOptions.type values baseline allows (user and role must stay unset)."""
RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "image",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
"""Volume sources restricted allows (`image` since 1.33)."""
APPARMOR_TYPES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
SECCOMP_RESTRICTED = frozenset({"RuntimeDefault", "Localhost"})
_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
_HOOKS = ("postStart", "preStop")
_HANDLERS = ("httpGet", "tcpSocket")


def capability(name: str) -> str:
    """A capability's canonical name: upper case, without the `CAP_` prefix (H-1)."""
    upper = name.upper()
    return upper[4:] if upper.startswith("CAP_") else upper


def _unset(value: Any) -> bool:
    return value is None


def _false_or_unset(value: Any) -> bool:
    return value is None or value is False


def _empty_or_unset(value: Any) -> bool:
    return value is None or value == ""


@dataclass
class _Pod:
    """What the controls read: the pod spec, its annotations, where they sit, and the tenant's allowances."""

    spec: Mapping[str, Any]
    path: str
    level: Level
    extra: frozenset[str]
    annotations: Mapping[str, Any]
    annotations_path: str
    shape: list[FieldViolation] = field(default_factory=list)
    """Wrong JSON types met on the way (reported once each)."""

    def obj(self, value: Any, path: str) -> Mapping[str, Any]:
        """An object field: {} when absent; a violation (and {}) when it is not an object."""
        if value is None:
            return {}
        if isinstance(value, Mapping):
            return value
        self.shape.append(FieldViolation(path, "must be an object"))
        return {}

    def items(self, value: Any, path: str) -> list[tuple[str, Any]]:
        """(path, item) of a list field: [] when absent; a violation (and []) when it is not a list."""
        if value is None:
            return []
        if isinstance(value, list):
            return [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        self.shape.append(FieldViolation(path, "must be a list"))
        return []

    def pod_sc(self) -> tuple[str, Mapping[str, Any]]:
        p = f"{self.path}.securityContext"
        return p, self.obj(self.spec.get("securityContext"), p)

    def containers(self) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """(path, container) of every container kind, in spec order."""
        for kind in CONTAINER_KINDS:
            for cpath, c in self.items(self.spec.get(kind), f"{self.path}.{kind}"):
                yield cpath, self.obj(c, cpath)

    def container_scs(self) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """(path, securityContext) of every container ({} where unset)."""
        for cpath, c in self.containers():
            p = f"{cpath}.securityContext"
            yield p, self.obj(c.get("securityContext"), p)

    def all_scs(self) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """The pod's securityContext, then every container's."""
        yield self.pod_sc()
        yield from self.container_scs()

    @property
    def windows(self) -> bool:
        """spec.os.name is windows: restricted's Linux-only controls do not apply."""
        os_ = self.spec.get("os")
        return isinstance(os_, Mapping) and os_.get("name") == "windows"


V = FieldViolation
ControlFn = Callable[[_Pod], Iterator[FieldViolation]]


@dataclass(frozen=True, slots=True)
class Control:
    """One control of the standards: its name there, the level that introduces it, the check."""

    name: str
    level: Level
    run: ControlFn


# ------------------------------------------------------------------------------------------- baseline


def _host_process(pod: _Pod) -> Iterator[FieldViolation]:
    for p, sc in pod.all_scs():
        wp = f"{p}.windowsOptions"
        value = pod.obj(sc.get("windowsOptions"), wp).get("hostProcess")
        if not _false_or_unset(value):
            yield V(f"{wp}.hostProcess", "Windows HostProcess containers are not allowed (must be false or unset)")


def _host_namespaces(pod: _Pod) -> Iterator[FieldViolation]:
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if not _false_or_unset(pod.spec.get(key)):
            yield V(f"{pod.path}.{key}", "sharing the host's namespaces is not allowed (must be false or unset)")


def _privileged(pod: _Pod) -> Iterator[FieldViolation]:
    for p, sc in pod.container_scs():
        if not _false_or_unset(sc.get("privileged")):
            yield V(f"{p}.privileged", "privileged containers are not allowed (must be false or unset)")


def _capabilities(pod: _Pod) -> Iterator[FieldViolation]:
    """Baseline: add only from its list; restricted: drop ALL, add only NET_BIND_SERVICE (Linux pods)."""
    restricted = pod.level == "restricted" and not pod.windows
    allowed = (RESTRICTED_CAPABILITIES if restricted else BASELINE_CAPABILITIES) | pod.extra
    level = "restricted" if restricted else "baseline"
    extra = f"; the tenant's extra capabilities: {', '.join(sorted(pod.extra))}" if pod.extra else ""
    what = ", ".join(sorted(RESTRICTED_CAPABILITIES if restricted else BASELINE_CAPABILITIES)) + extra
    for p, sc in pod.container_scs():
        cp = f"{p}.capabilities"
        caps = pod.obj(sc.get("capabilities"), cp)
        for ap, name in pod.items(caps.get("add"), f"{cp}.add"):
            if not isinstance(name, str) or capability(name) not in allowed:
                yield V(ap, f"capability {name!r} may not be added at the {level} level (allowed: {what})")
        if restricted:
            drops = [capability(d) for _, d in pod.items(caps.get("drop"), f"{cp}.drop") if isinstance(d, str)]
            if "ALL" not in drops:
                yield V(f"{cp}.drop", "must include ALL at the restricted level")


def _host_path(pod: _Pod) -> Iterator[FieldViolation]:
    for vp, vol in pod.items(pod.spec.get("volumes"), f"{pod.path}.volumes"):
        if not _unset(pod.obj(vol, vp).get("hostPath")):
            yield V(f"{vp}.hostPath", "hostPath volumes are not allowed")


def _host_ports(pod: _Pod) -> Iterator[FieldViolation]:
    for cpath, c in pod.containers():
        for pp, port in pod.items(c.get("ports"), f"{cpath}.ports"):
            value = pod.obj(port, pp).get("hostPort")
            if not (value is None or (type(value) is int and value == 0)):
                yield V(f"{pp}.hostPort", "host ports are not allowed (must be 0 or unset)")


def _host_probes(pod: _Pod) -> Iterator[FieldViolation]:
    """Probes and lifecycle hooks may not aim the kubelet at another host (Kubernetes 1.34+)."""
    for cpath, c in pod.containers():
        handlers = [(f"{cpath}.{k}", c.get(k)) for k in _PROBES]
        hooks = pod.obj(c.get("lifecycle"), f"{cpath}.lifecycle")
        handlers += [(f"{cpath}.lifecycle.{k}", hooks.get(k)) for k in _HOOKS]
        for hp, handler in handlers:
            h = pod.obj(handler, hp)
            for kind in _HANDLERS:
                kp = f"{hp}.{kind}"
                if not _empty_or_unset(pod.obj(h.get(kind), kp).get("host")):
                    yield V(f"{kp}.host", "probes and lifecycle hooks may not name a host (must be empty or unset)")


def _apparmor(pod: _Pod) -> Iterator[FieldViolation]:
    for p, sc in pod.all_scs():
        ap = f"{p}.appArmorProfile"
        kind = pod.obj(sc.get("appArmorProfile"), ap).get("type")
        if not (kind is None or kind in APPARMOR_TYPES):
            yield V(f"{ap}.type", "AppArmor profile must be RuntimeDefault, Localhost or unset")
    for key, value in pod.annotations.items():
        if isinstance(key, str) and key.startswith(APPARMOR_ANNOTATION_PREFIX):
            if not (value in ("", "runtime/default") or (isinstance(value, str) and value.startswith("localhost/"))):
                yield V(
                    f"{pod.annotations_path}[{key!r}]",
                    "AppArmor profile must be runtime/default, localhost/<profile> or empty",
                )


def _selinux(pod: _Pod) -> Iterator[FieldViolation]:
    for p, sc in pod.all_scs():
        sp = f"{p}.seLinuxOptions"
        opts = pod.obj(sc.get("seLinuxOptions"), sp)
        kind = opts.get("type")
        if not (kind is None or kind in SELINUX_TYPES):
            yield V(
                f"{sp}.type",
                "SELinux type must be container_t, container_init_t, container_kvm_t, container_engine_t or unset",
            )
        for key in ("user", "role"):
            if not _empty_or_unset(opts.get(key)):
                yield V(f"{sp}.{key}", f"a custom SELinux {key} is not allowed")


def _proc_mount(pod: _Pod) -> Iterator[FieldViolation]:
    for p, sc in pod.container_scs():
        value = sc.get("procMount")
        if not (value is None or value == "Default"):
            yield V(f"{p}.procMount", "the default /proc masks are required (procMount must be Default or unset)")


def _seccomp(pod: _Pod) -> Iterator[FieldViolation]:
    """Baseline: never Unconfined; restricted: RuntimeDefault or Localhost, on the pod or every container."""
    restricted = pod.level == "restricted" and not pod.windows
    pp, psc = pod.pod_sc()
    pod_type = pod.obj(psc.get("seccompProfile"), f"{pp}.seccompProfile").get("type")
    pod_ok = pod_type in SECCOMP_RESTRICTED
    need = "must be RuntimeDefault or Localhost at the restricted level"
    if pod_type == "Unconfined" or (restricted and pod_type is not None and not pod_ok):
        yield V(f"{pp}.seccompProfile.type", need if restricted else "the Unconfined seccomp profile is not allowed")
    for p, sc in pod.container_scs():
        kind = pod.obj(sc.get("seccompProfile"), f"{p}.seccompProfile").get("type")
        if kind == "Unconfined" and not restricted:
            yield V(f"{p}.seccompProfile.type", "the Unconfined seccomp profile is not allowed")
        elif restricted and kind is not None and kind not in SECCOMP_RESTRICTED:
            yield V(f"{p}.seccompProfile.type", need)
        elif restricted and kind is None and not pod_ok:
            yield V(f"{p}.seccompProfile.type", f"{need} (here or in {pp}.seccompProfile)")


def _sysctls(pod: _Pod) -> Iterator[FieldViolation]:
    pp, psc = pod.pod_sc()
    for sp, item in pod.items(psc.get("sysctls"), f"{pp}.sysctls"):
        name = pod.obj(item, sp).get("name")
        if name not in SAFE_SYSCTLS:
            yield V(f"{sp}.name", f"sysctl {name!r} is not in the safe set")


# ----------------------------------------------------------------------------------------- restricted


def _volume_types(pod: _Pod) -> Iterator[FieldViolation]:
    for vp, vol in pod.items(pod.spec.get("volumes"), f"{pod.path}.volumes"):
        for source in pod.obj(vol, vp):
            if source != "name" and source not in RESTRICTED_VOLUME_TYPES:
                yield V(
                    f"{vp}.{source}",
                    "volume type not allowed at the restricted level (only "
                    + ", ".join(sorted(RESTRICTED_VOLUME_TYPES))
                    + ")",
                )


def _privilege_escalation(pod: _Pod) -> Iterator[FieldViolation]:
    if pod.windows:
        return
    for p, sc in pod.container_scs():
        if sc.get("allowPrivilegeEscalation") is not False:
            yield V(f"{p}.allowPrivilegeEscalation", "must be false at the restricted level")


def _run_as_non_root(pod: _Pod) -> Iterator[FieldViolation]:
    pp, psc = pod.pod_sc()
    pod_value = psc.get("runAsNonRoot")
    if pod_value is not None and pod_value is not True:
        yield V(f"{pp}.runAsNonRoot", "must be true at the restricted level")
    for p, sc in pod.container_scs():
        value = sc.get("runAsNonRoot")
        if value is not None and value is not True:
            yield V(f"{p}.runAsNonRoot", "must be true at the restricted level")
        elif value is None and pod_value is not True:
            yield V(f"{p}.runAsNonRoot", f"must be true at the restricted level (here or in {pp})")


def _run_as_user(pod: _Pod) -> Iterator[FieldViolation]:
    for p, sc in pod.all_scs():
        value = sc.get("runAsUser")
        if value is not None and (type(value) is not int or value == 0):
            yield V(f"{p}.runAsUser", "must not be 0 (root) at the restricted level")


CONTROLS: tuple[Control, ...] = (
    Control("HostProcess", "baseline", _host_process),
    Control("Host Namespaces", "baseline", _host_namespaces),
    Control("Privileged Containers", "baseline", _privileged),
    Control("Capabilities", "baseline", _capabilities),
    Control("HostPath Volumes", "baseline", _host_path),
    Control("Host Ports", "baseline", _host_ports),
    Control("Host Probes / Lifecycle Hooks", "baseline", _host_probes),
    Control("AppArmor", "baseline", _apparmor),
    Control("SELinux", "baseline", _selinux),
    Control("/proc Mount Type", "baseline", _proc_mount),
    Control("Seccomp", "baseline", _seccomp),
    Control("Sysctls", "baseline", _sysctls),
    Control("Volume Types", "restricted", _volume_types),
    Control("Privilege Escalation", "restricted", _privilege_escalation),
    Control("Running as Non-root", "restricted", _run_as_non_root),
    Control("Running as Non-root user", "restricted", _run_as_user),
)
"""Every control, in the standards' order. Capabilities and Seccomp carry both levels' rules (the restricted
rule replaces the baseline one for the same field, so a field gets one violation)."""


def check(
    spec: Mapping[str, Any],
    level: Level,
    *,
    extra_capabilities: frozenset[str] = frozenset(),
    path: str = "spec",
    annotations: Mapping[str, Any] | None = None,
    annotations_path: str = "metadata.annotations",
) -> list[FieldViolation]:
    """Every violation of `level` in a pod spec (and its annotations, for AppArmor), one per field path.

    `extra_capabilities` are allowed on top of the level (compared as `capability` spells them)."""
    if level not in LEVELS:
        raise ValueError(f"unknown Pod Security level {level!r} (one of {', '.join(LEVELS)})")
    rank = LEVELS.index(level)
    pod = _Pod(
        spec,
        path,
        level,
        frozenset(capability(c) for c in extra_capabilities),
        annotations if isinstance(annotations, Mapping) else {},
        annotations_path,
    )
    found: list[FieldViolation] = []
    for control in CONTROLS:
        if LEVELS.index(control.level) <= rank:
            found.extend(control.run(pod))
    return _one_per_field([*pod.shape, *found])


def _one_per_field(violations: Sequence[FieldViolation]) -> list[FieldViolation]:
    seen: set[str] = set()
    out = []
    for v in violations:
        if v.field not in seen:
            seen.add(v.field)
            out.append(v)
    return out
