"""Pod statuses as a kubelet writes them, for the kubelet stand-in (pure).

Shapes follow what ``kubectl get pod -o json`` shows on a real node: phase, host and pod IPs,
``startTime``, the five pod conditions, and per-container ``state`` (``waiting`` /
``running`` / ``terminated``), ``ready``, ``started``, ``restartCount``, ``containerID``.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "micro_time",
    "running_status",
    "waiting_status",
    "terminated_status",
    "restarted_status",
    "killed_status",
    "container_names",
]

JSON = dict[str, Any]
POD_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")


def _t(epoch_s: float) -> str:
    return datetime.datetime.fromtimestamp(int(epoch_s), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(epoch_s: float) -> str:
    """``metav1.MicroTime``: exactly six fractional digits."""
    return datetime.datetime.fromtimestamp(epoch_s, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def container_names(pod: Mapping[str, Any]) -> list[str]:
    return [str(c["name"]) for c in (pod.get("spec") or {}).get("containers") or []]


def _containers(pod: Mapping[str, Any]) -> list[JSON]:
    return list((pod.get("spec") or {}).get("containers") or [])


def _container_id(pod: Mapping[str, Any], name: str, restarts: int = 0) -> str:
    return "containerd://" + _digest(str((pod.get("metadata") or {}).get("uid")), name, str(restarts))


def _image_id(image: str) -> str:
    """``repo@sha256:<digest>``: the tag dropped (a registry port in the host part is kept)."""
    head, _, last = image.split("@")[0].rpartition("/")
    repo = f"{head}/{last.split(':')[0]}" if head else last.split(":")[0]
    return f"{repo}@sha256:{_digest(image)}"


def _conditions(pod: Mapping[str, Any], now: float, values: Mapping[str, tuple[str, str, str]]) -> list[JSON]:
    """Conditions in kubelet order; lastTransitionTime kept while a condition's status is unchanged."""
    old = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
    out = []
    for ctype in POD_CONDITIONS:
        status, reason, message = values.get(ctype, ("True", "", ""))
        prev = old.get(ctype) or {}
        cond: JSON = {
            "type": ctype,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": prev.get("lastTransitionTime") if prev.get("status") == status else _t(now),
        }
        if reason:
            cond["reason"] = reason
        if message:
            cond["message"] = message
        out.append(cond)
    return out


def _base(pod: Mapping[str, Any], phase: str, host_ip: str, pod_ip: str | None, now: float) -> JSON:
    old = pod.get("status") or {}
    status: JSON = {
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": old.get("startTime") or _t(now),
    }
    if pod_ip:
        status["podIP"] = pod_ip
        status["podIPs"] = [{"ip": pod_ip}]
    if old.get("qosClass"):
        status["qosClass"] = old["qosClass"]
    return status


def _not_ready(names: Sequence[str], reason: str = "ContainersNotReady") -> tuple[str, str, str]:
    return ("False", reason, f"containers with unready status: [{' '.join(names)}]")


def running_status(pod: Mapping[str, Any], host_ip: str, pod_ip: str, now: float) -> JSON:
    """Every container running and ready."""
    status = _base(pod, "Running", host_ip, pod_ip, now)
    status["conditions"] = _conditions(pod, now, {})
    started = _t(now)
    status["containerStatuses"] = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": _image_id(str(c.get("image", ""))),
            "containerID": _container_id(pod, c["name"]),
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": started}},
            "lastState": {},
        }
        for c in _containers(pod)
    ]
    inits = (pod.get("spec") or {}).get("initContainers") or []
    if inits:
        status["initContainerStatuses"] = [_init_done(pod, c, now) for c in inits]
    return status


def _init_done(pod: Mapping[str, Any], c: Mapping[str, Any], now: float) -> JSON:
    base: JSON = {
        "name": c["name"],
        "image": c.get("image", ""),
        "imageID": _image_id(str(c.get("image", ""))),
        "containerID": _container_id(pod, str(c["name"])),
        "restartCount": 0,
        "lastState": {},
    }
    if c.get("restartPolicy") == "Always":  # a sidecar keeps running
        return base | {"ready": True, "started": True, "state": {"running": {"startedAt": _t(now)}}}
    return base | {
        "ready": True,
        "started": False,
        "state": {
            "terminated": {
                "exitCode": 0,
                "reason": "Completed",
                "startedAt": _t(now),
                "finishedAt": _t(now),
                "containerID": base["containerID"],
            }
        },
    }


def waiting_status(
    pod: Mapping[str, Any], host_ip: str, now: float, reason: str = "ContainerCreating", message: str | None = None
) -> JSON:
    """Phase Pending with every container waiting (``ContainerCreating``, ``ErrImagePull``, ...)."""
    status = _base(pod, "Pending", host_ip, None, now)
    names = container_names(pod)
    creating = reason == "ContainerCreating"
    status["conditions"] = _conditions(
        pod,
        now,
        {
            "PodReadyToStartContainers": ("False", "", "") if creating else ("True", "", ""),
            "Ready": _not_ready(names),
            "ContainersReady": _not_ready(names),
        },
    )
    waiting: JSON = {"reason": reason}
    out = []
    for c in _containers(pod):
        w = dict(waiting)
        if message or not creating:
            w["message"] = message or _pull_message(reason, str(c.get("image", "")))
        out.append(
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"waiting": w},
                "lastState": {},
            }
        )
    status["containerStatuses"] = out
    return status


def _pull_message(reason: str, image: str) -> str:
    if reason == "ImagePullBackOff":
        return f'Back-off pulling image "{image}"'
    if reason == "ErrImagePull":
        return f'failed to pull and unpack image "{image}": failed to resolve reference "{image}": not found'
    return reason


def _terminated(
    pod: Mapping[str, Any],
    c: Mapping[str, Any],
    code: int,
    reason: str,
    now: float,
    started: str | None,
    message: str | None = None,
) -> JSON:
    cid = _container_id(pod, str(c["name"]))
    term: JSON = {
        "exitCode": code,
        "reason": reason,
        "startedAt": started or _t(now),
        "finishedAt": _t(now),
        "containerID": cid,
    }
    if message:
        term["message"] = message
    return {
        "name": c["name"],
        "image": c.get("image", ""),
        "imageID": _image_id(str(c.get("image", ""))),
        "containerID": cid,
        "ready": False,
        "started": False,
        "restartCount": 0,
        "state": {"terminated": term},
        "lastState": {},
    }


def _started_at(pod: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        running = (cs.get("state") or {}).get("running")
        if running:
            out[str(cs["name"])] = str(running.get("startedAt"))
    return out


def terminated_status(
    pod: Mapping[str, Any], host_ip: str, pod_ip: str | None, exit_codes: Mapping[str, int], now: float
) -> JSON:
    """All containers exited with the given codes: Succeeded if every code is 0, else Failed."""
    ok = all(exit_codes.get(n, 0) == 0 for n in container_names(pod))
    status = _base(pod, "Succeeded" if ok else "Failed", host_ip, pod_ip, now)
    done = ("False", "PodCompleted" if ok else "PodFailed", "")
    status["conditions"] = _conditions(
        pod, now, {"PodReadyToStartContainers": ("False", "", ""), "Ready": done, "ContainersReady": done}
    )
    started = _started_at(pod)
    status["containerStatuses"] = [
        _terminated(
            pod,
            c,
            exit_codes.get(c["name"], 0),
            "Completed" if exit_codes.get(c["name"], 0) == 0 else "Error",
            now,
            started.get(c["name"]),
        )
        for c in _containers(pod)
    ]
    return status


def restarted_status(
    pod: Mapping[str, Any], host_ip: str, pod_ip: str, exit_codes: Mapping[str, int], now: float
) -> JSON:
    """``restartPolicy`` OnFailure/Always: the exited containers are restarted in place (restartCount + 1)."""
    status = running_status(pod, host_ip, pod_ip, now)
    old = {cs.get("name"): cs for cs in (pod.get("status") or {}).get("containerStatuses") or []}
    started = _started_at(pod)
    for cs in status["containerStatuses"]:
        name = cs["name"]
        if name not in exit_codes:
            kept = old.get(name) or {}
            cs.update({k: kept[k] for k in ("state", "restartCount", "containerID") if k in kept})
            continue
        restarts = int((old.get(name) or {}).get("restartCount") or 0) + 1
        code = exit_codes[name]
        cs["lastState"] = {
            "terminated": {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": started.get(name) or _t(now),
                "finishedAt": _t(now),
                "containerID": (old.get(name) or {}).get("containerID", ""),
            }
        }
        cs["restartCount"] = restarts
        cs["containerID"] = _container_id(pod, name, restarts)
    return status


def killed_status(pod: Mapping[str, Any], host_ip: str, pod_ip: str | None, exit_code: int, now: float) -> JSON:
    """A graceful deletion finished: running containers exited with ``exit_code`` (143 = SIGTERM);
    containers that never started are reported as kubelet does (137, ``ContainerStatusUnknown``)."""
    started = _started_at(pod)
    codes: dict[str, int] = {}
    out = []
    for c in _containers(pod):
        name = str(c["name"])
        if name in started:
            codes[name] = exit_code
            out.append(_terminated(pod, c, exit_code, "Completed" if exit_code == 0 else "Error", now, started[name]))
        else:
            codes[name] = 137
            out.append(
                _terminated(
                    pod,
                    c,
                    137,
                    "ContainerStatusUnknown",
                    now,
                    None,
                    "The container could not be located when the pod was terminated",
                )
            )
    status = terminated_status(pod, host_ip, pod_ip, codes, now)
    status["containerStatuses"] = out
    return status
