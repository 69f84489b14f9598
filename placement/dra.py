"""DRA device matching: CEL selectors (class + request) evaluated per device, compiled and cached once."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import cel

from placement import mig
from placement.errors import QuantityError, SelectorError
from placement.model import DraDevice, DraVersion
from placement.quantity import parse_quantity

__all__ = [
    "DeviceClasses",
    "NVIDIA_DEVICE_CLASSES",
    "Match",
    "DraEvaluator",
    "check_selector",
    "device_slices",
]

DeviceClasses = Mapping[str, tuple[str, ...]]
"""DeviceClass name -> its CEL selectors (spec.selectors[].cel.expression)."""

NVIDIA_DEVICE_CLASSES: DeviceClasses = {
    "gpu.nvidia.com": ("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",),
    "mig.nvidia.com": ("device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",),
}
"""The classes the NVIDIA DRA driver installs, for callers that do not read DeviceClasses."""

_Q = "__q"  # tagged map key of a quantity: the library cannot carry custom Python types
_V = "__v"  # tagged map key of a semver
_DOMAIN_REF = re.compile(r"""(?:attributes|capacity)\s*\[\s*(['"])([^'"]+)\1\s*\]""")
_SEMVER = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")
_CACHE_LIMIT = 200_000  # entries; cleared wholesale beyond it (inventory churn, not per-request growth)


# --------------------------------------------------------------------------- CEL adapters


@functools.lru_cache(maxsize=4096)
def _quantity(text: str) -> dict[str, str]:
    try:
        return {_Q: str(parse_quantity(text))}
    except QuantityError as exc:
        raise ValueError(str(exc)) from exc


def _semver_key(text: str) -> tuple[int, int, int, int, str]:
    m = _SEMVER.match(text)
    if m is None:
        raise ValueError(f"invalid semver {text!r}")
    pre = m.group(4)
    # A release sorts after its pre-releases.
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), 0 if pre else 1, pre or "")


@functools.lru_cache(maxsize=4096)
def _semver(text: str) -> dict[str, str]:
    _semver_key(text)
    return {_V: text}


def _key(value: Any) -> Fraction | tuple[int, int, int, int, str]:
    if isinstance(value, dict):
        if _Q in value:
            return Fraction(value[_Q])
        if _V in value:
            return _semver_key(value[_V])
    if isinstance(value, int) and not isinstance(value, bool):
        return Fraction(value)
    raise TypeError(f"not a quantity or semver: {value!r}")


def _cmp(a: Any, b: Any) -> int:
    ka, kb = _key(a), _key(b)
    if type(ka) is not type(kb):
        raise TypeError("cannot compare a quantity with a semver")
    return (ka > kb) - (ka < kb)  # type: ignore[operator]


def _as_integer(a: Any) -> int:
    k = _key(a)
    if not isinstance(k, Fraction) or k.denominator != 1:
        raise ValueError(f"quantity {a!r} is not an integer")
    return int(k)


def _qnum(a: Any) -> Fraction:
    k = _key(a)
    if not isinstance(k, Fraction):
        raise TypeError("not a quantity")
    return k


def _semver_part(a: Any, i: int) -> int:
    k = _key(a)
    if isinstance(k, Fraction):
        raise TypeError("not a semver")
    return (k[0], k[1], k[2])[i]


_FUNCTIONS: dict[str, Any] = {
    "quantity": _quantity,
    "semver": _semver,
    "isQuantity": lambda s: _is_ok(_quantity, s),
    "isSemver": lambda s: _is_ok(_semver, s),
    "compareTo": _cmp,
    "isGreaterThan": lambda a, b: _cmp(a, b) > 0,
    "isLessThan": lambda a, b: _cmp(a, b) < 0,
    "asInteger": _as_integer,
    "isInteger": lambda a: _qnum(a).denominator == 1,
    "asApproximateFloat": lambda a: float(_qnum(a)),
    "sign": lambda a: (_qnum(a) > 0) - (_qnum(a) < 0),
    "add": lambda a, b: {_Q: str(_qnum(a) + _qnum(b))},
    "sub": lambda a, b: {_Q: str(_qnum(a) - _qnum(b))},
    "major": lambda a: _semver_part(a, 0),
    "minor": lambda a: _semver_part(a, 1),
    "patch": lambda a: _semver_part(a, 2),
}


def _is_ok(fn: Any, s: str) -> bool:
    try:
        fn(s)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=8192)
def _compile_cached(expression: str) -> Any:
    """The compiled program, or the SelectorError (failures are cached too: no recompiling per device)."""
    try:
        return cel.compile(expression)
    except Exception as exc:  # the library raises ValueError, but be safe at this boundary
        err = SelectorError(expression, (str(exc).splitlines() or ["does not compile"])[0])
        err.__cause__ = exc
        return err


def _compile(expression: str) -> Any:
    program = _compile_cached(expression)
    if isinstance(program, SelectorError):
        raise program
    return program


def check_selector(expression: str) -> None:
    """Raise SelectorError when a selector does not compile (for validation at submission)."""
    _compile(expression)


def _domains(expression: str) -> frozenset[str]:
    return frozenset(m.group(2) for m in _DOMAIN_REF.finditer(expression))


def _device_value(device: DraDevice, extra_domains: Iterable[str]) -> dict[str, Any]:
    attrs: dict[str, dict[str, Any]] = {d: {} for d in extra_domains}
    attrs.setdefault(device.driver, {})
    for name, value in device.attributes.items():
        domain, sep, short = name.rpartition("/")
        if not sep:
            domain, short = device.driver, name
        attrs.setdefault(domain, {})[short] = _semver(value.text) if isinstance(value, DraVersion) else value
    caps: dict[str, dict[str, Any]] = {d: {} for d in extra_domains}
    caps.setdefault(device.driver, {})
    for name, amount in device.capacity.items():
        domain, sep, short = name.rpartition("/")
        if not sep:
            domain, short = device.driver, name
        caps.setdefault(domain, {})[short] = {_Q: str(amount)}
    return {"driver": device.driver, "attributes": attrs, "capacity": caps}


# --------------------------------------------------------------------------- evaluation


@dataclass(frozen=True, slots=True)
class Match:
    """Devices that pass a request's selectors, plus how many were excluded by evaluation errors."""

    devices: tuple[DraDevice, ...]
    errors: int = 0
    first_error: str = ""
    unknown_class: bool = False


class DraEvaluator:
    """Evaluates class + request selectors against devices; keep one per process (it caches).

    Error policy: a runtime error (missing attribute, type error, non-bool result) means
    "this device does not match"; the count of such devices is returned so fit can say
    DRA_SELECTOR_ERROR when errors, not a lack of devices, left the request short.
    Caches are keyed by device identity (driver, pool, name) and checked against the
    attribute/capacity mapping objects, so a new ResourceSlice invalidates them.
    """

    __slots__ = ("classes", "_domains", "_ctx", "_results")

    def __init__(self, classes: DeviceClasses = NVIDIA_DEVICE_CLASSES) -> None:
        self.classes = classes
        self._domains: frozenset[str] = frozenset()
        self._ctx: dict[tuple[str, str, str], tuple[object, object, frozenset[str], Any]] = {}
        self._results: dict[tuple[tuple[str, str, str], str], tuple[object, object, bool | str]] = {}

    def selectors(self, device_class: str, request_selectors: Sequence[str]) -> tuple[str, ...] | None:
        """Class selectors followed by the request's; None when the class is unknown."""
        base = self.classes.get(device_class)
        if base is None:
            return None
        return (*base, *request_selectors)

    def _context(self, device: DraDevice) -> Any:
        hit = self._ctx.get(device.key)
        if hit is not None and hit[0] is device.attributes and hit[1] is device.capacity and hit[2] is self._domains:
            return hit[3]
        if len(self._ctx) > _CACHE_LIMIT:
            self._ctx.clear()
        ctx = cel.Context(variables={"device": _device_value(device, self._domains)}, functions=_FUNCTIONS)
        self._ctx[device.key] = (device.attributes, device.capacity, self._domains, ctx)
        return ctx

    def evaluate(self, device: DraDevice, expression: str) -> bool | str:
        """True/False, or an error message when evaluation failed. Raises SelectorError on compile errors."""
        program = _compile(expression)
        wanted = _domains(expression)
        if not wanted <= self._domains:
            self._domains = self._domains | wanted
        rkey = (device.key, expression)
        hit = self._results.get(rkey)
        if hit is not None and hit[0] is device.attributes and hit[1] is device.capacity:
            return hit[2]
        result: bool | str
        try:
            out = program.execute(self._context(device))
            result = out if isinstance(out, bool) else f"selector returned {type(out).__name__}, not bool"
        except Exception as exc:  # the CEL library raises KeyError/TypeError/RuntimeError/ValueError
            result = f"{type(exc).__name__}: {exc}"
        if len(self._results) > _CACHE_LIMIT:
            self._results.clear()
        self._results[rkey] = (device.attributes, device.capacity, result)
        return result

    def match(self, devices: Iterable[DraDevice], device_class: str, request_selectors: Sequence[str] = ()) -> Match:
        """Devices (allocated or not) that pass every selector of the class and the request.

        Raises SelectorError when a selector does not compile: that is a problem of the whole
        request (the extender's `Error`, the broker's INVALID_ARGUMENT), not of one node; the
        failure is cached, so it costs nothing per node."""
        exprs = self.selectors(device_class, request_selectors)
        if exprs is None:
            return Match((), unknown_class=True)
        for expr in exprs:  # a selector that does not compile is a whole-request error
            _compile(expr)
        ok: list[DraDevice] = []
        errors = 0
        first = ""
        for device in devices:
            good = True
            for expr in exprs:
                r = self.evaluate(device, expr)
                if r is True:
                    continue
                good = False
                if isinstance(r, str):
                    errors += 1
                    first = first or f"{expr}: {r}"
                break
            if good:
                ok.append(device)
        return Match(tuple(ok), errors, first)


# --------------------------------------------------------------------------- MIG slices of DRA devices

_MIG_NEW = re.compile(r"^gpu-(\d+)-mig-[a-z0-9-]+-(\d+)-(\d+)$")
_MIG_OLD = re.compile(r"^gpu-(\d+)-mig-(\d+)-(\d+)-(\d+)$")
_GPU = re.compile(r"^gpu-(\d+)$")
_SLICE_CAP = re.compile(r"^(?:.*/)?(?:memorySlice|memory-slice-)(\d+)$")
ALL_SLICES = 0xFF


def device_slices(device: DraDevice) -> tuple[str, int] | None:
    """(parent GPU, memory-slice mask) of a DRA GPU or MIG device, None when unknown.

    Two devices conflict when they share a parent and their masks overlap: a full GPU
    covers every slice (dynamic MIG advertises both the GPU and its possible partitions).
    """
    kind = device.attribute("type")
    if kind == "gpu" or _GPU.match(device.name):
        parent = device.attribute("uuid")
        m = _GPU.match(device.name)
        pid = str(parent) if parent is not None else (f"minor-{m.group(1)}" if m else None)
        return None if pid is None else (pid, ALL_SLICES)
    mask = 0
    for cap in device.capacity:
        sm = _SLICE_CAP.match(cap)
        if sm is not None:
            mask |= 1 << int(sm.group(1))
    minor: str | None = None
    m_new, m_old = _MIG_NEW.match(device.name), _MIG_OLD.match(device.name)
    if m_old is not None:
        minor = m_old.group(1)
        if not mask:
            mask = ((1 << int(m_old.group(4))) - 1) << int(m_old.group(3))
    elif m_new is not None:
        minor = m_new.group(1)
        if not mask:
            cls = next((c for c in mig.CLASSES_8.values() if c.gi_profile_id == int(m_new.group(2))), None)
            if cls is not None:
                mask = ((1 << cls.memory) - 1) << int(m_new.group(3))
    if not mask:
        return None
    parent = device.attribute("parentUUID")
    pid = str(parent) if parent is not None else (f"minor-{minor}" if minor is not None else None)
    return None if pid is None else (pid, mask)
