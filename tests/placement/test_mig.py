"""MIG geometry cases from MIG-GEOMETRY.md: placements, blocking, slot 7, names per family."""

import pytest

from placement import mig
from placement.mig import CLASSES_8, CLASSES_A30
from tests.placement.builders import mig_inst


def mask(*spans: tuple[int, int]) -> int:
    out = 0
    for start, size in spans:
        out |= ((1 << size) - 1) << start
    return out


C = CLASSES_8


@pytest.mark.parametrize(
    ("cls", "starts", "memory", "max_count"),
    [
        ("1g", (0, 1, 2, 3, 4, 5, 6), 1, 7),
        ("1g+me", (0, 1, 2, 3, 4, 5, 6), 1, 1),
        ("1g.2m", (0, 2, 4, 6), 2, 4),
        ("2g", (0, 2, 4), 2, 3),
        ("3g", (0, 4), 4, 2),
        ("4g", (0,), 4, 1),
        ("7g", (0,), 8, 1),
    ],
)
def test_class_table(cls: str, starts: tuple[int, ...], memory: int, max_count: int) -> None:
    c = C[cls]
    assert (c.starts, c.memory, c.max_count) == (starts, memory, max_count)


@pytest.mark.parametrize(
    ("occupied", "cls", "expected"),
    [
        # 1g@3 blocks 2g@2, 1g-double@2, 3g@0, 4g@0 and 7g (rule 5).
        (mask((3, 1)), "2g", (0, 4)),
        (mask((3, 1)), "1g.2m", (0, 4, 6)),
        (mask((3, 1)), "3g", (4,)),
        (mask((3, 1)), "4g", ()),
        (mask((3, 1)), "7g", ()),
        # A 3g@0 blocks the 4g; 4g + 3g means 4g@0 + 3g@4 (rule 3).
        (mask((0, 4)), "4g", ()),
        (mask((0, 4)), "3g", (4,)),
        (mask((4, 4)), "4g", (0,)),
        # 2g never starts at slot 6; slot 7 only via 1g-double@6, 3g@4 or 7g (rule 2).
        (mask((0, 6)), "2g", ()),
        (mask((0, 6)), "1g.2m", (6,)),
        (mask((0, 6)), "1g", (6,)),
        (mask((0, 7)), "1g", ()),
        (0, "7g", (0,)),
        (mask((7, 1)), "7g", ()),
    ],
)
def test_placements(occupied: int, cls: str, expected: tuple[int, ...]) -> None:
    assert mig.placements(occupied, C[cls]) == expected


def test_media_extension_limited_to_one() -> None:
    assert mig.placements(0, C["1g+me"], media_in_use=True) == ()
    assert mig.max_new_instances(0, C["1g+me"]) == 1


def test_seven_1g_strand_slot_7() -> None:
    insts = [mig_inst("1g.10gb", s, 1) for s in range(7)]
    assert mig.stranded_slices(insts) == 1
    assert mig.stranded_slices([mig_inst("3g.40gb", 4, 4)]) == 0
    assert mig.stranded_slices([mig_inst("2g.20gb", s, 2) for s in (0, 2, 4)] + [mig_inst("1g.10gb", 6, 1)]) == 1


def test_can_place_keeps_room_for_bigger_profiles() -> None:
    # On an empty GPU a 1g goes where it does not break the 4g@0 / 3g@4 pair more than needed.
    start = mig.can_place(0, C["1g"])
    assert start is not None and start >= 4
    # With a 4g at 0, a 3g must go to 4.
    assert mig.can_place(mask((0, 4)), C["3g"]) == 4
    assert mig.can_place(mask((0, 4), (4, 4)), C["1g"]) is None
    # by profile name, resolved per GPU model
    assert mig.can_place(mask((0, 4)), "3g.40gb", model="NVIDIA-A100-SXM4-80GB") == 4
    assert mig.can_place(mask((0, 2)), "1g.10gb", model="NVIDIA-A100-SXM4-40GB") in (2, 4, 6)
    assert mig.can_place(0, "9g.1gb") is None
    assert mig.can_place(0, "4g.24gb", model="NVIDIA A30") == 0


@pytest.mark.parametrize(
    ("occupied", "cls", "n"),
    [
        (0, "1g", 7),
        (mask((0, 4)), "1g", 3),
        (mask((2, 1)), "2g", 2),
        (0, "3g", 2),
        (mask((1, 1)), "3g", 1),
        (0, "1g.2m", 4),
    ],
)
def test_max_new_instances(occupied: int, cls: str, n: int) -> None:
    assert mig.max_new_instances(occupied, C[cls]) == n


def test_admitted_classes_shrink_with_fragmentation() -> None:
    assert mig.admitted_classes(0) == frozenset(C)
    assert mig.admitted_classes(mask((3, 1))) == frozenset({"1g", "1g+me", "1g.2m", "2g", "3g"})
    assert mig.admitted_classes(mask((0, 8))) == frozenset()


@pytest.mark.parametrize(
    ("profile", "model", "cls"),
    [
        ("3g.40gb", "NVIDIA-A100-SXM4-80GB", "3g"),
        ("1g.10gb", "NVIDIA-A100-SXM4-80GB", "1g"),
        ("1g.10gb", "NVIDIA-A100-SXM4-40GB", "1g.2m"),
        ("1g.10gb", "NVIDIA-H100-80GB-HBM3", "1g"),
        ("1g.20gb", "NVIDIA-H100-80GB-HBM3", "1g.2m"),
        ("1g.12gb+me", "NVIDIA H100 NVL", "1g+me"),
        ("3g.71gb", "NVIDIA H200", "3g"),
        ("7g.180gb", "NVIDIA B200", "7g"),
        ("3g.93gb", "NVIDIA-GB200", "3g"),
        ("3g.95gb", "NVIDIA-GB200", "3g"),
        ("2g.12gb+me", "NVIDIA A30", "2g+me"),
        ("3g.40gb", None, "3g"),
        ("1g.20gb", None, "1g.2m"),
    ],
)
def test_profile_class(profile: str, model: str | None, cls: str) -> None:
    got = mig.profile_class(profile, model)
    assert got is not None and got.name == cls


@pytest.mark.parametrize(("profile", "model"), [("1g.10gb", None), ("3g.40gb", "NVIDIA H200"), ("9g.1gb", None)])
def test_profile_class_unresolvable(profile: str, model: str | None) -> None:
    assert mig.profile_class(profile, model) is None


def test_a30_has_four_slices() -> None:
    a30 = CLASSES_A30
    assert mig.placements(0, a30["4g"]) == (0,)
    assert mig.max_new_instances(0, a30["1g"]) == 4
    assert mig.profile_class("4g.24gb", "NVIDIA A30") == a30["4g"]


def test_resource_name_replaces_plus() -> None:
    assert mig.resource_name("1g.10gb") == "nvidia.com/mig-1g.10gb"
    assert mig.resource_name("1g.10gb+me") == "nvidia.com/mig-1g.10gb.me"


def test_occupied_mask_and_free_instances() -> None:
    from placement.model import Gpu

    g = Gpu(
        0,
        "A100",
        81920,
        mig=(mig_inst("3g.40gb", 0, 4, used=True), mig_inst("3g.40gb", 4, 4), mig_inst("1g.10gb", 8, 0)),
    )
    assert mig.occupied_mask(g.mig[:2]) == 0xFF
    assert mig.free_instances(g, "3g.40gb") == 1
    assert mig.free_instances(Gpu(0, "A100", 1, mig=g.mig, healthy=False), "3g.40gb") == 0
