"""Shared machinery of the benchmarks: the run context, results, the table and the JSON lines,
repeated timing, and the journals cached in ``bench/.data/``.

Conventions:

* throughputs are in messages per second (and MB/s, MB = 10**6 bytes); each is measured
  ``repeat`` times and the best run is reported (noise on a shared machine only slows a run down);
  every run is kept in the JSON line.
* latencies are in milliseconds; a latency benchmark runs ``repeat`` rounds and reports, for each
  statistic (median, p90, p99), the median over the rounds.
* ``ratio`` is always ``figure / baseline``: above 1 means more messages per second than the
  baseline for a throughput, more time than the baseline for a latency.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from journalq.journal import Writer, end_offset

VALUE_SIZE = 100
MESSAGE_SIZE = 26 + VALUE_SIZE  # keyless: 26 bytes of header, lengths and size field
CACHE_FORMAT = 1  # bump to make every cached journal be rebuilt
BUILD_BATCH = 10_000


@dataclass
class Context:
    quick: bool
    repeat: int
    data_dir: Path  # cached journals, kept between runs
    scratch_dir: Path  # journals written by a benchmark, deleted after it

    def log(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def scratch(self, name: str) -> Path:
        """A fresh, empty scratch path (on the same file system as the cached journals)."""
        path = self.scratch_dir / name
        remove(path)
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        return path


@dataclass
class Result:
    bench: str
    case: str
    value: float
    unit: str  # "msg/s" or "ms"
    stat: str  # how the figure was chosen among repeats
    baseline_name: str | None = None
    baseline_value: float | None = None
    aim: str | None = None  # e.g. ">= 1,000,000 msg/s"
    aim_met: bool | None = None
    extra: dict = field(default_factory=dict)  # MB/s, percentiles, every run, sizes...
    figure: str | None = None  # the table's text for the figure, when more than the value

    @property
    def ratio(self) -> float | None:
        if self.baseline_value is None or not self.baseline_value:
            return None
        return self.value / self.baseline_value

    def to_json(self, quick: bool) -> str:
        return json.dumps(
            {
                "bench": self.bench,
                "case": self.case,
                "value": round(self.value, 6),
                "unit": self.unit,
                "stat": self.stat,
                "baseline": self.baseline_name,
                "baseline_value": None if self.baseline_value is None else round(self.baseline_value, 6),
                "ratio": None if self.ratio is None else round(self.ratio, 4),
                "aim": self.aim,
                "aim_met": self.aim_met,
                "quick": quick,
                **self.extra,
            },
            sort_keys=False,
        )


# -- formatting -------------------------------------------------------------------------------


def rate(msgs_per_s: float) -> str:
    if msgs_per_s >= 1e6:
        return f"{msgs_per_s / 1e6:.2f} M msg/s"
    if msgs_per_s >= 1e3:
        return f"{msgs_per_s / 1e3:.1f} k msg/s"
    return f"{msgs_per_s:.0f} msg/s"


def ms(value: float) -> str:
    if value < 0.1:
        return f"{value * 1000:.0f} µs"
    return f"{value:.3f} ms" if value < 10 else f"{value:.1f} ms"


def figure_text(r: Result) -> str:
    if r.figure is not None:
        return r.figure
    return rate(r.value) if r.unit == "msg/s" else ms(r.value)


def baseline_text(r: Result) -> str:
    if r.baseline_name is None:
        return "-"
    value = rate(r.baseline_value) if r.unit == "msg/s" else ms(r.baseline_value)
    return f"{r.baseline_name}: {value}"


def table(results: list[Result]) -> str:
    rows = [("bench", "case", "figure", "baseline (same run)", "ratio", "aim")]
    for r in results:
        aim = "-" if r.aim is None else f"{r.aim}: {'MET' if r.aim_met else 'NOT MET'}"
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        rows.append((r.bench, r.case, figure_text(r), baseline_text(r), ratio, aim))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


# -- measuring --------------------------------------------------------------------------------


def best_rate(repeat: int, run: Callable[[], tuple[int, float]]) -> tuple[float, list[float]]:
    """Run ``run`` (returning messages done and seconds taken) ``repeat`` times: best rate, all rates."""
    rates = []
    for _ in range(repeat):
        n, seconds = run()
        rates.append(n / seconds)
    return max(rates), rates


def cpu_jiffies() -> tuple[int, int] | None:
    """(stolen, total) CPU time of the machine since boot, in clock ticks, from ``/proc/stat``;
    None where there is none. Stolen: time the hypervisor ran someone else on this machine's
    virtual CPUs while they had work (a shared host's noise, which no run here controls)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice: counted in user already]
    return (fields[7], sum(fields[:8])) if len(fields) >= 8 else None


def stolen_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time stolen between two ``cpu_jiffies`` (None: unknown)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def percentile(sorted_values: list[float], p: float) -> float:
    """The ``p``-th percentile (0-100) of sorted values, nearest rank."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, round(p / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]


def summarize(rounds: list[list[float]]) -> dict[str, float]:
    """Median, p90 and p99 of each round; each the median over the rounds."""
    stats: dict[str, list[float]] = {"median": [], "p90": [], "p99": [], "max": []}
    for values in rounds:
        values = sorted(values)
        stats["median"].append(statistics.median(values))
        stats["p90"].append(percentile(values, 90))
        stats["p99"].append(percentile(values, 99))
        stats["max"].append(values[-1])
    return {name: statistics.median(v) for name, v in stats.items()}


def values(count: int, seed: int = 1) -> list[bytes]:
    rnd = random.Random(seed)
    return [rnd.randbytes(VALUE_SIZE) for _ in range(count)]


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


# -- cached journals --------------------------------------------------------------------------


def cached_journal(ctx: Context, messages: int) -> Path:
    """A journal of ``messages`` keyless 100-byte messages in ``data_dir``, built once and reused.

    A journal is reused only when its marker file (written after a complete build) matches and the
    journal really ends at ``messages``.
    """
    path = ctx.data_dir / f"journal-{messages}"
    marker = path / "bench-built.json"
    spec = {"format": CACHE_FORMAT, "messages": messages, "value_size": VALUE_SIZE, "batch": BUILD_BATCH}
    try:
        if json.loads(marker.read_text()) == spec and end_offset(path) == messages:
            return path
    except (OSError, ValueError):
        pass
    ctx.log(f"  building a journal of {messages:,} messages in {path} (cached for later runs)...")
    remove(path)
    batch = values(BUILD_BATCH, seed=messages)
    started = time.perf_counter()
    with Writer(path) as writer:
        done = 0
        while done < messages:
            n = min(BUILD_BATCH, messages - done)
            writer.append_many(batch if n == BUILD_BATCH else batch[:n])
            done += n
    seconds = time.perf_counter() - started
    marker.write_text(json.dumps(spec))
    ctx.log(
        f"  built in {seconds:.1f} s ({rate(messages / seconds)}, "
        f"{messages * MESSAGE_SIZE / seconds / 1e6:.0f} MB/s, including the final sync)"
    )
    return path


def journal_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in (path / "jnl").glob("*.jnl"))


def segment_files(path: Path) -> list[Path]:
    return sorted((path / "jnl").glob("*.jnl"))


def cpu_note() -> str:
    try:
        load = os.getloadavg()
        return f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    except OSError:
        return f"{os.cpu_count()} CPUs"
