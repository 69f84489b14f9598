"""The committed benchmark results as the README quotes them: loaded, their best and worst rows, fixed formats.

Every figure comes from a JSON twin (bench/results/<name>.json) with a fixed format; the few that the
JSON does not carry (the goals a benchmark is held to, the fairness benchmark's tenant weights) are read
from the same benchmark's committed report (bench/results/<name>.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
BENCHMARKS = ("agent", "broker", "extender", "fairness", "fleet", "fleetview", "placement", "replay", "scale", "store")

Row = Mapping[str, Any]


class FiguresError(RuntimeError):
    """A result file, a field or the README's markers are missing."""


@dataclass(frozen=True)
class Results:
    """The committed JSON twins and reports, by benchmark name."""

    json: Mapping[str, Any]
    md: Mapping[str, str]


def load_results(results_dir: Path = RESULTS) -> Results:
    data: dict[str, Any] = {}
    md: dict[str, str] = {}
    for name in BENCHMARKS:
        json_path, md_path = results_dir / f"{name}.json", results_dir / f"{name}.md"
        try:
            data[name] = json.loads(json_path.read_text(encoding="utf-8"))
            md[name] = md_path.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise FiguresError(f"missing committed result {exc.filename}") from exc
    return Results(json=data, md=md)


# -- choosing rows ---------------------------------------------------------------------------------


def best(rows: Iterable[Row], key: str, *, higher_is_better: bool = False) -> Row:
    """The row with the best value of `key` (lowest, unless higher_is_better); the first on ties."""
    candidates = list(rows)
    if not candidates:
        raise FiguresError(f"no rows to choose the best {key} from")
    pick = max if higher_is_better else min
    return pick(candidates, key=lambda r: float(r[key]))


def worst(rows: Iterable[Row], key: str, *, higher_is_better: bool = False) -> Row:
    """The row with the worst value of `key` (highest latency, or lowest rate if higher_is_better)."""
    candidates = list(rows)
    if not candidates:
        raise FiguresError(f"no rows to choose the worst {key} from")
    pick = min if higher_is_better else max
    return pick(candidates, key=lambda r: float(r[key]))


def md_figure(results: Results, name: str, pattern: str) -> str:
    """A figure stated only in a committed report (a goal, a setting), by regex group 1."""
    found = re.search(pattern, results.md[name])
    if found is None:
        raise FiguresError(f"bench/results/{name}.md no longer states /{pattern}/")
    return found.group(1)


# -- fixed formats ---------------------------------------------------------------------------------


def _whole(value: float) -> int:
    """Rounded half up, as the reports print (4118.5 -> 4119), not to even."""
    return int(Decimal(repr(value)).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def ms(value: float) -> str:
    """Milliseconds: 0.07, 2.7, 17.0, 516, 2,055 (then seconds from 10,000 ms: 19.3 s)."""
    if value >= 10_000:
        return f"{value / 1000:.1f} s"
    if value >= 100:
        return f"{_whole(value):,} ms"
    if value >= 1:
        return f"{value:.1f} ms"
    return f"{value:.2f} ms"


def pair(a: float, b: float) -> str:
    """Two latencies in one unit, as `516 / 1,548 ms`."""
    left, right = ms(a), ms(b)
    unit_a, unit_b = left.split(" ")[1], right.split(" ")[1]
    return f"{left.split(' ')[0]} / {right}" if unit_a == unit_b else f"{left} / {right}"


def seconds(value: float) -> str:
    return f"{value:.2f} s"


def rate(value: float) -> str:
    return f"{_whole(value):,}/s"


def kilo(value: float) -> str:
    """A rate in thousands: 1.2k, 13.3k."""
    return f"{value / 1000:.1f}k"


def megabytes(value: float) -> str:
    return f"{value / 1e6:.1f} MB"


def kilobytes(value: float) -> str:
    return f"{value / 1e3:.0f} KB"


def count(value: float) -> str:
    return f"{_whole(value):,}"


def span(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    """`lo–hi` of values in one format (one value when they format alike)."""
    lo, hi = fmt(min(values)), fmt(max(values))
    if lo == hi:
        return lo
    lo_num, _, lo_unit = lo.partition(" ")
    hi_unit = hi.partition(" ")[2]
    if lo_unit and lo_unit == hi_unit:
        return f"{lo_num}–{hi}"
    return f"{lo}–{hi}"
