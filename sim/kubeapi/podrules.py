"""What an update may change in a Pod's spec (ValidatePodUpdate), including the gated-pod narrowing rules.

Every pod accepts new images, a shorter `activeDeadlineSeconds` and added tolerations. While
the pod still has scheduling gates (KEP-3838) it also accepts node-selector additions,
requirements appended to the existing required node-affinity terms (or any affinity if there
was none), any preferred affinity, and gate removals. Anything else is the real server's
"pod updates may not change fields other than ..." 422.
"""

from __future__ import annotations

import copy
from typing import Any

from sim.kubeapi.validation import Causes

__all__ = ["validate_pod_update", "validate_pod_status_update"]

Obj = dict[str, Any]

_UPDATABLE = ",".join(
    [
        "`spec.containers[*].image`",
        "`spec.initContainers[*].image`",
        "`spec.activeDeadlineSeconds`",
        "`spec.tolerations` (only additions to existing tolerations)",
        "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)",
    ]
)
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def _semantic(value: Any) -> Any:
    """Semantic equality as apimachinery sees it: an empty list or map equals an absent one."""
    if isinstance(value, dict):
        out = {k: _semantic(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, [], {})} if out else out
    if isinstance(value, list):
        return [_semantic(v) for v in value]
    return value


def _only_added_tolerations(new: list[Obj], old: list[Obj], causes: Causes) -> None:
    for old_tol in old:
        match = False
        for new_tol in new:
            same = {k: v for k, v in new_tol.items() if k != "tolerationSeconds"} == {
                k: v for k, v in old_tol.items() if k != "tolerationSeconds"
            }
            if same:
                old_s, new_s = old_tol.get("tolerationSeconds"), new_tol.get("tolerationSeconds")
                if old_s is None or (new_s is not None and new_s <= old_s):
                    match = True
                    break
        if not match:
            causes.forbidden("spec.tolerations", "existing toleration can not be modified except its tolerationSeconds")
            return


def _term_only_adds(new: Obj, old: Obj) -> bool:
    for field in ("matchExpressions", "matchFields"):
        old_reqs, new_reqs = old.get(field) or [], new.get(field) or []
        if len(old_reqs) > len(new_reqs) or new_reqs[: len(old_reqs)] != old_reqs:
            return False
    return True


def _node_affinity_mutation(new_na: Obj | None, old_na: Obj | None, causes: Causes) -> None:
    if not old_na or old_na.get(_REQUIRED) is None:
        return
    old_terms = (old_na.get(_REQUIRED) or {}).get("nodeSelectorTerms") or []
    new_terms = ((new_na or {}).get(_REQUIRED) or {}).get("nodeSelectorTerms") or []
    if not old_terms:
        return
    path = f"spec.affinity.nodeAffinity.{_REQUIRED}.nodeSelectorTerms"
    if len(old_terms) != len(new_terms):
        causes.invalid(path, new_terms, "no additions/deletions to non-empty NodeSelectorTerms list are allowed")
        return
    for i, (new_term, old_term) in enumerate(zip(new_terms, old_terms)):
        if not _term_only_adds(new_term, old_term):
            causes.invalid(f"{path}[{i}]", new_term, "only additions are allowed (no mutations or deletions)")


def validate_pod_update(new: Obj, old: Obj, causes: Causes) -> None:
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    munged = copy.deepcopy(new_spec)
    for key in ("containers", "initContainers"):
        old_list, new_list = old_spec.get(key) or [], munged.get(key) or []
        if len(old_list) == len(new_list):
            for c_new, c_old in zip(new_list, old_list):
                if "image" in c_old:
                    c_new["image"] = c_old["image"]
    ads_new, ads_old = new_spec.get("activeDeadlineSeconds"), old_spec.get("activeDeadlineSeconds")
    if ads_new is not None:
        if ads_old is not None and ads_old < ads_new:
            causes.invalid("spec.activeDeadlineSeconds", ads_new, "must be less than or equal to previous value")
            return
    elif ads_old is not None:
        causes.invalid("spec.activeDeadlineSeconds", None, "must not update from a positive integer to nil value")
    munged.pop("activeDeadlineSeconds", None)
    if ads_old is not None:
        munged["activeDeadlineSeconds"] = ads_old
    _only_added_tolerations(new_spec.get("tolerations") or [], old_spec.get("tolerations") or [], causes)
    munged["tolerations"] = old_spec.get("tolerations") or []
    old_gates = {g.get("name") for g in old_spec.get("schedulingGates") or []}
    for i, gate in enumerate(new_spec.get("schedulingGates") or []):
        if gate.get("name") not in old_gates:
            causes.forbidden(
                f"spec.schedulingGates[{i}].name",
                f"only deletion is allowed, but found new scheduling gate '{gate.get('name')}'",
            )
    munged["schedulingGates"] = old_spec.get("schedulingGates") or []
    tgps_old = old_spec.get("terminationGracePeriodSeconds")
    if tgps_old is not None and tgps_old < 0 and new_spec.get("terminationGracePeriodSeconds") == 1:
        munged["terminationGracePeriodSeconds"] = tgps_old
    if old_spec.get("schedulingGates"):
        old_sel, new_sel = old_spec.get("nodeSelector") or {}, new_spec.get("nodeSelector") or {}
        if any(new_sel.get(k) != v for k, v in old_sel.items()):
            causes.invalid(
                "spec.nodeSelector",
                new_sel,
                "only additions to spec.nodeSelector are allowed (no mutations or deletions)",
            )
        munged["nodeSelector"] = old_sel
        old_na = (old_spec.get("affinity") or {}).get("nodeAffinity")
        new_affinity = munged.get("affinity")
        _node_affinity_mutation((new_affinity or {}).get("nodeAffinity"), old_na, causes)
        if new_affinity is None and old_na is not None:
            munged["affinity"] = {"nodeAffinity": old_na}
        elif new_affinity is not None and old_spec.get("affinity") is None and set(new_affinity) <= {"nodeAffinity"}:
            munged.pop("affinity")
        elif new_affinity is not None:
            new_affinity.pop("nodeAffinity", None)
            if old_na is not None:
                new_affinity["nodeAffinity"] = old_na
    if _semantic(munged) != _semantic(old_spec):
        changed = sorted(
            k for k in set(munged) | set(old_spec) if _semantic(munged.get(k)) != _semantic(old_spec.get(k))
        )
        causes.forbidden(
            "spec",
            f"pod updates may not change fields other than {_UPDATABLE}\n"
            f"  core.PodSpec{{ fields changed: {', '.join(changed)} }}",
        )


def validate_pod_status_update(new: Obj, old: Obj, causes: Causes) -> None:
    """ValidatePodStatusUpdate: a pod never leaves a terminal phase."""
    old_phase = (old.get("status") or {}).get("phase")
    new_phase = (new.get("status") or {}).get("phase")
    if old_phase in ("Succeeded", "Failed") and new_phase != old_phase:
        causes.forbidden(
            "status.phase", f"cannot transition from terminal phase {old_phase!r} to {new_phase!r}".replace("'", '"')
        )
