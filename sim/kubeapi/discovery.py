"""Discovery documents (/api, /apis, APIResourceList per group/version) and /version.

Only the non-aggregated forms are served: a client asking for aggregated discovery
(`application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList`) gets these and falls
back, as it does against a server without aggregated discovery.
"""

from __future__ import annotations

from typing import Any

from sim.kubeapi.resources import RESOURCES, group_versions

__all__ = ["api_versions", "api_group", "api_group_list", "resource_list", "version_info"]

Obj = dict[str, Any]


def api_versions(server_address: str) -> Obj:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def api_group(group: str) -> Obj | None:
    versions = group_versions().get(group)
    if not group or versions is None:
        return None
    listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": listed, "preferredVersion": listed[0]}


def api_group_list() -> Obj:
    groups = []
    for group in group_versions():
        found = api_group(group)
        if found is not None:
            groups.append({k: v for k, v in found.items() if k not in ("kind", "apiVersion")})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def resource_list(group: str, version: str) -> Obj | None:
    entries: list[Obj] = []
    for r in RESOURCES:
        if r.group != group or r.version != version:
            continue
        entry: Obj = {
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": sorted(r.verbs),
        }
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        entries.append(entry)
        for sub in sorted(r.subresources):
            if sub == "binding":
                entries.append(
                    {
                        "name": f"{r.plural}/binding",
                        "singularName": "",
                        "namespaced": True,
                        "kind": "Binding",
                        "verbs": ["create"],
                    }
                )
            elif sub == "token":
                entries.append(
                    {
                        "name": f"{r.plural}/token",
                        "singularName": "",
                        "namespaced": True,
                        "group": "authentication.k8s.io",
                        "version": "v1",
                        "kind": "TokenRequest",
                        "verbs": ["create"],
                    }
                )
            else:
                entries.append(
                    {
                        "name": f"{r.plural}/{sub}",
                        "singularName": "",
                        "namespaced": r.namespaced,
                        "kind": r.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
    if not entries:
        return None
    group_version = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": entries}


def version_info(server_version: str) -> Obj:
    parts = server_version.lstrip("v").split(".")
    major, minor = parts[0], parts[1] if len(parts) > 1 else "0"
    return {
        "major": major,
        "minor": minor,
        "emulationMajor": major,
        "emulationMinor": minor,
        "minCompatibilityMajor": major,
        "minCompatibilityMinor": str(max(0, int(minor) - 1)),
        "gitVersion": server_version,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.25.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }
