"""seek: the time to open ``Scanner(dir, offset=k)`` at a random ``k`` and read that one message,
in journals of 10**5, 10**6 and 10**7 keyless 100-byte messages (10**7 skipped with --quick).

The journals are built once into ``bench/.data/`` and reused; their files are read through before
measuring, so the figures are for a warm page cache. Each round times ``samples`` seeks per size
(sizes interleaved); the median, p90 and p99 reported are each the median over the rounds.

Baseline: the same open-and-read-one at offset 0, the cheapest read a Scanner can make, measured
interleaved with the random seeks in the same journal. An information row gives the floor under
both: ``os.open`` + ``os.pread`` + unpack + ``os.close`` of one message whose file and position are
known beforehand (what any reader pays at least).

Also the time to find a journal's end (``end_offset``: a queue's counts, a metrics scrape, a Spark
stream's next batch), which reads the last entries of the last segment's index, against the same
found by reading that whole index (``last_confirmed``, as before): 16,000 entries in a full segment.
"""

from __future__ import annotations

import os
import random
import struct
import time
from bisect import bisect_right

from harness import MESSAGE_SIZE, Context, Result, cached_journal, ms, segment_files, summarize
from journalq.journal import Scanner, end_offset
from journalq.journal.index import last_confirmed
from journalq.journal.segment import list_segments, scan_segment

FLAT = 1.5  # "flat": a seek in 10**7 messages costs at most this many times one in 10**5


def warm(path) -> None:
    """Read every file of the journal once, so that seeks find it in the page cache."""
    for file in sorted((path / "jnl").iterdir()):
        with open(file, "rb", buffering=0) as f:
            while f.read(1 << 22):
                pass


def seek_once(path, offset: int) -> float:
    started = time.perf_counter()
    scanner = Scanner(path, offset=offset)
    message = next(iter(scanner))
    seconds = time.perf_counter() - started
    scanner.close()
    if message.offset != offset:
        raise AssertionError(f"seek to {offset} read {message.offset}")
    return seconds


def raw_once(file: str, position: int, offset: int, unpack=struct.Struct(">QqBbi").unpack_from) -> float:
    started = time.perf_counter()
    fd = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
    data = os.pread(fd, MESSAGE_SIZE, position)
    found, timestamp_ns, type_, key_len, value_len = unpack(data, 0)
    value = data[22 : 22 + value_len]
    os.close(fd)
    seconds = time.perf_counter() - started
    if found != offset or len(value) != value_len:
        raise AssertionError(f"raw read at {position} found offset {found}, not {offset}")
    return seconds


def end_once(path, whole_index: bool, messages: int) -> float:
    """The time to find the journal's end: ``end_offset``, or with ``whole_index`` the same from the
    last segment's whole index."""
    started = time.perf_counter()
    if whole_index:
        last = list_segments(path)[-1]
        offset, position, _ = last_confirmed(last, os.stat(last.path).st_size)
        end = scan_segment(last, position, offset).next_offset
    else:
        end = end_offset(path)
    seconds = time.perf_counter() - started
    if end != messages:
        raise AssertionError(f"the end of a journal of {messages} messages was found at {end}")
    return seconds


def run(ctx: Context) -> list[Result]:
    sizes = [10**5, 10**6] if ctx.quick else [10**5, 10**6, 10**7]
    samples = 100 if ctx.quick else 200
    journals = {n: cached_journal(ctx, n) for n in sizes}
    for path in journals.values():
        warm(path)
    # For the raw floor: which segment holds an offset, and where (all messages are the same size).
    largest = sizes[-1]
    files = segment_files(journals[largest])
    bases = [int(f.stem, 16) for f in files]

    rnd = random.Random(7)
    seeks: dict[int, list[list[float]]] = {n: [] for n in sizes}
    firsts: dict[int, list[list[float]]] = {n: [] for n in sizes}
    raws: list[list[float]] = []
    ctx.log(f"  seek: {ctx.repeat} rounds of {samples} random seeks per size ({', '.join(f'{n:,}' for n in sizes)})")
    for _ in range(ctx.repeat):
        round_seeks = {n: [] for n in sizes}
        round_firsts = {n: [] for n in sizes}
        round_raws = []
        for _ in range(samples):
            for n in sizes:
                round_seeks[n].append(seek_once(journals[n], rnd.randrange(n)))
                round_firsts[n].append(seek_once(journals[n], 0))
            k = rnd.randrange(largest)
            i = bisect_right(bases, k) - 1
            round_raws.append(raw_once(str(files[i]), (k - bases[i]) * MESSAGE_SIZE, k))
        for n in sizes:
            seeks[n].append(round_seeks[n])
            firsts[n].append(round_firsts[n])
        raws.append(round_raws)

    results = []
    medians = {}
    for n in sizes:
        stats = {k: v * 1000 for k, v in summarize(seeks[n]).items()}
        base = {k: v * 1000 for k, v in summarize(firsts[n]).items()}
        medians[n] = stats
        results.append(
            Result(
                "seek",
                f"Scanner(offset=random) + 1 read, {n:,} msgs",
                stats["median"],
                "ms",
                f"median of {ctx.repeat} rounds x {samples}",
                "same at offset 0",
                base["median"],
                figure=f"median {ms(stats['median'])}, p90 {ms(stats['p90'])}, p99 {ms(stats['p99'])}",
                extra={
                    "messages": n,
                    "samples_per_round": samples,
                    "rounds": ctx.repeat,
                    "median_ms": round(stats["median"], 4),
                    "p90_ms": round(stats["p90"], 4),
                    "p99_ms": round(stats["p99"], 4),
                    "baseline_p99_ms": round(base["p99"], 4),
                    "segments": len(segment_files(journals[n])),
                },
            )
        )
    small, big = sizes[0], sizes[-1]
    flat = medians[big]["median"] / medians[small]["median"]
    flat99 = medians[big]["p99"] / medians[small]["p99"]
    results.append(
        Result(
            "seek",
            f"flatness: {big:,} / {small:,} msgs",
            flat,
            "x",
            f"median of {ctx.repeat} rounds",
            aim=f"close to 1 (<= {FLAT})",
            aim_met=flat <= FLAT,
            figure=f"median {flat:.2f}x, p99 {flat99:.2f}x",
            extra={"median_ratio": round(flat, 3), "p99_ratio": round(flat99, 3)},
        )
    )
    results += ends(ctx, journals)
    raw = {k: v * 1000 for k, v in summarize(raws).items()}
    results.append(
        Result(
            "seek",
            f"info: raw open+pread+close, known position, {largest:,} msgs",
            raw["median"],
            "ms",
            f"median of {ctx.repeat} rounds x {samples}",
            figure=f"median {ms(raw['median'])}, p90 {ms(raw['p90'])}, p99 {ms(raw['p99'])}",
            extra={
                "median_ms": round(raw["median"], 4), "p90_ms": round(raw["p90"], 4), "p99_ms": round(raw["p99"], 4)
            },
        )
    )
    return results


def ends(ctx: Context, journals: dict) -> list[Result]:
    """``end_offset`` of each journal against its last segment's whole index read (interleaved)."""
    samples = 20 if ctx.quick else 50
    times: dict[tuple[int, bool], list[list[float]]] = {(n, whole): [] for n in journals for whole in (False, True)}
    for _ in range(ctx.repeat):
        rounds: dict[tuple[int, bool], list[float]] = {key: [] for key in times}
        for _ in range(samples):
            for n, path in journals.items():
                for whole in (False, True):
                    rounds[n, whole].append(end_once(path, whole, n))
        for key, got in rounds.items():
            times[key].append(got)
    results = []
    for n in journals:
        stats = {k: v * 1000 for k, v in summarize(times[n, False]).items()}
        base = {k: v * 1000 for k, v in summarize(times[n, True]).items()}
        last = list_segments(journals[n])[-1]
        results.append(
            Result(
                "seek",
                f"end_offset (the tail of the last index), {n:,} msgs",
                stats["median"],
                "ms",
                f"median of {ctx.repeat} rounds x {samples}",
                "the whole last index read",
                base["median"],
                figure=f"median {ms(stats['median'])}, p99 {ms(stats['p99'])}",
                extra={
                    "messages": n,
                    "median_ms": round(stats["median"], 4),
                    "p99_ms": round(stats["p99"], 4),
                    "baseline_p99_ms": round(base["p99"], 4),
                    "last_index_bytes": last.index_path.stat().st_size,
                },
            )
        )
    return results
