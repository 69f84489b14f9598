"""MIG geometry (memory-slice placements per profile class), so fit and fragmentation agree with the driver."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from placement.model import Gpu, MigInstance
from placement.podspec import MIG_RESOURCE_PREFIX

__all__ = [
    "MigClass",
    "CLASSES_8",
    "CLASSES_A30",
    "FAMILY_PROFILES",
    "family_of",
    "profile_class",
    "resource_name",
    "occupied_mask",
    "placements",
    "can_place",
    "max_new_instances",
    "free_instances",
    "admitted_classes",
    "stranded_slices",
]


@dataclass(frozen=True, slots=True)
class MigClass:
    """A GPU-instance profile class: compute slices, memory slices (placement size), valid starts."""

    name: str
    gi_profile_id: int
    compute: int
    memory: int
    starts: tuple[int, ...]
    media: bool = False
    total_slices: int = 8

    @property
    def max_count(self) -> int:
        """Most instances of this class one GPU can hold (the +me limit of 1 included)."""
        if self.media:
            return 1
        return max_new_instances(0, self)


# Placement table of every 8-memory-slice GPU (A100, H100, H200, B200, GB200), MIG-GEOMETRY.md §1.
CLASSES_8: Mapping[str, MigClass] = {
    c.name: c
    for c in (
        MigClass("1g", 19, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        MigClass("1g+me", 20, 1, 1, (0, 1, 2, 3, 4, 5, 6), media=True),
        MigClass("1g.2m", 15, 1, 2, (0, 2, 4, 6)),
        MigClass("2g", 14, 2, 2, (0, 2, 4)),
        MigClass("3g", 9, 3, 4, (0, 4)),
        MigClass("4g", 5, 4, 4, (0,)),
        MigClass("7g", 0, 7, 8, (0,)),
    )
}
# A30: 4 memory slices, compute = memory for every profile.
CLASSES_A30: Mapping[str, MigClass] = {
    c.name: c
    for c in (
        MigClass("1g", 14, 1, 1, (0, 1, 2, 3), total_slices=4),
        MigClass("1g+me", 21, 1, 1, (0, 1, 2, 3), media=True, total_slices=4),
        MigClass("2g", 5, 2, 2, (0, 2), total_slices=4),
        MigClass("2g+me", 6, 2, 2, (0, 2), media=True, total_slices=4),
        MigClass("4g", 0, 4, 4, (0,), total_slices=4),
    )
}


def _family(one: str, one_double: str, two: str, three: str, seven: str) -> dict[str, str]:
    """Profile name -> class name for an 8-slice family, from its memory-size labels."""
    return {
        f"1g.{one}gb": "1g",
        f"1g.{one}gb+me": "1g+me",
        f"1g.{one_double}gb": "1g.2m",
        f"2g.{two}gb": "2g",
        f"3g.{three}gb": "3g",
        f"4g.{three}gb": "4g",
        f"7g.{seven}gb": "7g",
    }


# Profile names per GPU family (go-nvlib naming), MIG-GEOMETRY.md §2. GB200 names changed between
# board revisions, so both namings are accepted.
FAMILY_PROFILES: Mapping[str, Mapping[str, str]] = {
    "A100-40GB": _family("5", "10", "10", "20", "40"),
    "A100-80GB": _family("10", "20", "20", "40", "80"),
    "H100-80GB": _family("10", "20", "20", "40", "80"),
    "H100-94GB": _family("12", "24", "24", "47", "94"),
    "H100-96GB": _family("12", "24", "24", "48", "96"),
    "GH200-144GB": _family("18", "36", "36", "72", "144"),
    "H200-141GB": _family("18", "35", "35", "71", "141"),
    "B200": _family("23", "45", "45", "90", "180"),
    "GB200": {**_family("23", "47", "47", "93", "186"), **_family("24", "47", "47", "95", "189")},
    "A30": {"1g.6gb": "1g", "1g.6gb+me": "1g+me", "2g.12gb": "2g", "2g.12gb+me": "2g+me", "4g.24gb": "4g"},
}

# Product-name patterns (GFD label or DRA productName), most specific first.
_FAMILY_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), f)
    for p, f in (
        (r"GB200", "GB200"),
        (r"GH200.*144", "GH200-144GB"),
        (r"GH200|H100.*96GB", "H100-96GB"),
        (r"H100.*(NVL|94GB)", "H100-94GB"),
        (r"H100|H800", "H100-80GB"),
        (r"H200", "H200-141GB"),
        (r"B200", "B200"),
        (r"A100.*80GB|A800.*80GB", "A100-80GB"),
        (r"A100|A800", "A100-40GB"),
        (r"A30\b|A30-", "A30"),
    )
)


def family_of(model: str | None) -> str | None:
    """The MIG family of a GPU product name ("NVIDIA-A100-SXM4-80GB" -> "A100-80GB"), None if unknown."""
    if not model:
        return None
    for pattern, family in _FAMILY_PATTERNS:
        if pattern.search(model):
            return family
    return None


def profile_class(profile: str, model: str | None = None) -> MigClass | None:
    """The geometry class of a profile name on a GPU model.

    With an unknown model the name alone decides when every family agrees on it
    (e.g. "3g.40gb" is always a 3g); "1g.10gb" is a single-slice 1g on 80GB parts but a
    double-slice 1g on A100-40GB, so it needs the model. None when it cannot be resolved.
    """
    family = family_of(model)
    if family is not None:
        name = FAMILY_PROFILES[family].get(profile)
        if name is None:
            return None
        return (CLASSES_A30 if family == "A30" else CLASSES_8)[name]
    found = {(fam == "A30", names[profile]) for fam, names in FAMILY_PROFILES.items() if profile in names}
    if len(found) != 1:
        return None
    a30, name = found.pop()
    return (CLASSES_A30 if a30 else CLASSES_8)[name]


def resource_name(profile: str) -> str:
    """Extended resource of a profile under the device plugin's mixed strategy ("+" becomes ".")."""
    return MIG_RESOURCE_PREFIX + profile.replace("+", ".")


def _span(start: int, size: int) -> int:
    return ((1 << size) - 1) << start


def occupied_mask(instances: Iterable[MigInstance]) -> int:
    """Bit i set when memory slice i is taken by an existing GPU instance (used or not)."""
    mask = 0
    for inst in instances:
        mask |= _span(inst.start, inst.size)
    return mask


def placements(mask: int, cls: MigClass, *, media_in_use: bool = False) -> tuple[int, ...]:
    """Every start where a new instance of `cls` would fit next to the occupied `mask`."""
    if cls.media and media_in_use:
        return ()
    return tuple(s for s in cls.starts if not mask & _span(s, cls.memory))


def can_place(
    mask: int,
    profile: MigClass | str,
    *,
    model: str | None = None,
    media_in_use: bool = False,
    classes: Mapping[str, MigClass] | None = None,
) -> int | None:
    """Start for a new instance of `profile` (a class, or a profile name resolved with `model`)
    next to the occupied `mask`, or None. Picks the placement that leaves the most room for
    larger profiles (best fit), lowest start on ties. Unknown profile names give None."""
    cls = profile_class(profile, model) if isinstance(profile, str) else profile
    if cls is None:
        return None
    if classes is None:
        classes = CLASSES_A30 if cls.total_slices == 4 else CLASSES_8
    options = placements(mask, cls, media_in_use=media_in_use)
    if not options:
        return None

    def damage(start: int) -> tuple[int, int]:
        after = mask | _span(start, cls.memory)
        return (-_room(after, classes), start)

    return min(options, key=damage)


def _room(mask: int, classes: Mapping[str, MigClass]) -> int:
    """Weighted count of placements still open: larger profiles weigh more."""
    return sum(c.memory * len(placements(mask, c)) for c in classes.values() if not c.media)


def max_new_instances(mask: int, cls: MigClass) -> int:
    """How many more instances of `cls` could be created (earliest-end greedy is optimal here)."""
    count = 0
    limit = 1 if cls.media else len(cls.starts)
    for s in cls.starts:
        span = _span(s, cls.memory)
        if not mask & span:
            mask |= span
            count += 1
            if count == limit:
                break
    return count


def free_instances(gpu: Gpu, profile: str) -> int:
    """Existing, unused instances of `profile` on a GPU (what the device plugin can hand out)."""
    if not gpu.healthy:
        return 0
    return sum(1 for i in gpu.mig if i.profile == profile and not i.used)


def admitted_classes(mask: int, *, classes: Mapping[str, MigClass] = CLASSES_8) -> frozenset[str]:
    """Class names a GPU with this occupied mask could still create (fragmentation signal)."""
    return frozenset(c.name for c in classes.values() if placements(mask, c))


def stranded_slices(instances: Iterable[MigInstance], *, slots: int = 8) -> int:
    """Free memory slices that no 1-slice-or-larger profile can reach (slot 7 next to a 1g@6 etc.)."""
    mask = occupied_mask(instances)
    free = [i for i in range(slots) if not mask & (1 << i)]
    classes = CLASSES_8 if slots == 8 else CLASSES_A30
    reachable = 0
    for c in classes.values():
        for s in placements(mask, c):
            reachable |= _span(s, c.memory)
    return sum(1 for i in free if not reachable & (1 << i))
