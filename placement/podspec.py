"""Pod JSON (as `kubectl get -o json` prints it) to a PodShape, with requests computed as kube-scheduler does."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any

from placement.errors import PodSpecError, QuantityError
from placement.model import (
    GPU_PRODUCT_LABEL,
    WHOLE_GPU_MILLI,
    DraRequest,
    LabelRequirement,
    PodShape,
    Toleration,
)
from placement.quantity import cpu_milli, parse_quantity, to_int_bytes

__all__ = [
    "GPU_RESOURCE",
    "GPU_MILLI_RESOURCE",
    "MIG_RESOURCE_PREFIX",
    "mig_profile_of",
    "NODE_NAME_FIELD",
    "ClaimResolver",
    "shape_from_pod",
    "pod_requests",
    "holds_resources",
    "requests_from_claim",
]

GPU_RESOURCE = "nvidia.com/gpu"
GPU_MILLI_RESOURCE = "tandem.dev/gpu-milli"
"""Fractional GPU share in thousandths of ONE device (1..1000); alone it means one shared GPU."""
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
NODE_NAME_FIELD = "metadata.name"
"""LabelRequirement key used for node-affinity matchFields on the node name (fit checks node.name)."""

# Resources kube-scheduler tracks that the core does not model: ignored, never "extended".
_IGNORED = {"ephemeral-storage", "pods"}

ClaimResolver = Mapping[str, Sequence[DraRequest]] | Callable[[str], Sequence[DraRequest]]
"""ResourceClaim name (or ResourceClaimTemplate name) -> the claim's device requests."""

Requests = dict[str, Fraction]


def _obj(value: Any, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PodSpecError(field, f"expected an object, got {type(value).__name__}")
    return value


def _list(value: Any, field: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise PodSpecError(field, f"expected a list, got {type(value).__name__}")
    return value


def _quantity(value: Any, field: str) -> Fraction:
    """A non-negative quantity (the API server rejects negative requests)."""
    try:
        q = parse_quantity(value)
    except QuantityError as exc:
        raise PodSpecError(field, str(exc)) from exc
    if q < 0:
        raise PodSpecError(field, f"must not be negative, got {value!r}")
    return q


def _resources(container: Mapping[str, Any], field: str) -> Requests:
    """A container's requests; an extended resource given only as a limit is requested at the limit
    (the API server defaults requests from limits)."""
    res = _obj(container.get("resources"), f"{field}.resources")
    out: Requests = {}
    for part in ("limits", "requests"):  # requests override limits
        for name, value in _obj(res.get(part), f"{field}.resources.{part}").items():
            out[name] = _quantity(value, f"{field}.resources.{part}.{name}")
    return out


def _add(into: Requests, more: Mapping[str, Fraction]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, Fraction(0)) + v


def _max(into: Requests, other: Mapping[str, Fraction]) -> None:
    for k, v in other.items():
        if v > into.get(k, Fraction(0)):
            into[k] = v


def pod_requests(pod: Mapping[str, Any]) -> Requests:
    """Effective requests of a pod, as kube-scheduler computes them (component-helpers PodRequests):
    containers summed; init containers as a running max; restartable (sidecar) init containers
    added to both; pod-level spec.resources for cpu/memory when set; overhead added."""
    spec = _obj(pod.get("spec"), "spec")
    total: Requests = {}
    for i, c in enumerate(_list(spec.get("containers"), "spec.containers")):
        _add(total, _resources(_obj(c, f"spec.containers[{i}]"), f"spec.containers[{i}]"))
    sidecars: Requests = {}
    init_max: Requests = {}
    for i, c in enumerate(_list(spec.get("initContainers"), "spec.initContainers")):
        field = f"spec.initContainers[{i}]"
        c = _obj(c, field)
        reqs = _resources(c, field)
        if c.get("restartPolicy") == "Always":
            _add(total, reqs)
            _add(sidecars, reqs)
            effective = dict(sidecars)
        else:
            effective = dict(reqs)
            _add(effective, sidecars)
        _max(init_max, effective)
    _max(total, init_max)
    pod_level = _obj(_obj(spec.get("resources"), "spec.resources").get("requests"), "spec.resources.requests")
    for name in ("cpu", "memory"):
        if name in pod_level:
            total[name] = _quantity(pod_level[name], f"spec.resources.requests.{name}")
    overhead: Requests = {}
    for name, value in _obj(spec.get("overhead"), "spec.overhead").items():
        overhead[name] = _quantity(value, f"spec.overhead.{name}")
    _add(total, overhead)
    return total


def _count(value: Fraction, field: str) -> int:
    if value.denominator != 1 or value < 0:
        raise PodSpecError(field, f"must be a non-negative whole number, got {value}")
    return int(value)


def _tolerations(spec: Mapping[str, Any]) -> tuple[Toleration, ...]:
    out = []
    for i, t in enumerate(_list(spec.get("tolerations"), "spec.tolerations")):
        t = _obj(t, f"spec.tolerations[{i}]")
        out.append(
            Toleration(
                key=str(t.get("key") or ""),
                operator=str(t.get("operator") or "Equal"),
                value=str(t.get("value") or ""),
                effect=str(t.get("effect") or ""),
            )
        )
    return tuple(out)


def _affinity(spec: Mapping[str, Any]) -> tuple[tuple[LabelRequirement, ...], ...]:
    node_aff = _obj(_obj(spec.get("affinity"), "spec.affinity").get("nodeAffinity"), "spec.affinity.nodeAffinity")
    base = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = _obj(node_aff.get("requiredDuringSchedulingIgnoredDuringExecution"), base)
    terms = []
    for i, term in enumerate(_list(required.get("nodeSelectorTerms"), f"{base}.nodeSelectorTerms")):
        tfield = f"{base}.nodeSelectorTerms[{i}]"
        term = _obj(term, tfield)
        reqs: list[LabelRequirement] = []
        for kind in ("matchExpressions", "matchFields"):
            for j, e in enumerate(_list(term.get(kind), f"{tfield}.{kind}")):
                e = _obj(e, f"{tfield}.{kind}[{j}]")
                key, op = e.get("key"), e.get("operator")
                if not isinstance(key, str) or not isinstance(op, str):
                    raise PodSpecError(f"{tfield}.{kind}[{j}]", "key and operator must be strings")
                values = tuple(str(v) for v in _list(e.get("values"), f"{tfield}.{kind}[{j}].values"))
                reqs.append(LabelRequirement(NODE_NAME_FIELD if kind == "matchFields" else key, op, values))
        terms.append(tuple(reqs))
    return tuple(terms)


Terms = tuple[tuple[LabelRequirement, ...], ...]


def _models(selector: dict[str, str], affinity: Terms) -> tuple[frozenset[str], Terms]:
    """GPU models a pod allows, from nodeSelector / required affinity on nvidia.com/gpu.product.

    The product constraint is lifted out of the nodeSelector (and out of a single affinity term)
    so that fit reports GPU_MODEL_MISMATCH rather than a bare selector mismatch; with several
    terms the affinity stays as written and the models are their union. When the constraints
    contradict each other nothing is lifted (the selectors then refuse every node).
    """
    allowed: set[str] | None = None
    if GPU_PRODUCT_LABEL in selector:
        allowed = {selector[GPU_PRODUCT_LABEL]}
    new_affinity = affinity
    if len(affinity) == 1:
        (term,) = affinity
        ins = [r for r in term if r.key == GPU_PRODUCT_LABEL and r.operator == "In"]
        if ins:
            lifted = set.intersection(*(set(r.values) for r in ins))
            allowed = lifted if allowed is None else allowed & lifted
            rest = tuple(r for r in term if r not in ins)
            new_affinity = (rest,) if rest else ()
    elif affinity:
        union: set[str] = set()
        for term in affinity:
            sets = [set(r.values) for r in term if r.key == GPU_PRODUCT_LABEL and r.operator == "In"]
            if not sets:
                break  # some term allows any model
            union |= set.intersection(*sets)
        else:
            allowed = union if allowed is None else allowed & union
    if not allowed:  # None: no constraint; empty: contradictory, leave the selectors to refuse
        return frozenset(), affinity
    selector.pop(GPU_PRODUCT_LABEL, None)
    return frozenset(allowed), new_affinity


def mig_profile_of(resource: str) -> str | None:
    """The MIG profile a mixed-strategy extended resource stands for: "nvidia.com/mig-1g.10gb.me" ->
    "1g.10gb+me" (the device plugin writes "+" as "."; `mig.resource_name` is the inverse). None for
    any other resource."""
    if not resource.startswith(MIG_RESOURCE_PREFIX):
        return None
    profile = resource[len(MIG_RESOURCE_PREFIX) :]
    return profile[: -len(".me")] + "+me" if profile.endswith(".me") else profile


def _claim_names(pod: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    status = _obj(pod.get("status"), "status")
    generated = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in _list(status.get("resourceClaimStatuses"), "status.resourceClaimStatuses")
        if isinstance(s, Mapping)
    }
    names = []
    for i, rc in enumerate(_list(spec.get("resourceClaims"), "spec.resourceClaims")):
        rc = _obj(rc, f"spec.resourceClaims[{i}]")
        name = rc.get("resourceClaimName") or generated.get(str(rc.get("name"))) or rc.get("resourceClaimTemplateName")
        if not isinstance(name, str) or not name:
            raise PodSpecError(f"spec.resourceClaims[{i}]", "needs resourceClaimName or resourceClaimTemplateName")
        names.append(name)
    return names


def shape_from_pod(pod: Mapping[str, Any], claims: ClaimResolver | None = None) -> PodShape:
    """The PodShape of one pod. `claims` resolves each spec.resourceClaims entry (by the
    ResourceClaim's name, the generated name from status, or else the template name) to its
    device requests; raises PodSpecError naming the field on malformed input or unknown claims."""
    if not isinstance(pod, Mapping):
        raise PodSpecError("pod", "expected a JSON object")
    spec = _obj(pod.get("spec"), "spec")
    reqs = pod_requests(pod)
    gpus = 0
    gpu_milli = WHOLE_GPU_MILLI
    mig_profile: str | None = None
    mig_count = 0
    extended: list[tuple[str, int]] = []
    for name, value in sorted(reqs.items()):
        field = f"requests.{name}"
        if name in ("cpu", "memory") or name in _IGNORED or name.startswith("hugepages-"):
            continue
        if name == GPU_RESOURCE:
            gpus = _count(value, field)
        elif name == GPU_MILLI_RESOURCE:
            gpu_milli = _count(value, field)
            if not 0 < gpu_milli <= WHOLE_GPU_MILLI:
                raise PodSpecError(field, f"must be 1..{WHOLE_GPU_MILLI}, got {gpu_milli}")
        elif name.startswith(MIG_RESOURCE_PREFIX):
            n = _count(value, field)
            if n == 0:
                continue
            if mig_profile is not None:
                raise PodSpecError(field, "more than one MIG profile in one pod is not supported")
            mig_profile, mig_count = mig_profile_of(name), n
        else:
            n = _count(value, field)
            if n:
                extended.append((name, n))
    if GPU_MILLI_RESOURCE in reqs:
        if gpus:
            raise PodSpecError(f"requests.{GPU_MILLI_RESOURCE}", f"cannot be combined with {GPU_RESOURCE}")
        gpus = 1
    if mig_profile is not None and gpus:
        raise PodSpecError(f"requests.{GPU_RESOURCE}", "cannot be combined with a MIG resource")
    dra: list[DraRequest] = []
    for claim in _claim_names(pod, spec):
        try:
            found = claims(claim) if callable(claims) else (claims or {})[claim]
        except KeyError as exc:
            raise PodSpecError("spec.resourceClaims", f"claim {claim!r} is not known") from exc
        dra.extend(found)
    selector_raw = _obj(spec.get("nodeSelector"), "spec.nodeSelector")
    selector = {str(k): str(v) for k, v in selector_raw.items()}
    models, affinity = _models(selector, _affinity(spec))
    return PodShape(
        gpus=gpus,
        gpu_milli=gpu_milli,
        gpu_models=models,
        mig_profile=mig_profile,
        mig_count=mig_count,
        dra=tuple(dra),
        cpu_milli=cpu_milli(reqs.get("cpu", Fraction(0))),
        memory=to_int_bytes(reqs.get("memory", Fraction(0))),
        extended=tuple(extended),
        tolerations=_tolerations(spec),
        node_selector=tuple(sorted(selector.items())),
        affinity=affinity,
    )


def holds_resources(pod: Mapping[str, Any]) -> bool:
    """Whether a pod counts against its node: bound and not Succeeded/Failed (terminating pods
    still hold theirs until they are gone, as kube-scheduler counts them)."""
    spec = pod.get("spec")
    status = pod.get("status")
    if not isinstance(spec, Mapping) or not spec.get("nodeName"):
        return False
    phase = status.get("phase") if isinstance(status, Mapping) else None
    return phase not in ("Succeeded", "Failed")


def requests_from_claim(claim: Mapping[str, Any]) -> tuple[DraRequest, ...]:
    """Device requests of a ResourceClaim (resource.k8s.io/v1) or of a template's spec.spec.

    "exactly" requests are used as is; for "firstAvailable" the first alternative is taken;
    allocationMode "All" is refused (PodSpecError) because the core cannot count it ahead.
    """
    spec = _obj(claim.get("spec"), "spec")
    if "spec" in spec:  # ResourceClaimTemplate
        spec = _obj(spec.get("spec"), "spec.spec")
    devices = _obj(spec.get("devices"), "spec.devices")
    out = []
    for i, r in enumerate(_list(devices.get("requests"), "spec.devices.requests")):
        field = f"spec.devices.requests[{i}]"
        r = _obj(r, field)
        if "exactly" in r:
            body, bfield = _obj(r.get("exactly"), f"{field}.exactly"), f"{field}.exactly"
        else:
            alts = _list(r.get("firstAvailable"), f"{field}.firstAvailable")
            if not alts:
                raise PodSpecError(field, "needs exactly or firstAvailable")
            body, bfield = _obj(alts[0], f"{field}.firstAvailable[0]"), f"{field}.firstAvailable[0]"
        cls = body.get("deviceClassName")
        if not isinstance(cls, str) or not cls:
            raise PodSpecError(f"{bfield}.deviceClassName", "required")
        if body.get("allocationMode", "ExactCount") != "ExactCount":
            raise PodSpecError(f"{bfield}.allocationMode", "only ExactCount is supported")
        count = body.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise PodSpecError(f"{bfield}.count", f"must be a positive integer, got {count!r}")
        selectors = []
        for j, s in enumerate(_list(body.get("selectors"), f"{bfield}.selectors")):
            expr = _obj(_obj(s, f"{bfield}.selectors[{j}]").get("cel"), f"{bfield}.selectors[{j}].cel").get(
                "expression"
            )
            if not isinstance(expr, str):
                raise PodSpecError(f"{bfield}.selectors[{j}].cel.expression", "required string")
            selectors.append(expr)
        out.append(DraRequest(cls, tuple(selectors), count))
    return tuple(out)
