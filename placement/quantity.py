"""Kubernetes resource quantities ("16Gi", "500m", "1e3") parsed exactly, in one place."""

from __future__ import annotations

import math
import re
from fractions import Fraction

from placement.errors import QuantityError

__all__ = ["QuantityError", "parse_quantity", "cpu_milli", "to_int_bytes", "Quantityish"]

Quantityish = str | int | Fraction
"""What the helpers accept: a quantity string, an int, or an already parsed Fraction."""


_BINARY: dict[str, int] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_DECIMAL: dict[str, Fraction] = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}

# Same grammar as k8s.io/apimachinery resource.Quantity: a signed decimal number
# followed by a binary SI suffix, a decimal SI suffix, or a decimal exponent.
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<dec>[numkMGTPE])|[eE](?P<exp>[+-]?[0-9]+))?"
)  # applied with fullmatch: `$` would also take "16Gi\n"
_MAX_EXPONENT = 64  # far beyond anything real; keeps "1e999999" from eating memory
_MAX_LENGTH = 128
"""Characters of a quantity string: real ones stay under 30; a 4,000-digit one is an attack on whatever
formats it (Python refuses to print ints past 4,300 digits)."""


def parse_quantity(value: Quantityish) -> Fraction:
    """Parse a Kubernetes quantity exactly: "16Gi", "500m", "1.5", "1e3", 4 -> Fraction.

    Raises QuantityError (a ValueError) on anything Kubernetes would reject.
    """
    if isinstance(value, bool):
        raise QuantityError(f"quantity must be a string or int, got bool {value!r}")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, int):
        return Fraction(value)
    if not isinstance(value, str):
        raise QuantityError(f"quantity must be a string or int, got {type(value).__name__}")
    if len(value) > _MAX_LENGTH:
        raise QuantityError(f"quantity of {len(value)} characters (at most {_MAX_LENGTH})")
    m = _QUANTITY.fullmatch(value)
    if m is None:
        raise QuantityError(f"invalid quantity {value!r}")
    number = Fraction(m.group("num"))
    if m.group("sign") == "-":
        number = -number
    if m.group("bin") is not None:
        return number * _BINARY[m.group("bin")]
    if m.group("dec") is not None:
        return number * _DECIMAL[m.group("dec")]
    exp_text = m.group("exp")
    if exp_text is not None:
        exp = int(exp_text)
        if abs(exp) > _MAX_EXPONENT:
            raise QuantityError(f"quantity exponent out of range in {value!r}")
        return number * Fraction(10) ** exp
    return number


def cpu_milli(value: Quantityish) -> int:
    """CPU quantity in millicores, rounded up as kube's MilliValue() does ("0.0001" -> 1)."""
    return math.ceil(parse_quantity(value) * 1000)


def to_int_bytes(value: Quantityish) -> int:
    """Quantity as an integer (bytes for memory), rounded up as kube's Value() does."""
    return math.ceil(parse_quantity(value))
