"""What the scheduler stand-in reads from a KubeSchedulerConfiguration, and kube-scheduler's arithmetic.

The shipped ``manifests/base/scheduler-config.yaml`` holds the configuration inside a ConfigMap;
this module finds it, merges the profile's score plugins with kube-scheduler's defaults, and
holds the pure parts of a cycle that follow from it: the combined score, the host choice and
the "0/N nodes are available" message.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "DEFAULT_SCORE_WEIGHTS",
    "ExtenderSettings",
    "SchedulerProfile",
    "load_profile",
    "profile_from_config",
    "parse_duration",
    "combine_scores",
    "select_host",
    "fit_error_message",
    "no_preemption_message",
    "MAX_EXTENDER_PRIORITY",
]

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10

DEFAULT_SCORE_WEIGHTS: dict[str, int] = {
    "TaintToleration": 3,
    "NodeAffinity": 2,
    "NodeResourcesFit": 1,
    "VolumeBinding": 1,
    "PodTopologySpread": 2,
    "InterPodAffinity": 2,
    "NodeResourcesBalancedAllocation": 1,
    "ImageLocality": 1,
}
"""kube-scheduler's default score plugins and weights (v1 configuration, 1.3x)."""

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """A Go duration (``"2s"``, ``"500ms"``, ``"1m30s"``) in seconds."""
    text = text.strip()
    if text in ("0", ""):
        return 0.0
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNIT[m.group(2)]
        pos = m.end()
    if pos != len(text):
        raise ValueError(f"not a duration: {text!r}")
    return total


@dataclasses.dataclass(frozen=True)
class ExtenderSettings:
    """One ``extenders`` entry; ``path_prefix`` is the path part of ``urlPrefix`` (the host is given separately)."""

    path_prefix: str = ""
    filter_verb: str = "filter"
    prioritize_verb: str = "prioritize"
    preempt_verb: str = ""
    weight: int = 1
    http_timeout_s: float = 30.0
    node_cache_capable: bool = False
    ignorable: bool = False
    managed_resources: tuple[str, ...] = ()
    url_prefix: str = ""
    """The configured ``urlPrefix`` as written (for messages)."""

    def url(self, base: str, verb: str) -> str:
        """``{base}{path_prefix}/{verb}`` with ``base`` = scheme://host:port."""
        return f"{base.rstrip('/')}{self.path_prefix.rstrip('/')}/{verb}"

    def interested(self, pod: Mapping[str, Any]) -> bool:
        """``HTTPExtender.IsInterested``: every pod when managedResources is empty, else pods asking for one."""
        if not self.managed_resources:
            return True
        spec = pod.get("spec") or {}
        for c in list(spec.get("containers") or []) + list(spec.get("initContainers") or []):
            res = c.get("resources") or {}
            names = set(res.get("requests") or {}) | set(res.get("limits") or {})
            if names & set(self.managed_resources):
                return True
        return False


@dataclasses.dataclass(frozen=True)
class SchedulerProfile:
    """The parts of one profile the stand-in implements."""

    scheduler_name: str = "default-scheduler"
    score_weights: Mapping[str, int] = dataclasses.field(default_factory=lambda: dict(DEFAULT_SCORE_WEIGHTS))
    fit_strategy: str = "LeastAllocated"
    fit_resources: tuple[tuple[str, int], ...] = (("cpu", 1), ("memory", 1))
    fit_ignored: frozenset[str] = frozenset()
    """NodeResourcesFitArgs.ignoredResources: extended resources the filter leaves to an extender."""
    fit_ignored_groups: frozenset[str] = frozenset()
    """NodeResourcesFitArgs.ignoredResourceGroups: prefixes (before "/") of such resources."""
    extenders: tuple[ExtenderSettings, ...] = ()
    percentage_of_nodes_to_score: int = 0


def _merge_score_plugins(plugins: Mapping[str, Any]) -> dict[str, int]:
    """Defaults, minus ``disabled`` (names or ``*``), plus ``enabled`` (weights override, order kept)."""
    score = plugins.get("score") or {}
    weights = dict(DEFAULT_SCORE_WEIGHTS)
    for p in score.get("disabled") or []:
        if p.get("name") == "*":
            weights.clear()
        else:
            weights.pop(str(p.get("name")), None)
    for p in score.get("enabled") or []:
        name = str(p["name"])
        weights[name] = int(p.get("weight") or DEFAULT_SCORE_WEIGHTS.get(name, 1))
    return weights


def _extender(raw: Mapping[str, Any]) -> ExtenderSettings:
    url = str(raw.get("urlPrefix", ""))
    m = re.match(r"^[a-z]+://[^/]*(?P<path>/.*)?$", url)
    path = (m.group("path") or "") if m else url
    timeout = raw.get("httpTimeout")
    return ExtenderSettings(
        path_prefix=path.rstrip("/"),
        filter_verb=str(raw.get("filterVerb") or ""),
        prioritize_verb=str(raw.get("prioritizeVerb") or ""),
        preempt_verb=str(raw.get("preemptVerb") or ""),
        weight=int(raw.get("weight") or 1),
        http_timeout_s=parse_duration(str(timeout)) if timeout else 30.0,
        node_cache_capable=bool(raw.get("nodeCacheCapable", False)),
        ignorable=bool(raw.get("ignorable", False)),
        managed_resources=tuple(str(r.get("name")) for r in raw.get("managedResources") or []),
        url_prefix=url,
    )


def profile_from_config(config: Mapping[str, Any], scheduler_name: str | None = None) -> SchedulerProfile:
    """The named profile (default: the first) of a KubeSchedulerConfiguration, with its extenders."""
    profiles = list(config.get("profiles") or [{"schedulerName": "default-scheduler"}])
    chosen = next((p for p in profiles if p.get("schedulerName") == scheduler_name), None) if scheduler_name else None
    if chosen is None and scheduler_name:
        raise ValueError(f"no profile for scheduler {scheduler_name!r}")
    prof = chosen or profiles[0]
    strategy = "LeastAllocated"
    resources: tuple[tuple[str, int], ...] = (("cpu", 1), ("memory", 1))
    ignored: frozenset[str] = frozenset()
    ignored_groups: frozenset[str] = frozenset()
    for pc in prof.get("pluginConfig") or []:
        if pc.get("name") == "NodeResourcesFit":
            args = pc.get("args") or {}
            ignored = frozenset(str(r) for r in args.get("ignoredResources") or [])
            ignored_groups = frozenset(str(g) for g in args.get("ignoredResourceGroups") or [])
            s = args.get("scoringStrategy") or {}
            strategy = str(s.get("type") or strategy)
            if s.get("resources"):
                resources = tuple((str(r["name"]), int(r.get("weight") or 1)) for r in s["resources"])
    return SchedulerProfile(
        scheduler_name=str(prof.get("schedulerName") or "default-scheduler"),
        score_weights=_merge_score_plugins(prof.get("plugins") or {}),
        fit_strategy=strategy,
        fit_resources=resources,
        fit_ignored=ignored,
        fit_ignored_groups=ignored_groups,
        extenders=tuple(_extender(e) for e in config.get("extenders") or []),
        percentage_of_nodes_to_score=int(config.get("percentageOfNodesToScore") or 0),
    )


def load_profile(path: Path, scheduler_name: str | None = None) -> SchedulerProfile:
    """Read a KubeSchedulerConfiguration file, or the one inside a ConfigMap in a manifest file."""
    for doc in yaml.safe_load_all(path.read_text()):
        if not isinstance(doc, dict):
            continue
        if doc.get("kind") == "KubeSchedulerConfiguration":
            return profile_from_config(doc, scheduler_name)
        if doc.get("kind") == "ConfigMap":
            for text in (doc.get("data") or {}).values():
                inner = yaml.safe_load(text)
                if isinstance(inner, dict) and inner.get("kind") == "KubeSchedulerConfiguration":
                    return profile_from_config(inner, scheduler_name)
    raise ValueError(f"{path}: no KubeSchedulerConfiguration found")


def combine_scores(
    plugin_scores: Mapping[str, Mapping[str, int]],
    weights: Mapping[str, int],
    extender_scores: Iterable[tuple[Mapping[str, int], int]],
    nodes: Sequence[str],
) -> dict[str, int]:
    """Σ plugin score × weight, plus Σ extender score × extender weight × (MaxNodeScore / MaxExtenderPriority)."""
    total = {n: 0 for n in nodes}
    for plugin, scores in plugin_scores.items():
        w = weights.get(plugin, 0)
        for n in nodes:
            total[n] += scores.get(n, 0) * w
    for scores, w in extender_scores:
        for n in nodes:
            total[n] += scores.get(n, 0) * w * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
    return total


def select_host(totals: Mapping[str, int], order: Sequence[str], rng: random.Random) -> str:
    """The highest total; ties go by reservoir sampling over ``order`` like ``selectHost`` (seeded)."""
    best, chosen, ties = None, "", 0
    for name in order:
        score = totals[name]
        if best is None or score > best:
            best, chosen, ties = score, name, 1
        elif score == best:
            ties += 1
            if rng.randrange(ties) == 0:
                chosen = name
    if best is None:
        raise ValueError("no nodes to select from")
    return chosen


def fit_error_message(
    num_all_nodes: int,
    node_reasons: Mapping[str, Sequence[str]],
    absent_reasons: Sequence[str] = (),
    prefilter_msg: str = "",
    post_filter_msg: str = "",
) -> str:
    """``FitError.Error()``: "0/N nodes are available: <count reason, ...sorted>. <postfilter message>"

    ``node_reasons`` holds the nodes with an explicit status; ``absent_reasons`` apply to every
    other node (those a PreFilter result left out).
    """
    msg = f"0/{num_all_nodes} nodes are available:"
    if prefilter_msg:
        msg += f" {prefilter_msg}."
    else:
        counts: dict[str, int] = {}
        for reasons in node_reasons.values():
            for r in reasons:
                counts[r] = counts.get(r, 0) + 1
        absent = num_all_nodes - len(node_reasons)
        if absent > 0:
            for r in absent_reasons:
                counts[r] = counts.get(r, 0) + absent
        parts = sorted(f"{v} {k}" for k, v in counts.items())
        if parts:
            msg += f" {', '.join(parts)}."
    if post_filter_msg:
        msg += f" {post_filter_msg}"
    return msg


def no_preemption_message(pod: Mapping[str, Any], num_all_nodes: int) -> str:
    """DefaultPreemption's PostFilter message; the stand-in never preempts, so no node is ever helpful."""
    if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
        return "preemption: not eligible due to preemptionPolicy=Never."
    return "preemption: " + fit_error_message(num_all_nodes, {}, ["Preemption is not helpful for scheduling"])
