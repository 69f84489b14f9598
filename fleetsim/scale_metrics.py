"""Scale mode's measurements of the broker process: CPU, RSS and the Prometheus histograms it serves."""

from __future__ import annotations

import math
import os
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "EMPTY_HISTOGRAM",
    "Histogram",
    "histogram",
    "machine_busy_s",
    "percentile",
    "process_cpu_s",
    "process_peak_rss_bytes",
    "process_rss_bytes",
    "scrape_metrics",
]

# ----------------------------------------------------------------------------- measurement helpers


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux /proc; NaN when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def machine_busy_s() -> float:
    """CPU seconds every core of the machine spent busy since boot (/proc/stat: all but idle and iowait), so
    a phase can say how much CPU processes other than the broker and the agents took meanwhile."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    except (OSError, ValueError, IndexError):
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _status_kib(pid: int, field_name: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def process_rss_bytes(pid: int) -> int:
    """Resident set size of a process (VmRSS of /proc/<pid>/status; 0 when it is gone)."""
    return _status_kib(pid, "VmRSS") * 1024


def process_peak_rss_bytes(pid: int) -> int:
    """Peak resident set size of a process (VmHWM; 0 when it is gone)."""
    return _status_kib(pid, "VmHWM") * 1024


def percentile(xs: Iterable[float], p: float) -> float:
    """The nearest-rank `p`th percentile (0 for no values)."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))] if s else 0.0


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram as scraped: cumulative counts per upper bound (the last bound is +Inf)."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float

    def minus(self, earlier: Histogram) -> Histogram:
        """What was observed since `earlier` (same buckets)."""
        before = dict(earlier.buckets)
        return Histogram(
            tuple((le, c - before.get(le, 0.0)) for le, c in self.buckets),
            self.count - earlier.count,
            self.sum - earlier.sum,
        )

    def quantile(self, q: float) -> float:
        """As PromQL's histogram_quantile: linear within the bucket holding the rank (NaN when empty; the
        highest finite bound when the rank falls in +Inf)."""
        if self.count <= 0 or not self.buckets:
            return float("nan")
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(le):
                    return lower
                inside = cumulative - below
                return lower + (le - lower) * ((rank - below) / inside if inside > 0 else 1.0)
            lower, below = le, cumulative
        return lower

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count > 0 else float("nan")


EMPTY_HISTOGRAM = Histogram((), 0.0, 0.0)


def scrape_metrics(url: str, timeout_s: float = 10.0) -> str:
    """The text exposition of a metrics endpoint (blocking: call it in a thread)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return str(resp.read().decode())


def histogram(text: str, name: str) -> Histogram:
    """One unlabelled histogram of a text exposition (EMPTY_HISTOGRAM when absent)."""
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        buckets: list[tuple[float, float]] = []
        count = total = 0.0
        for s in family.samples:
            if s.name.endswith("_bucket"):
                buckets.append((float(s.labels["le"]), float(s.value)))
            elif s.name.endswith("_count"):
                count = float(s.value)
            elif s.name.endswith("_sum"):
                total = float(s.value)
        return Histogram(tuple(sorted(buckets)), count, total)
    return EMPTY_HISTOGRAM
