"""Reading journals for Spark: planning offset ranges per shard, splitting them into partitions,
and reading a partition as Arrow record batches decoded column-wise.

Planning runs on the driver and only looks at segment names, sizes and index entries (and, for a
timestamp, the timestamps of the messages it passes over). Reading runs on the executors: it seeks
through the sparse index (``.idx``; a segment without one is walked from its start by the size
fields), reads large chunks and decodes them with ``columnar.decode_columns``.
"""

from __future__ import annotations

import base64
import errno
import math
import os
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import numpy as np

from journalq.errors import ZERO_TIMESTAMP, CorruptionError, JournalError, StorageError
from journalq.journal import index
from journalq.journal.codec import INT32, OVERHEAD
from journalq.journal.offsets import end_offset, first_offset
from journalq.journal.recovery import fsync_dir, fsync_file
from journalq.journal.segment import (
    Segment,
    base_after,
    confirms,
    framed_at,
    gap_error,
    incomplete_end_error,
    journal_dir,
    open_segment,
    scan_segment,
    segment_at,
    segment_bases,
    segment_name,
)
from journalq.spark import columnar, predicates
from journalq.spark.columnar import Columns, decode_columns
from journalq.spark.options import EARLIEST, LATEST, OptionError
from journalq.spark.targets import Shard

READ_CHUNK = 4 << 20  # bytes per read once going: ~33,000 messages of 100 bytes per Arrow batch
FIRST_READ = 64 << 10  # the first read after a seek is small (a narrow query may want a few)
ENVELOPE_TYPE = 0xE0


class DataLossError(JournalError):
    """Messages a query needs were deleted (by retention or by hand) before it read them."""


@dataclass(frozen=True)
class ShardRange:
    """Offsets ``[start, end)`` of one shard to read."""

    shard: str
    path: str
    start: int
    end: int

    @property
    def count(self) -> int:
        return max(0, self.end - self.start)


# -- where shards begin and end -------------------------------------------------------------------


def bounds(shard: Shard) -> tuple[int, int]:
    """(first offset still stored, end offset) of a shard."""
    return first_offset(shard.path), end_offset(shard.path)


def range_bytes(path: str, start: int, end: int) -> int:
    """The bytes that messages ``[start, end)`` take in the segments (those of a segment deleted
    meanwhile count ``OVERHEAD`` each). They depend on those messages only, so a range is cut into
    the same partitions whenever it is planned: a streaming sink's exactly once needs a replayed
    batch to give each partition the same rows, whatever was appended or deleted since."""
    return sum(size for _, _, _, size in _spans(path, start, end))


def _spans(path: str, start: int, end: int) -> list[tuple[int | None, int, int, int]]:
    """``[start, end)`` cut where segments begin: (segment base, or None where the messages are
    no longer stored, low, high, bytes) per piece, in order."""
    bases = segment_bases(path)
    out: list[tuple[int | None, int, int, int]] = []
    gone = min(end, bases[0] if bases else end)
    if gone > start:
        out.append((None, start, gone, (gone - start) * OVERHEAD))
    for i, base in enumerate(bases):
        following = bases[i + 1] if i + 1 < len(bases) else None
        low, high = max(start, base), end if following is None else min(end, following)
        if low >= high:
            continue
        segment = segment_at(path, base)
        try:
            fd = open_segment(segment)
        except FileNotFoundError:
            out.append((None, low, high, (high - low) * OVERHEAD))
            continue
        try:
            last = os.fstat(fd).st_size if high == following else _position(fd, segment, high)
            out.append((base, low, high, last - _position(fd, segment, low)))
        finally:
            os.close(fd)
    return out


def _byte_cuts(path: str, spans: list[tuple[int | None, int, int, int]], pieces: int) -> list[int]:
    """Offsets that cut the range of ``spans`` (``_spans``') into ``pieces`` of about equal bytes:
    for each k, the message boundary nearest to k/pieces of the range's bytes (so a piece exceeds
    its share by at most a message that straddles a cut). From the messages only, as
    ``range_bytes``: the index just makes the search faster."""
    total = sum(size for *_, size in spans)
    cuts: list[int] = []
    before = 0  # the bytes of the spans before this one
    k = 1
    for base, low, high, size in spans:
        budgets = []
        while k < pieces and k * total // pieces < before + size:
            budgets.append(k * total // pieces - before)
            k += 1
        before += size
        if budgets:
            cuts.extend(_offsets_within(path, base, low, high, budgets))
    return cuts


def _offsets_within(path: str, base: int | None, low: int, high: int, budgets: list[int]) -> list[int]:
    """For each budget, the offset in ``[low, high]`` of segment ``base`` whose start is nearest
    to that many bytes after message ``low`` (a binary search over positions); ``OVERHEAD`` a
    message where the segment is gone."""
    segment = None if base is None else segment_at(path, base)
    try:
        fd = -1 if segment is None else open_segment(segment)
    except FileNotFoundError:
        fd = -1
    if segment is None or fd < 0:
        return [low + budget // OVERHEAD for budget in budgets]
    try:
        position = _locator(fd, segment)
        first = position(low)
        out = []
        for budget in budgets:
            limit = first + budget
            lo, hi = low, high - 1
            while lo < hi:  # the last message that starts at or before the limit
                mid = (lo + hi + 1) // 2
                if position(mid) <= limit:
                    lo = mid
                else:
                    hi = mid - 1
            # or the end of that message, when nearer (a big message then ends its piece)
            out.append(lo + 1 if position(lo + 1) - limit < limit - position(lo) else lo)
        return out
    finally:
        os.close(fd)


def _locator(fd: int, segment: Segment) -> Callable[[int], int]:
    """``_position`` for many lookups in one open segment. Without a usable index (a segment
    written by sej) each would walk from the segment's start: its entries are found once, by a
    scan, instead."""
    if index.lookup(segment, segment.base) is not None:
        return lambda target: _position(fd, segment, target)
    entries = scan_segment(segment, 0, segment.base, fd=fd).entries
    offsets = [offset for offset, _ in entries]

    def position(target: int) -> int:
        i = bisect_right(offsets, target) - 1
        return _position(fd, segment, target, (entries[i][1], entries[i][0]) if i >= 0 else (0, segment.base))

    return position


def resolve_offset(
    spec: str | dict[str, int],
    shard: str,
    first: int,
    end: int,
    *,
    default: int,
) -> int:
    """An offset from ``earliest``/``latest``/JSON for one shard (``default`` for a shard that
    the JSON leaves out)."""
    if spec == "earliest":
        return first
    if spec == "latest":
        return end
    assert isinstance(spec, dict)
    value = spec.get(shard, default)
    if value == EARLIEST:
        return first
    if value == LATEST:
        return end
    return value


def check_known_shards(spec: str | dict[str, int], shards: Sequence[Shard], option: str) -> None:
    if isinstance(spec, dict):
        names = {s.name for s in shards}
        unknown = sorted(set(spec) - names)
        if unknown:
            known = ", ".join(repr(n) for n in sorted(names)) or "none"
            raise OptionError(f"option {option} names shard(s) {', '.join(map(repr, unknown))}; the shards are {known}")


# -- splitting ------------------------------------------------------------------------------------


def split(
    ranges: Sequence[ShardRange],
    *,
    min_partitions: int | None,
    max_partition_bytes: int,
) -> list[ShardRange]:
    """Cut ranges so that no piece holds more than ``max_partition_bytes`` (give or take the
    message that straddles a cut: pieces are cut by the messages' bytes, not their count, so a run
    of big messages does not land in one task), and so that there are at least
    ``min_partitions`` pieces when there are that many messages, shared out in proportion to each
    shard's messages (as Kafka's ``minPartitions``, by count)."""
    ranges = [r for r in ranges if r.count > 0]
    if not ranges:
        return []
    cuts = []
    for r in ranges:
        spans = _spans(r.path, r.start, r.end)
        pieces = math.ceil(sum(size for *_, size in spans) / max_partition_bytes)
        found = _byte_cuts(r.path, spans, pieces) if pieces > 1 else []
        cuts.append({c for c in found if r.start < c < r.end})
    # Counted after the cuts: those that fall inside one big message are one.
    if min_partitions and sum(len(c) + 1 for c in cuts) < min_partitions:
        total = sum(r.count for r in ranges)
        for r, found in zip(ranges, cuts):
            share = min(max(1, round(min_partitions * r.count / total)), r.count)
            step = r.count / share  # both: counted pieces, none over the bytes
            found.update(r.start + round(step * i) for i in range(1, share))
    out = []
    for r, found in zip(ranges, cuts):
        bounds = [r.start, *sorted(found), r.end]
        out.extend(ShardRange(r.shard, r.path, a, b) for a, b in pairwise(bounds))
    return out


# -- seeking --------------------------------------------------------------------------------------


def _walk(fd: int, position: int, offset: int, target: int) -> tuple[int, int]:
    """From the message ``offset`` at ``position``, follow the length fields forward to the
    message ``target`` (or the end of the segment's whole messages): (position, offset)."""
    while offset < target:
        chunk = os.pread(fd, READ_CHUNK, position)
        pos, end = 0, len(chunk)
        while offset < target and pos + OVERHEAD <= end:
            key_len = chunk[pos + 17]
            key_end = pos + 18 + key_len
            if key_len > 127 or key_end + 4 > end:
                break
            (value_len,) = INT32.unpack_from(chunk, key_end)
            size = OVERHEAD + key_len + value_len
            if value_len < 0 or pos + size > end:
                break
            pos += size
            offset += 1
        if pos == 0:
            break  # a message bigger than the chunk, or damage: decoding from here will tell
        position += pos
    return position, offset


def seek(fd: int, segment: Segment, target: int) -> tuple[int, int]:
    """A position at or before message ``target`` of an open segment, as (position, offset): an
    index entry checked against the segment, then a walk over the length fields."""
    if target == segment.base:
        return 0, target
    entry = index.lookup(segment, target)
    if entry is not None and confirms(fd, *entry):  # the segment's word, not the index's
        position, offset = entry[1], entry[0]
    else:
        position, offset = 0, segment.base
    return _walk(fd, position, offset, target)


def _position(fd: int, segment: Segment, target: int, start: tuple[int, int] | None = None) -> int:
    """Where message ``target`` of an open segment starts (or the segment's whole messages end),
    going from ``start`` (position, offset) at or before it, or from a seek."""
    position, offset = seek(fd, segment, target) if start is None else _walk(fd, *start, target)
    while offset < target:  # seek stops before a message bigger than a read: step over it
        framed = framed_at(fd, position)
        if framed is None:
            break  # damage: reading the range will report it
        position, offset = _walk(fd, position + framed[1], offset + 1, target)
    return position


# -- reading --------------------------------------------------------------------------------------


def iter_columns(
    path: str,
    start: int,
    end: int,
    *,
    keys: bool = True,
    values: bool = True,
    fail_on_data_loss: bool = True,
    max_rows: int | None = None,
) -> Iterator[Columns]:
    """The messages ``[start, end)`` of the journal at ``path``, a chunk of columns at a time
    (of ``max_rows`` messages at most).

    When messages from ``start`` on are no longer stored, raises ``DataLossError``, or with
    ``fail_on_data_loss=False`` goes on from the first message still there. Raises
    ``JournalError`` when the journal ends before ``end``.
    """
    next_offset = start
    fd = -1
    if not os.path.isdir(path):
        raise JournalError(
            f"no journal directory at {path} on {os.uname().nodename}: every executor must see the "
            "journals at the same paths as the driver",
            file=path,
        )
    try:
        while next_offset < end:
            bases = segment_bases(path)
            if not bases or next_offset < bases[0]:
                first = bases[0] if bases else None
                if fail_on_data_loss:
                    raise _lost(path, next_offset, first)
                if first is None or first >= end:
                    return  # everything left to read was deleted
                next_offset = first
            which = bisect_right(bases, next_offset) - 1
            segment = segment_at(path, bases[which])
            try:
                fd = open_segment(segment)
            except FileNotFoundError:
                continue  # deleted between listing and opening: look again
            position, offset = seek(fd, segment, next_offset)
            skip = next_offset - offset  # messages before next_offset still to pass over
            chunk = FIRST_READ
            pending = b""
            while next_offset < end:
                data = os.pread(fd, max(chunk, 2 * len(pending)), position + len(pending))
                chunk = READ_CHUNK
                if not data:
                    if pending and os.path.exists(os.path.join(path, "jnl", segment_name(offset))):
                        raise incomplete_end_error(segment, position, offset, len(pending))
                    if pending:  # damage, or an append under way (then the planned end is not reached)
                        damage = index.damage_at_end(segment, position, offset, len(pending), position + len(pending))
                        if damage is not None:
                            raise damage
                    break  # on to the next segment
                buf = pending + data if pending else data
                used = 0
                while next_offset < end:
                    # Again from where the last call stopped: it stops at Arrow's 2 GiB of values
                    # too, with whole messages left in ``buf`` (not read again, nor grown).
                    try:
                        wanted = end - offset if max_rows is None else min(end - offset, max_rows)
                        cols, stop = decode_columns(buf, used, len(buf), offset, wanted, keys=keys, values=values)
                    except CorruptionError as exc:
                        raise exc.located(segment.path, position) from None
                    n = len(cols)
                    if not n:
                        break
                    used = stop
                    offset += n
                    if skip:
                        drop = min(skip, n)
                        skip -= drop
                        if drop == n:
                            continue
                        cols = cols.select(slice(drop, None))
                    next_offset = offset
                    yield cols
                position += used
                pending = buf[used:]
            os.close(fd)
            fd = -1
            if next_offset < end and not os.path.exists(os.path.join(path, "jnl", segment_name(next_offset))):
                if first_offset(path) > next_offset:
                    continue  # deleted meanwhile: the top of the loop decides
                after = base_after(path, segment.base)
                if after is not None:  # a hole (or an overlap) in the middle, not the end
                    raise gap_error(segment, position, offset, after)
                raise JournalError(
                    f"the journal ends at offset {next_offset}, before offset {end} that was planned "
                    "(it was cut short since the query was planned)",
                    file=path,
                )
    finally:
        if fd >= 0:
            os.close(fd)


def make_durable(path: str, since: int, *, entries: bool = False) -> None:
    """Sync the segments of the journal at ``path`` that hold offsets ``since`` and later, and
    the directory listing them when there are several (``entries``, a journal not synced
    before: that directory and the journal's own directory entries too). A stream
    plans a micro-batch only over messages synced so: a writer under sync none or group leaves
    its last messages to the page cache, and were a power cut to take those of a batch already
    planned, the new messages written at their offsets after recovery would be skipped."""
    bases = segment_bases(path)
    syncs: list[tuple[Callable[[Path], None], Path]] = [
        (fsync_file, segment_at(path, base).path) for base in bases[max(0, bisect_right(bases, since) - 1) :]
    ]
    if len(syncs) > 1 or (syncs and entries):  # a segment made since: its directory entry too
        syncs.append((fsync_dir, journal_dir(path)))
    if entries:
        syncs += [(fsync_dir, Path(path)), (fsync_dir, Path(path).parent)]
    for sync, file in syncs:
        try:
            sync(file)
        except FileNotFoundError:
            continue  # a segment deleted since it was listed (retention): nothing of it to keep
        except OSError as exc:
            if exc.errno in (errno.EROFS, errno.EINVAL, errno.EOPNOTSUPP, errno.EACCES, errno.EPERM):
                # Storage that cannot sync (read-only, no fsync: its writer could not either), or
                # a directory this reader may not open: reading must go on as before.
                continue
            raise StorageError(
                f"cannot sync the journal before a micro-batch is planned over it: {exc.strerror or exc}",
                errno=exc.errno, file=file,
            ) from exc


def _lost(path: str, wanted: int, first: int | None) -> JournalError:
    where = "no segment is left" if first is None else f"the journal now starts at offset {first}"
    return DataLossError(
        f"offset {wanted} is no longer stored ({where}): retention deleted messages this query "
        "needed; set the option failOnDataLoss=false to skip what was deleted",
        file=path, offset=wanted,
    )


def first_offset_at(path: str, timestamp_ns: int, start: int, end: int) -> int:
    """The first offset in ``[start, end)`` whose timestamp is ``timestamp_ns`` or later; ``end``
    when there is none. A scan of the timestamps (sej does not require them to rise)."""
    for cols in iter_columns(path, start, end, keys=False, values=False):
        hits = np.flatnonzero(cols.timestamp_ns >= timestamp_ns)
        if len(hits):
            return int(cols.offset[hits[0]])
    return end


# -- Arrow ----------------------------------------------------------------------------------------


@dataclass
class ReadSpec:
    """What a partition's reader makes of the messages: the columns (Spark's schema, in its
    order), the conditions it applies itself, and whether lost messages fail the read."""

    schema: object  # pyspark StructType
    conditions: list = field(default_factory=list)
    prune: bool = True
    fail_on_data_loss: bool = True


class BatchBuilder:
    """Turns decoded columns into Arrow record batches of exactly Spark's schema."""

    def __init__(self, spec: ReadSpec, shard: str) -> None:
        import pyarrow as pa

        from journalq.spark.schema import arrow_schema

        self.pa = pa
        self.schema = arrow_schema(spec.schema)
        self.names = self.schema.names
        self.shard = shard
        self.keys = "key" in self.names
        self.values = bool({"value", "body", "attributes"} & set(self.names))
        # The shard column repeats the name on every row, in int32 offsets as keys and values
        # are: rows past MAX_BINARY bytes of it wait for the next batch (their offsets would wrap).
        named = len(shard.encode()) if "shard" in self.names else 0
        self.max_rows = columnar.MAX_BINARY // named if named else None

    def batch(self, cols: Columns):
        pa = self.pa
        n = len(cols)
        arrays = []
        envelopes = None
        value_array = None
        for name in self.names:
            target = self.schema.field(name).type
            if name == "offset":
                arrays.append(pa.Array.from_buffers(target, n, [None, pa.py_buffer(cols.offset)]))
            elif name == "timestamp_ns":
                arrays.append(pa.Array.from_buffers(target, n, [None, pa.py_buffer(cols.timestamp_ns)]))
            elif name == "timestamp":
                zero = cols.timestamp_ns == ZERO_TIMESTAMP
                us = np.floor_divide(cols.timestamp_ns, 1000)
                nulls = int(zero.sum())
                validity = pa.py_buffer(np.packbits(~zero, bitorder="little")) if nulls else None
                arrays.append(pa.Array.from_buffers(target, n, [validity, pa.py_buffer(us)], null_count=nulls))
            elif name == "type":
                arrays.append(pa.Array.from_buffers(target, n, [None, pa.py_buffer(cols.type.astype(np.int16))]))
            elif name == "key":
                arrays.append(_binary(pa, target, n, cols.key_offsets, cols.key_data))
            elif name == "value":
                if value_array is None:
                    value_array = _binary(pa, target, n, cols.value_offsets, cols.value_data)
                arrays.append(value_array)
            elif name == "shard":
                encoded = self.shard.encode()
                offsets = np.arange(0, (n + 1) * len(encoded), max(1, len(encoded)), dtype=np.int32)[: n + 1]
                if not encoded:
                    offsets = np.zeros(n + 1, np.int32)
                data = np.frombuffer(encoded * n, np.uint8) if encoded else np.zeros(0, np.uint8)
                arrays.append(pa.Array.from_buffers(target, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]))
            elif name in ("body", "attributes"):
                if envelopes is None:
                    envelopes = np.flatnonzero(cols.type == ENVELOPE_TYPE)
                if not len(envelopes):
                    if name == "body":
                        if value_array is None:
                            value_array = _binary(pa, target, n, cols.value_offsets, cols.value_data)
                        arrays.append(value_array)
                    else:
                        arrays.append(pa.nulls(n, target))
                else:
                    arrays.append(_envelope_column(pa, name, target, cols, envelopes))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _binary(pa, target, n: int, offsets, data):
    return pa.Array.from_buffers(target, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _envelope_column(pa, name: str, target, cols: Columns, envelopes: np.ndarray):
    """``body`` or ``attributes`` for a chunk that holds type 0xE0 messages (the slow path). A
    value without a readable envelope (no ``JQ1`` magic, damaged metadata) is a plain message:
    its body is the value and it has no attributes (NULL), as the queue layer reads it."""
    from journalq.queue import envelope as env

    n = len(cols)
    is_envelope = np.zeros(n, np.bool_)
    is_envelope[envelopes] = True
    out: list = []
    for i in range(n):
        value = cols.value(i)
        decoded = env.decode(ENVELOPE_TYPE, value) if is_envelope[i] else None
        if decoded is None or decoded.body is value or len(decoded.body) == len(value):
            out.append(value if name == "body" else None)
        elif name == "body":
            out.append(decoded.body)
        else:
            out.append(
                [
                    (key, base64.b64encode(a.value).decode() if isinstance(a.value, bytes) else a.value)
                    for key, a in decoded.attributes.items()
                ]
            )
    return pa.array(out, type=target)


def read_range(r: ShardRange, spec: ReadSpec) -> Iterator:
    """The Arrow record batches of one partition."""
    conditions = spec.conditions if spec.prune else []
    start, end = r.start, r.end
    if conditions:
        if not predicates.shard_allowed(conditions, r.shard):
            return
        low, high = predicates.offset_bounds(conditions)
        start, end = max(start, low), end if high is None else min(end, high)
    if start >= end:
        return
    builder = BatchBuilder(spec, r.shard)
    rows = predicates.needs_rows(conditions)
    for cols in iter_columns(
        r.path, start, end, keys=builder.keys, values=builder.values, fail_on_data_loss=spec.fail_on_data_loss,
        max_rows=builder.max_rows,
    ):
        if rows:
            mask = predicates.row_mask(conditions, cols.offset, cols.timestamp_ns, cols.type)
            if mask is not None:
                if not mask.any():
                    continue
                if not mask.all():
                    cols = cols.select(mask)
        yield builder.batch(cols)

