"""Kubernetes resource quantities for the simulated control plane (its one quantity parser).

Written apart from ``placement.quantity`` on purpose: the scheduler stand-in must be able to
disagree with Tandem's core, so it shares none of its code.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

__all__ = ["QuantityError", "parse_quantity", "milli_value", "int_value"]

_SUFFIX: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}

_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exp>[+-]?[0-9]+))?$"
)


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(text: str | int | float) -> Fraction:
    """Exact value of a quantity such as ``"16Gi"``, ``"500m"``, ``"1.5"``, ``"1e3"`` (or a JSON number)."""
    if isinstance(text, bool):
        raise QuantityError(f"not a quantity: {text!r}")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        return Fraction(str(text))
    m = _QUANTITY.match(text.strip())
    if m is None:
        raise QuantityError(f"not a quantity: {text!r}")
    value = Fraction(m.group("num"))
    if m.group("exp") is not None:
        value *= Fraction(10) ** int(m.group("exp"))
    else:
        value *= _SUFFIX[m.group("suffix") or ""]
    return -value if m.group("sign") == "-" else value


def milli_value(text: str | int | float) -> int:
    """Thousandths, rounded up like ``resource.Quantity.MilliValue`` (CPU is compared in millicores)."""
    return math.ceil(parse_quantity(text) * 1000)


def int_value(text: str | int | float) -> int:
    """Whole units, rounded up like ``resource.Quantity.Value`` (memory bytes, GPUs, pods)."""
    return math.ceil(parse_quantity(text))
