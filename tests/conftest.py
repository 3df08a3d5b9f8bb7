"""Shared fixtures: the sej test vectors written by the Go reference implementation.

The vectors live beside the repository, in ``<repo>/../shared/vectors/sej`` (CI clones the repo
with ``shared/`` next to it). They are read-only: tests that write (a ``Writer``, a seek that
rebuilds an index, a reader offset) work on a copy made by ``copy_vector``.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import itertools
import json
import os
import shutil
import signal
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from journalq.errors import ZERO_TIMESTAMP
from journalq.journal import Scanner, Writer
from journalq.journal.codec import Message

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
VECTORS = Path(__file__).resolve().parents[1].parent / "shared" / "vectors" / "sej"


@pytest.fixture(scope="session")
def sej_vectors() -> Path:
    """The directory of the sej vectors; a clear failure (not a skip) when it is missing."""
    if not (VECTORS / "plain").is_dir():
        pytest.fail(
            f"sej test vectors not found at {VECTORS}: the repository's parent directory must hold "
            "shared/vectors/sej (clone the repo with shared/ beside it)",
            pytrace=False,
        )
    return VECTORS


def load_expected(path: Path) -> list[dict]:
    """The lines of an ``.expected.jsonl`` file, with key/value decoded and the zero time mapped."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            ts = row["timestamp_ns"]
            rows.append(
                {
                    "dir": row.get("dir"),
                    "message": Message(
                        offset=row["offset"],
                        timestamp_ns=ZERO_TIMESTAMP if ts is None else ts,
                        type=row["type"],
                        key=base64.b64decode(row["key_b64"]),
                        value=base64.b64decode(row["value_b64"]),
                    ),
                }
            )
    return rows


@pytest.fixture(scope="session")
def expected_plain(sej_vectors: Path) -> list[Message]:
    return [r["message"] for r in load_expected(sej_vectors / "plain.expected.jsonl")]


@pytest.fixture(scope="session")
def expected_torn(sej_vectors: Path) -> list[Message]:
    return [r["message"] for r in load_expected(sej_vectors / "torn.expected.jsonl")]


@pytest.fixture(scope="session")
def expected_sharded(sej_vectors: Path) -> dict[str, list[Message]]:
    by_dir: dict[str, list[Message]] = {}
    for r in load_expected(sej_vectors / "sharded.expected.jsonl"):
        by_dir.setdefault(r["dir"], []).append(r["message"])
    return by_dir


@pytest.fixture
def copy_vector(sej_vectors: Path, tmp_path: Path):
    """``copy_vector("plain")``: a writable copy of a vector directory, under ``tmp_path``.

    Only what the Go implementation wrote is copied (``*.jnl``, ``*.ofs``): journalq's ``.idx``
    files are left out, so a test starts from exactly what sej left on disk.
    """

    def copy(name: str) -> Path:
        dest = tmp_path / "vectors" / name
        shutil.copytree(
            sej_vectors / name,
            dest,
            ignore=shutil.ignore_patterns("*.idx", "*.tmp"),
            copy_function=shutil.copyfile,
        )
        for root, dirs, files in os.walk(dest):
            for entry in dirs + files:
                p = Path(root) / entry
                p.chmod(p.stat().st_mode | stat.S_IWUSR | stat.S_IRUSR | (stat.S_IXUSR if p.is_dir() else 0))
        Path(dest).chmod(0o755)
        return dest

    return copy


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def vectors_untouched():
    """Fails the test if it created, changed or removed anything in the shared vectors."""
    before = _snapshot(VECTORS) if VECTORS.is_dir() else None
    yield
    if before is not None:
        after = _snapshot(VECTORS)
        changed = sorted(set(before) ^ set(after) | {k for k in before if k in after and before[k] != after[k]})
        assert not changed, f"the test wrote into the read-only vectors at {VECTORS}: {changed}"


@pytest.fixture
def child_env() -> dict[str, str]:
    """Environment for a child Python process that imports this checkout's journalq."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


# -- the two stores of the queue layer ---------------------------------------------------------

STORES = ["files", "zookeeper"]
RACES = 25
"""Races a ZooKeeper store's call is made to lose in a row: more than any fixed number of tries
would take (a delete once gave up after 10)."""
_zk_paths = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "files_only(reason): a queue test that only makes sense on the file-system store"
    )
    # A shell without job control starts a background job (`pytest &`) with SIGINT ignored, and
    # children inherit that: a Python child then never installs its KeyboardInterrupt handler, and
    # the tests that stop a command with SIGINT, as Ctrl-C does, would wait for it in vain.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def own_zookeeper(data: Path | None = None) -> Iterator[Any]:
    """A real ZooKeeper server on loopback (``ZooKeeperServer``: data in ``data``, or a temporary
    directory), stopped at the end; the test is skipped when none can run here. For tests that
    freeze, kill or restart it, and for the session's."""
    try:
        import kazoo  # noqa: F401
    except ImportError:
        pytest.skip("kazoo is not installed (pip install -e '.[zookeeper]')")
    from journalq.queue.zookeeper.server import ZooKeeperServer

    reason = ZooKeeperServer.available()
    if reason is not None:
        pytest.skip(f"no ZooKeeper server can run here: {reason}")
    with ZooKeeperServer(data) as server:
        yield server


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[object]:
    """A real ZooKeeper server on loopback for the whole session (skips when none can run)."""
    with own_zookeeper() as server:
        yield server


@pytest.fixture(params=STORES)
def store_root(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where a ``Broker`` keeps its queues: a fresh data directory, or a fresh path on the
    session's ZooKeeper server (``zk://127.0.0.1:PORT/tNNN``)."""
    if request.param == "files":
        return tmp_path / "data"
    marker = request.node.get_closest_marker("files_only")
    if marker is not None:
        pytest.skip(f"file-system store only: {marker.args[0] if marker.args else marker.kwargs['reason']}")
    server = request.getfixturevalue("zookeeper_server")
    return server.url(f"/t{os.getpid()}x{next(_zk_paths)}")


class SyncFault:
    """The journal writer's next ``fdatasync`` fails with EIO once ``armed`` is set (then it is
    unset again); ``count``: the failures made so far."""

    def __init__(self) -> None:
        self.armed = False
        self.count = 0


@pytest.fixture
def sync_fault(monkeypatch: pytest.MonkeyPatch) -> SyncFault:
    import journalq.journal.writer as writer_mod

    fault = SyncFault()
    real_fdatasync = writer_mod.fdatasync

    def fdatasync(fd: int) -> None:
        if fault.armed:
            fault.armed = False
            fault.count += 1
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fdatasync(fd)

    monkeypatch.setattr(writer_mod, "fdatasync", fdatasync)
    return fault


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real full disk, where it can be had: a 2 MiB tmpfs (needs root), unmounted after."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); "
                    "the fault-injecting in-process tests cover a full disk instead")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)
        if os.path.ismount(mount_point):
            subprocess.run(["umount", "-l", str(mount_point)], check=False)


def returned_at_once(call: Any, seconds: float = 5.0) -> Any:
    """What ``call()`` returns or raises, which it must do within ``seconds`` (a call that would
    block for ever fails the test instead of hanging it)."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, "blocked"
    return outcome[0]


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many records of Spark's commit logs (``journalq.spark.writing.CommitLog``) were decoded."""
    from journalq.spark.writing import CommitLog

    count = [0]
    real = CommitLog._record

    def counting(self: Any, value: Any, offset: Any) -> Any:
        count[0] += 1
        return real(self, value, offset)

    monkeypatch.setattr(CommitLog, "_record", counting)
    return count


def counted_lookups(topic: Any) -> list[int]:
    """The offsets that ``topic.message`` is asked for from now on (the messages a receive looks
    at under the hold), in order: the topic's lookup is wrapped to note them."""
    asked: list[int] = []
    real = topic.message

    def counted(offset: int) -> Any:
        asked.append(offset)
        return real(offset)

    topic.message = counted
    return asked


@contextlib.contextmanager
def fifo_at(path: Path) -> Iterator[Path]:
    """A named pipe at ``path`` (a file there replaced); afterwards an open of it blocked by the
    code under test (before its fix) is let go, whichever end it waits for."""
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    try:
        yield path
    finally:
        for other_end in (os.O_WRONLY, os.O_RDONLY):
            with contextlib.suppress(OSError):
                os.close(os.open(path, other_end | os.O_NONBLOCK))


def size_past_the_end(path: Path, damaged: int, count: int = 2000) -> Path:
    """A journal of ``count`` 100-byte messages (several index entries) whose message ``damaged``
    has a value length that reaches past the segment's end; its segment."""
    with Writer(path) as writer:
        writer.append_many([b"%04d" % i + b"x" * 96 for i in range(count)])
    segment = path / "jnl" / "0000000000000000.jnl"
    data = bytearray(segment.read_bytes())
    at = damaged * (len(data) // count)
    data[at + 18 : at + 22] = (0x7FFFFF00).to_bytes(4, "big")
    segment.write_bytes(bytes(data))
    return segment


def small_journal(path: Path, count: int = 5) -> None:
    """``count`` messages of 46 bytes in segments of 100 bytes (three messages each)."""
    with Writer(path, segment_size=100) as writer:
        for i in range(count):
            writer.append(b"v%019d" % i)


def journal_values(path: Path) -> list[bytes]:
    """The values of the journal at ``path``, from its first offset to its end."""
    with Scanner(path) as scanner:
        return [m.value for m in scanner]


def write_numbered(path: Path, count: int, segment_size: int = 2500) -> None:
    """A journal at ``path`` of ``count`` messages ``value-0``, ``value-1``, ..."""
    with Writer(path, segment_size=segment_size) as writer:
        writer.append_many([b"value-%d" % i for i in range(count)])


def shard_of(id_or_receipt: str) -> int:
    """The index of the shard that a sharded queue's message id or receipt names."""
    return int(id_or_receipt.split(".", 1)[0])


def synced_paths(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ``os.fsync`` is called on from now on (read from the file descriptors)."""
    synced: list[str] = []
    fsync = os.fsync

    def noting(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", noting)
    return synced
