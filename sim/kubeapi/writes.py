"""Create, update, patch and bind: the write path of the registry (decode, default, admit, validate, store).

Order as in the real server: decode → defaults → mutating admission → name generation and
system fields → validation → ResourceQuota → storage. `dryRun=All` runs every step but the last.
Status subresources write only `.status`; the main resource never writes it.
"""

from __future__ import annotations

import datetime as dt

import orjson

from sim.kubeapi import admission, errors, kinds
from sim.kubeapi.decoding import decode_object, media_type, parse_json_body
from sim.kubeapi.defaults import apply_defaults
from sim.kubeapi.objects import Call, Obj, clone, rfc3339, set_condition
from sim.kubeapi.patch import PatchError, UnsupportedPatch, json_patch, merge_patch, strategic_merge_patch
from sim.kubeapi.resources import ResourceType, by_path
from sim.kubeapi.schema import root_node
from sim.kubeapi.state import ApiState
from sim.kubeapi.validation import Causes

__all__ = ["Writer"]

_PATCH_TYPES = (
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
)
_GENERATE_ATTEMPTS = 8
JOB_NAME = "batch.kubernetes.io/job-name"
LEGACY_JOB_NAME = "job-name"
CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
LEGACY_CONTROLLER_UID = "controller-uid"


def _qos(spec: Obj) -> str:
    """GetPodQOS: only cpu and memory count; Guaranteed needs both limited with requests equal to limits."""
    any_set = False
    guaranteed = True
    for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        for r in ("cpu", "memory"):
            if r in req or r in lim:
                any_set = True
            if r not in lim or req.get(r, lim.get(r)) != lim.get(r):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


class Writer:
    """The write verbs over one ApiState."""

    def __init__(self, state: ApiState) -> None:
        self.state = state

    # -- create -------------------------------------------------------------------------

    def create(self, call: Call, rt: ResourceType) -> tuple[int, Obj]:
        obj = decode_object(call, rt)
        meta = obj["metadata"]
        if rt.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and body_ns != call.namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = call.namespace
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise errors.bad_request("resourceVersion should not be set on objects to be created")
        return self.create_decoded(rt, obj, dry_run=call.dry_run)

    def create_decoded(self, rt: ResourceType, obj: Obj, *, dry_run: bool = False) -> tuple[int, Obj]:
        """Create a decoded object (also used to seed built-in and manifest objects)."""
        store = self.state.store
        apply_defaults(rt.kind, obj)
        admission.admit_create(store, rt, obj)
        meta = obj["metadata"]
        generated = not meta.get("name") and bool(meta.get("generateName"))
        for attempt in range(_GENERATE_ATTEMPTS):
            if generated:
                meta["name"] = f"{meta['generateName']}{self.state.random_suffix()}"
            if store.get(rt.key, meta.get("namespace") or "", meta.get("name") or "") is None:
                break
            if not generated or attempt == _GENERATE_ATTEMPTS - 1:
                raise errors.already_exists(rt.group, rt.plural, meta.get("name") or "")
        self._prepare_create(rt, obj)
        causes = kinds.validate_create(rt, obj)
        if causes:
            raise errors.invalid(rt.group, rt.kind, meta.get("name") or "", causes.items)
        if rt.namespaced:
            admission.check_quota(store, rt, obj)
        if rt.kind == "Service":
            self.state.service_ips.assign(obj, reserve=not dry_run)
        if dry_run:
            return 201, obj
        stored = store.put(rt.key, obj, created=True)
        self._after_create(rt, stored)
        return 201, stored

    def _prepare_create(self, rt: ResourceType, obj: Obj) -> None:
        meta = obj["metadata"]
        for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "managedFields"):
            meta.pop(key, None)
        meta["uid"] = self.state.new_uid()
        meta["creationTimestamp"] = rfc3339(self.state.now())
        if rt.generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        if rt.clear_status_on_create and "status" in rt.subresources:
            obj["status"] = {}
        if rt.kind == "Pod":
            self._initial_pod_status(obj)
        elif rt.kind == "Job":
            _generate_job_selector(obj)
        elif rt.kind == "Namespace":
            obj["status"] = {"phase": "Active"}
        elif rt.kind == "Service":
            obj["status"] = {"loadBalancer": {}}

    def _initial_pod_status(self, pod: Obj) -> None:
        spec = pod.get("spec") or {}
        status: Obj = {"phase": "Pending", "qosClass": _qos(spec)}
        if spec.get("schedulingGates") and not spec.get("nodeName"):
            set_condition(
                status,
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "lastProbeTime": None,
                    "lastTransitionTime": rfc3339(self.state.now()),
                    "reason": "SchedulingGated",
                    "message": "Scheduling is blocked due to non-empty scheduling gates",
                },
            )
        pod["status"] = status

    def _after_create(self, rt: ResourceType, obj: Obj) -> None:
        if rt.kind == "Namespace":
            sa_rt = _resource("", "serviceaccounts")
            name = obj["metadata"]["name"]
            if self.state.store.get(sa_rt.key, name, "default") is None:
                self.create_decoded(
                    sa_rt,
                    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": name}},
                )

    # -- update and patch --------------------------------------------------------------

    def update(self, call: Call, rt: ResourceType) -> tuple[int, Obj]:
        obj = decode_object(call, rt)
        meta = obj["metadata"]
        if meta.get("name") and meta["name"] != call.name:
            raise errors.bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL ({call.name})"
            )
        meta["name"] = call.name
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != call.namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = call.namespace
        existing = self.state.store.get(rt.key, call.namespace, call.name)
        if existing is None:
            if rt.create_on_update and not call.subresource:
                meta.pop("resourceVersion", None)
                return self.create_decoded(rt, obj, dry_run=call.dry_run)
            raise errors.not_found(rt.group, rt.plural, call.name)
        rv = meta.get("resourceVersion")
        if rv and rv != existing["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.group, rt.plural, call.name, errors.STALE)
        return self.commit_update(rt, existing, obj, call.subresource, dry_run=call.dry_run)

    def patch(self, call: Call, rt: ResourceType) -> tuple[int, Obj]:
        kind = media_type(call.content_type)
        if kind not in _PATCH_TYPES[:3]:
            raise errors.unsupported_media_type(kind, _PATCH_TYPES[:3])
        existing = self.state.store.get(rt.key, call.namespace, call.name)
        if existing is None:
            raise errors.not_found(rt.group, rt.plural, call.name)
        patch = parse_json_body(call.body)
        base = clone(existing)
        try:
            if kind == "application/json-patch+json":
                patched = json_patch(base, patch)
            elif kind == "application/merge-patch+json":
                if not isinstance(patch, dict):
                    raise PatchError("a merge patch must be a JSON object")
                patched = merge_patch(base, patch)
            else:
                patched = strategic_merge_patch(base, patch, root_node(rt.group, rt.version, rt.kind))
        except UnsupportedPatch as e:
            raise errors.ApiError(415, "UnsupportedMediaType", f"strategic merge patch: {e}", details={}) from e
        except PatchError as e:
            raise errors.ApiError(
                422, "Invalid", "the server rejected our request due to an error in our request", details={}
            ) from e
        obj = decode_object(call, rt, patched, patched=True)
        meta = obj["metadata"]
        if meta.get("name") != call.name or (rt.namespaced and meta.get("namespace") != call.namespace):
            raise errors.bad_request("the name of the object does not match the name on the URL")
        rv = meta.get("resourceVersion")
        if rv and rv != existing["metadata"]["resourceVersion"]:
            raise errors.conflict(rt.group, rt.plural, call.name, errors.STALE)
        return self.commit_update(rt, existing, obj, call.subresource, dry_run=call.dry_run)

    def commit_update(
        self, rt: ResourceType, old: Obj, new: Obj, subresource: str, *, dry_run: bool = False
    ) -> tuple[int, Obj]:
        """Everything after the object is decoded: default, reset what this endpoint may not write, validate, store.

        An update that changes nothing is not written (no new resourceVersion, no event), as in etcd3's store."""
        if subresource != "status":
            apply_defaults(rt.kind, new)
        new = self._prepare_update(rt, old, new, subresource)
        causes = (
            kinds.validate_status_update(rt, new, old)
            if subresource == "status"
            else kinds.validate_update(rt, new, old)
        )
        self._check_meta_update(new, old, causes.items)
        if causes:
            raise errors.invalid(rt.group, rt.kind, new["metadata"]["name"], causes.items)
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if orjson.dumps(new, option=orjson.OPT_SORT_KEYS) == orjson.dumps(old, option=orjson.OPT_SORT_KEYS):
            return 200, old
        if rt.generation and new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = int(old["metadata"].get("generation") or 0) + 1
        if dry_run:
            return 200, new
        if finished_deleting(new):
            # Like the registry's errEmptiedFinalizers: no MODIFIED, the object goes (DELETED).
            final = self.state.store.remove(rt.key, new["metadata"].get("namespace") or "", new["metadata"]["name"])
            result = final if final is not None else new
        else:
            result = self.state.store.put(rt.key, new, created=False)
        return 200, result

    def _prepare_update(self, rt: ResourceType, old: Obj, new: Obj, subresource: str) -> Obj:
        if subresource == "status":
            merged = dict(old)
            merged["status"] = new.get("status", {})
            merged["metadata"] = dict(old["metadata"])
            return merged
        new = dict(new)
        if "status" in rt.subresources:
            if "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
        meta = dict(new["metadata"])
        old_meta = old["metadata"]
        if not meta.get("uid"):
            meta["uid"] = old_meta["uid"]
        for key in ("creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        new["metadata"] = meta
        return new

    @staticmethod
    def _check_meta_update(new: Obj, old: Obj, causes: list[errors.Cause]) -> None:
        extra = Causes()
        if new["metadata"].get("uid") != old["metadata"].get("uid"):
            extra.invalid("metadata.uid", new["metadata"].get("uid"), "field is immutable")
        if old["metadata"].get("deletionTimestamp"):
            added = [
                f for f in new["metadata"].get("finalizers") or [] if f not in (old["metadata"].get("finalizers") or [])
            ]
            if added:
                listed = ", ".join(f'"{f}"' for f in added)
                extra.forbidden(
                    "metadata.finalizers",
                    f"no new finalizers can be added if the object is being deleted, found new finalizers "
                    f"[]string{{{listed}}}",
                )
        causes.extend(extra.items)

    # -- pods/binding ------------------------------------------------------------------

    def bind(self, call: Call, rt: ResourceType) -> tuple[int, Obj]:
        body = parse_json_body(call.body)
        if not isinstance(body, dict):
            raise errors.bad_request("a Binding must be a JSON object")
        target = body.get("target") or {}
        pod = self.state.store.get(rt.key, call.namespace, call.name)
        if pod is None:
            raise errors.not_found("", "pods", call.name)
        name = call.name
        why = None
        if target.get("kind", "Node") not in ("Node", "") or not target.get("name"):
            causes = [errors.Cause("FieldValueRequired", "Required value", "target.name")]
            raise errors.invalid("", "Binding", name, causes)
        uid = (body.get("metadata") or {}).get("uid")
        if uid and uid != pod["metadata"]["uid"]:
            why = f"Precondition failed: UID in precondition: {uid}, UID in object meta: {pod['metadata']['uid']}"
        elif pod["metadata"].get("deletionTimestamp"):
            why = f"pod {name} is being deleted, cannot be assigned to a host"
        elif (pod.get("spec") or {}).get("nodeName"):
            why = f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"'
        elif (pod.get("spec") or {}).get("schedulingGates"):
            why = f"pod {name} has non-empty .spec.schedulingGates"
        if why is not None:
            raise errors.conflict("", "pods/binding", name, why)
        if call.dry_run:
            return 201, errors.status_success(201)
        new = clone(pod)
        new["spec"]["nodeName"] = target["name"]
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        if annotations:
            new["metadata"].setdefault("annotations", {}).update(annotations)
        status = new.setdefault("status", {})
        set_condition(
            status,
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": rfc3339(self.state.now()),
            },
        )
        self.state.store.put(rt.key, new, created=False)
        return 201, errors.status_success(201)

    # -- serviceaccounts/token ---------------------------------------------------------

    def token_request(self, call: Call, rt: ResourceType) -> tuple[int, Obj]:
        """TokenRequest (`kubectl create token`): a bearer token of an existing ServiceAccount.

        The fake does not expire tokens; `expirationTimestamp` is reported as requested."""
        if self.state.store.get(rt.key, call.namespace, call.name) is None:
            raise errors.not_found("", "serviceaccounts", call.name)
        body = parse_json_body(call.body) if call.body.strip() else {}
        spec = dict((body or {}).get("spec") or {}) if isinstance(body, dict) else {}
        seconds = int(spec.get("expirationSeconds") or 3600)
        if seconds < 600:
            raise errors.invalid(
                "authentication.k8s.io",
                "TokenRequest",
                call.name,
                [
                    errors.Cause(
                        "FieldValueInvalid",
                        f"Invalid value: {seconds}: may not specify a duration less than 10 minutes",
                        "spec.expirationSeconds",
                    )
                ],
            )
        spec.setdefault("audiences", ["https://kubernetes.default.svc.cluster.local"])
        spec["expirationSeconds"] = seconds
        token = "" if call.dry_run else self.state.mint_service_account_token(call.namespace, call.name)
        expires = rfc3339(self.state.now() + dt.timedelta(seconds=seconds))
        return 201, {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": call.name, "namespace": call.namespace, "creationTimestamp": None},
            "spec": spec,
            "status": {"token": token, "expirationTimestamp": expires},
        }


def finished_deleting(obj: Obj) -> bool:
    """Deleting, no finalizers left, no grace period pending: the write removes the object instead."""
    meta = obj["metadata"]
    return (
        bool(meta.get("deletionTimestamp"))
        and not meta.get("finalizers")
        and meta.get("deletionGracePeriodSeconds") == 0
        and not (obj.get("spec") or {}).get("finalizers")
    )


def _generate_job_selector(job: Obj) -> None:
    """The Job strategy's generateSelector: job-name and controller-uid labels, selector on the uid."""
    spec = job.setdefault("spec", {})
    if spec.get("manualSelector"):
        return
    meta = job["metadata"]
    labels = spec.setdefault("template", {}).setdefault("metadata", {}).setdefault("labels", {})
    for key in (LEGACY_JOB_NAME, JOB_NAME):
        labels.setdefault(key, meta["name"])
    for key in (LEGACY_CONTROLLER_UID, CONTROLLER_UID):
        labels.setdefault(key, meta["uid"])
    selector = spec.setdefault("selector", {})
    selector.setdefault("matchLabels", {}).setdefault(CONTROLLER_UID, meta["uid"])


def _resource(group: str, plural: str) -> ResourceType:
    found = by_path(group, "v1", plural)
    assert found is not None
    return found
