"""DELETE as the generic registry does it: preconditions, graceful pod deletion, finalizers, GC policies.

An object with finalizers, or a bound pod deleted with a grace period, only gets
`deletionTimestamp` (MODIFIED); it goes (DELETED) once its finalizers are empty and its grace
period is 0. A repeated delete may only shorten the grace period. The propagation policy adds
the `orphan` or `foregroundDeletion` finalizer the garbage collector acts on; `batch/v1` Jobs
default to Orphan (with the real warning), everything else to Background.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from sim.kubeapi import errors
from sim.kubeapi.decoding import parse_json_body
from sim.kubeapi.objects import Call, Obj, clone, rfc3339
from sim.kubeapi.resources import ResourceType
from sim.kubeapi.selectors import parse_field_selector, parse_label_selector
from sim.kubeapi.state import ApiState

__all__ = ["DeleteOptions", "Deleter", "ORPHAN", "FOREGROUND"]

ORPHAN = "orphan"
FOREGROUND = "foregroundDeletion"
JOB_ORPHAN_WARNING = (
    "child pods are preserved by default when jobs are deleted; set propagationPolicy=Background "
    "to remove them or set propagationPolicy=Orphan to suppress this warning"
)
_POLICIES = ("Foreground", "Background", "Orphan")


@dataclasses.dataclass
class DeleteOptions:
    grace_period_s: int | None = None
    propagation: str | None = None
    precondition_uid: str | None = None
    precondition_rv: str | None = None
    dry_run: bool = False


def parse_delete_options(call: Call) -> DeleteOptions:
    body: Any = parse_json_body(call.body) if call.body.strip() else {}
    if not isinstance(body, dict):
        raise errors.bad_request("DeleteOptions must be a JSON object")
    opts = DeleteOptions(dry_run=call.dry_run or body.get("dryRun") == ["All"])
    grace = call.query.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
    if grace is not None:
        try:
            opts.grace_period_s = int(grace)
        except ValueError as e:
            raise errors.bad_request(f"invalid gracePeriodSeconds {grace!r}") from e
    policy = call.query.get("propagationPolicy", body.get("propagationPolicy"))
    orphan = call.query.get("orphanDependents", body.get("orphanDependents"))
    if policy is not None and orphan is not None:
        raise _invalid_options(
            "propagationPolicy", policy, "orphanDependents and deletionPropagation cannot be both set"
        )
    if orphan is not None:
        policy = "Orphan" if str(orphan).lower() in ("true", "1") else "Background"
    if policy is not None and policy not in _POLICIES:
        err = errors.ApiError(
            422,
            "Invalid",
            f'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Unsupported value: '
            f'"{policy}": supported values: "Foreground", "Background", "Orphan"',
            details={
                "group": "meta.k8s.io",
                "kind": "DeleteOptions",
                "causes": [
                    {
                        "reason": "FieldValueNotSupported",
                        "field": "propagationPolicy",
                        "message": f'Unsupported value: "{policy}": supported values: "Foreground", "Background", "Orphan"',
                    }
                ],
            },
        )
        raise err
    opts.propagation = policy
    pre = body.get("preconditions") or {}
    opts.precondition_uid = pre.get("uid")
    opts.precondition_rv = pre.get("resourceVersion")
    return opts


def _invalid_options(field: str, value: str, message: str) -> errors.ApiError:
    return errors.ApiError(
        422,
        "Invalid",
        f'DeleteOptions.meta.k8s.io "" is invalid: {field}: Forbidden: {message}',
        details={"group": "meta.k8s.io", "kind": "DeleteOptions"},
    )


class Deleter:
    """Deletion over one ApiState (used by the DELETE verbs and by the garbage collector)."""

    def __init__(self, state: ApiState) -> None:
        self.state = state

    def delete(self, call: Call, rt: ResourceType) -> tuple[int, Obj]:
        obj = self.state.store.get(rt.key, call.namespace, call.name)
        if obj is None:
            raise errors.not_found(rt.group, rt.plural, call.name)
        opts = parse_delete_options(call)
        if opts.propagation is None and rt.key == "batch/jobs":
            call.warnings.append(JOB_ORPHAN_WARNING)
        return self.delete_object(rt, obj, opts)

    def delete_collection(self, call: Call, rt: ResourceType) -> tuple[int, Obj]:
        labels = parse_label_selector(call.query.get("labelSelector"))
        fields = parse_field_selector(call.query.get("fieldSelector"), rt)
        opts = parse_delete_options(call)
        if opts.propagation is None and rt.key == "batch/jobs":
            call.warnings.append(JOB_ORPHAN_WARNING)
        items = []
        for obj in self.state.store.items(rt.key, call.namespace if rt.namespaced and call.namespace else None):
            if labels.matches(obj["metadata"].get("labels")) and fields.matches(obj):
                _, result = self.delete_object(rt, obj, dataclasses.replace(opts))
                items.append(result if result.get("kind") == rt.kind else obj)
        return 200, {
            "kind": rt.list_kind,
            "apiVersion": rt.api_version,
            "metadata": {"resourceVersion": str(self.state.store.rv)},
            "items": items,
        }

    def _grace(self, rt: ResourceType, obj: Obj, requested: int | None) -> int:
        """Only pods are deleted gracefully; unbound and terminal pods go at once."""
        if rt.kind != "Pod":
            return 0
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
            return 0
        if requested is not None:
            return max(0, requested)
        return int(spec.get("terminationGracePeriodSeconds", 30))

    def delete_object(self, rt: ResourceType, obj: Obj, opts: DeleteOptions) -> tuple[int, Obj]:
        meta = obj["metadata"]
        name = meta["name"]
        if opts.precondition_uid and opts.precondition_uid != meta.get("uid"):
            raise errors.conflict(
                rt.group,
                rt.plural,
                name,
                f"Precondition failed: UID in precondition: {opts.precondition_uid}, "
                f"UID in object meta: {meta.get('uid')}",
            )
        if opts.precondition_rv and opts.precondition_rv != meta.get("resourceVersion"):
            raise errors.conflict(
                rt.group,
                rt.plural,
                name,
                f"Precondition failed: ResourceVersion in precondition: {opts.precondition_rv}, "
                f"ResourceVersion in object meta: {meta.get('resourceVersion')}",
            )
        policy = opts.propagation or ("Orphan" if rt.key == "batch/jobs" else "Background")
        pending = bool(meta.get("deletionTimestamp"))
        finalizers = list(meta.get("finalizers") or [])
        if not pending or opts.propagation is not None:
            finalizers = [f for f in finalizers if f not in (ORPHAN, FOREGROUND)] + (
                [ORPHAN] if policy == "Orphan" else [FOREGROUND] if policy == "Foreground" else []
            )
            finalizers = list(dict.fromkeys(finalizers))
        grace = self._grace(rt, obj, opts.grace_period_s)
        now = self.state.now()
        if rt.kind == "Namespace":
            return self._terminate_namespace(rt, obj, opts)
        if pending:
            current = meta.get("deletionGracePeriodSeconds") or 0
            deadline = meta.get("deletionTimestamp")
            if grace < current:
                current, deadline = grace, rfc3339(now + dt.timedelta(seconds=grace))
            if not finalizers and current == 0:
                return self._remove(rt, obj, opts)
            if (
                finalizers == list(meta.get("finalizers") or [])
                and current == meta.get("deletionGracePeriodSeconds")
                and deadline == meta.get("deletionTimestamp")
            ):
                return 200, obj
            return 200, self._mark(rt, obj, finalizers, current, str(deadline), opts)
        if not finalizers and grace == 0:
            return self._remove(rt, obj, opts)
        return 200, self._mark(rt, obj, finalizers, grace, rfc3339(now + dt.timedelta(seconds=grace)), opts)

    def _mark(
        self, rt: ResourceType, obj: Obj, finalizers: list[str], grace: int, deadline: str, opts: DeleteOptions
    ) -> Obj:
        new: Obj = clone(obj)
        meta = new["metadata"]
        meta["deletionTimestamp"] = deadline
        meta["deletionGracePeriodSeconds"] = grace
        if finalizers:
            meta["finalizers"] = finalizers
        else:
            meta.pop("finalizers", None)
        if opts.dry_run:
            return new
        stored = self.state.store.put(rt.key, new, created=False)
        return stored

    def _remove(self, rt: ResourceType, obj: Obj, opts: DeleteOptions) -> tuple[int, Obj]:
        meta = obj["metadata"]
        if opts.dry_run:
            final = obj
        else:
            removed = self.state.store.remove(rt.key, meta.get("namespace") or "", meta["name"])
            assert removed is not None
            final = removed
            if rt.kind == "Service":
                self.state.service_ips.release(str((obj.get("spec") or {}).get("clusterIP")))
        if rt.return_deleted:
            return 200, final
        details: Obj = {"name": meta["name"]}
        if rt.group:
            details["group"] = rt.group
        details["kind"] = rt.plural
        details["uid"] = meta.get("uid")
        return 200, errors.status_success(None, details)

    def _terminate_namespace(self, rt: ResourceType, obj: Obj, opts: DeleteOptions) -> tuple[int, Obj]:
        """Namespaces only turn Terminating: finalizing them (deleting their content) is not implemented."""
        if obj["metadata"].get("deletionTimestamp"):
            return 200, obj
        new = clone(obj)
        new["metadata"]["deletionTimestamp"] = rfc3339(self.state.now())
        new["metadata"]["deletionGracePeriodSeconds"] = 0
        new["status"] = {"phase": "Terminating"}
        if opts.dry_run:
            return 200, new
        return 200, self.state.store.put(rt.key, new, created=False)
