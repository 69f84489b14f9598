"""Kubernetes quantity parsing: exact values, kube's rounding, clear errors."""

from fractions import Fraction

import pytest

from placement.errors import QuantityError
from placement.quantity import cpu_milli, parse_quantity, to_int_bytes


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("16Gi", 16 * 2**30),
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        ("1e3", 1000),
        ("1E3", 1000),
        ("2113396124Ki", 2113396124 * 1024),
        ("884Gi", 884 * 2**30),
        ("141Gi", 141 * 2**30),
        ("1k", 1000),
        ("1M", 10**6),
        ("1E", 10**18),
        ("1Ei", 2**60),
        ("100n", Fraction(1, 10**7)),
        ("5u", Fraction(5, 10**6)),
        (".5", Fraction(1, 2)),
        ("1.", 1),
        ("+3", 3),
        ("-2", -2),
        ("1.5e-3", Fraction(3, 2000)),
        ("0", 0),
        (4, 4),
    ],
)
def test_parse_quantity(text: str | int, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "abc",
        "1.5.5",
        "16 Gi",
        "16GB",
        "1KiB",
        "Gi",
        "--1",
        "1e",
        "e3",
        "0x10",
        " 1",
        "1e99999",
        "16Gi\n",
        "1\n",
        "9" * 4299 + "Ei",
    ],
)
def test_garbage_raises_quantity_error(bad: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(bad)
    with pytest.raises(ValueError):  # QuantityError is a ValueError for callers that catch broadly
        parse_quantity(bad)


@pytest.mark.parametrize("bad", [True, 1.5, None, [1]])
def test_non_string_types_raise(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "milli"), [("192", 192000), ("500m", 500), ("0.0001", 1), ("1.0005", 1001), ("250m", 250), (2, 2000)]
)
def test_cpu_milli_rounds_up_like_kube(text: str | int, milli: int) -> None:
    assert cpu_milli(text) == milli


@pytest.mark.parametrize(("text", "n"), [("1Gi", 2**30), ("1.5", 2), ("100m", 1), ("1e3", 1000)])
def test_to_int_bytes_rounds_up(text: str, n: int) -> None:
    assert to_int_bytes(text) == n
