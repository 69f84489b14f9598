"""Quantities written back in the canonical form the API server stores ("0.5" -> "500m", "2048Mi" -> "2Gi").

Parsing is Kubernetes' one grammar, shared with Tandem's core (`placement.quantity`); this module adds
what only the server does: keep the suffix family (binary SI, decimal SI, decimal exponent), round up to
nano units, and choose the largest suffix that leaves an integer mantissa, as resource.Quantity.String() does.
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction

from placement.quantity import QuantityError, parse_quantity

__all__ = ["QuantityError", "canonical_quantity", "format_quantity", "parse_quantity", "is_binary"]

_DEC_SUFFIX = {-9: "n", -6: "u", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}
_BIN_SUFFIX = {0: "", 10: "Ki", 20: "Mi", 30: "Gi", 40: "Ti", 50: "Pi", 60: "Ei"}
_FORMAT = re.compile(r"(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)$|[eE][+-]?[0-9]+$")

QUANTITY_ERROR = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"


def _format_of(text: str) -> str:
    m = _FORMAT.search(text)
    if m is None:
        return "DecimalSI"
    return "BinarySI" if m.group("bin") else "DecimalExponent"


def is_binary(text: str) -> bool:
    return _format_of(text) == "BinarySI"


def _round_up_nano(value: Fraction) -> Fraction:
    scaled = value * 10**9
    if scaled.denominator == 1:
        return value
    return Fraction(math.ceil(scaled), 10**9)


def _decimal(value: Fraction, exponent_style: bool) -> str:
    sign = "-" if value < 0 else ""
    value = abs(value)
    # mantissa * 10**exp with exp a multiple of 3 and the mantissa an integer, exp as large as possible
    exp = -9
    mantissa = value * 10**9
    while mantissa.denominator == 1 and mantissa % 1000 == 0 and exp < 18 and mantissa != 0:
        mantissa /= 1000
        exp += 3
    if exponent_style:
        suffix = "" if exp == 0 else f"e{exp}"
    else:
        suffix = _DEC_SUFFIX[exp]
    return f"{sign}{int(mantissa)}{suffix}"


def format_quantity(value: Fraction, fmt: str = "DecimalSI") -> str:
    """The canonical string of a value in a suffix family ("BinarySI", "DecimalSI", "DecimalExponent")."""
    value = _round_up_nano(value)
    if value == 0:
        return "0"
    if fmt == "BinarySI":
        if -1024 < value < 1024 or value.denominator != 1:
            fmt = "DecimalSI"
        else:
            sign = "-" if value < 0 else ""
            mantissa = int(abs(value))
            exp = 0
            while mantissa % 1024 == 0 and exp < 60:
                mantissa //= 1024
                exp += 10
            return f"{sign}{mantissa}{_BIN_SUFFIX[exp]}"
    return _decimal(value, fmt == "DecimalExponent")


def canonical_quantity(raw: object) -> str:
    """A client-written quantity (string or number) as the server stores it; QuantityError if invalid."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise QuantityError(QUANTITY_ERROR)
    if isinstance(raw, float):
        text = repr(raw)
        if not math.isfinite(raw):
            raise QuantityError(QUANTITY_ERROR)
        value = Fraction(text)
        return format_quantity(value, "DecimalSI")
    return _canonical_text(raw) if isinstance(raw, str) else format_quantity(parse_quantity(int(raw)), "DecimalSI")


@functools.lru_cache(maxsize=8192)
def _canonical_text(text: str) -> str:
    """Cached: the same few quantity strings ("8", "64Gi", "500m") are written over and over."""
    try:
        value = parse_quantity(text.strip())
    except QuantityError as e:
        raise QuantityError(QUANTITY_ERROR) from e
    return format_quantity(value, _format_of(text.strip()))
