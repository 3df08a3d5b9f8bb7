"""A hub and two clients on loopback, as processes: the hub is SIGKILLed and restarted, clients
are SIGKILLed and restarted, and connections are cut mid-transfer, many times, while writers keep
appending; at the end every copy on the hub is byte-identical to its source, segment by segment.
The sharded sej vector is pushed with the command line and compared byte for byte."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from hub_processes import (
    JOURNALQ,
    Client,
    CuttingProxy,
    child_env,
    free_port,
    journal_pairs,
    kill,
    run_scenario,
    segment_files,
    start_hub,
    wait_until,
    writer_command,
)
from journalq.journal import Writer
from journalq.shard import ShardedWriter


def hub_answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/hub/v1/status", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def seed_journals(base: Path) -> None:
    """The journals exist before the clients start (a root of shards: every shard)."""
    with Writer(base / "orders", segment_size=24 * 1024) as writer:
        writer.append(b"first")
    with ShardedWriter(base / "events", prefix="events", bit=2, segment_size=24 * 1024) as sharded:
        for key in range(40):
            sharded.append(b"first", key=b"k%d" % key)


@pytest.mark.slow
def test_kills_and_cuts_while_writers_append_leave_every_copy_byte_identical(tmp_path: Path) -> None:
    hub_root, logs = tmp_path / "hub", tmp_path / "logs"
    logs.mkdir()
    for name in ("c1", "c2"):
        seed_journals(tmp_path / name)
    port = free_port()
    proxy = CuttingProxy(("127.0.0.1", port), chaos=0.15)
    url = f"http://127.0.0.1:{proxy.address[1]}"
    clients = [Client(c, [tmp_path / c / "orders", tmp_path / c / "events"], url) for c in ("c1", "c2")]
    stop = tmp_path / "stop"
    writers = [
        writer_command([tmp_path / c / "orders"], [tmp_path / c / "events"], stop, 600, seed)
        for seed, c in enumerate(("c1", "c2"))
    ]
    try:
        done = run_scenario(
            hub_root=hub_root,
            log_dir=logs,
            start_the_hub=lambda: start_hub(hub_root, "127.0.0.1", port, logs),
            hub_ready=lambda: hub_answers(f"http://127.0.0.1:{port}"),
            clients=clients,
            writers=writers,
            stop_file=stop,
            cut=proxy.cut_all,
            rounds=12,
            seed=11,
        )
    finally:
        proxy.close()
    assert done["hub killed"] >= 3 and done["client killed"] >= 3 and done["connections cut"] >= 3
    assert proxy.mid_transfer_cuts >= 1, "the proxy never cut a connection mid-transfer"
    pairs = journal_pairs(hub_root, clients)
    assert len(pairs) == 10
    for source, copy in pairs:
        files = segment_files(source)
        assert len(files) > 1, f"{source} did not grow past one segment: the test would prove little"
        assert segment_files(copy) == files, f"{copy} differs from {source}"
    pushed = sum(len(segment_files(s)) for s, _ in pairs)
    print(
        f"{done}, {proxy.cuts} connections cut in all ({proxy.mid_transfer_cuts} mid-transfer), "
        f"{pushed} segments compared"
    )


@pytest.mark.usefixtures("vectors_untouched")
def test_the_sharded_vector_is_pushed_byte_for_byte(tmp_path: Path, sej_vectors: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    hub = start_hub(tmp_path / "hub", "127.0.0.1", port, tmp_path)
    try:
        wait_until("the hub to answer", lambda: hub_answers(url), 30)
        sharded = sej_vectors / "sharded"
        pushed = subprocess.run([*JOURNALQ, "hub", "push", "--to", url, "--client-id", "gohost", "--once",
                                 str(sharded)], capture_output=True, env=child_env(), timeout=60)
        assert pushed.returncode == 0, pushed.stderr.decode()
        assert b'"event":"caught-up"' in pushed.stdout
        for shard in sorted(sharded.iterdir()):
            copy = tmp_path / "hub" / f"gohost.{shard.name}"
            assert segment_files(copy) == segment_files(shard) and segment_files(shard)
        status = subprocess.run([*JOURNALQ, "hub", "status", "--hub", url, "--client-id", "gohost",
                                 "--format", "jsonl", str(sharded)],
                                capture_output=True, env=child_env(), timeout=30, text=True)
        assert status.returncode == 0, status.stderr
        assert status.stdout.count('"lag":0') == 4 and '"client_id":"gohost","journal":"events.2.003"' in status.stdout
        got = subprocess.run([*JOURNALQ, "hub", "get", "--hub", url, "--client-id", "gohost", "events.2.001", "2",
                              "--count", "2"], capture_output=True, env=child_env(), timeout=30, text=True)
        assert got.returncode == 0 and [line[:12] for line in got.stdout.splitlines()] == [
            '{"offset":2,', '{"offset":3,'
        ]
        # A progress bar when asked for one (as on a terminal).
        copy_root = tmp_path / "mine"
        shutil.copytree(sharded, copy_root)
        bar = subprocess.run([*JOURNALQ, "hub", "push", "--to", url, "--client-id", "bar", "--once", "--progress",
                              "bar", str(copy_root)], capture_output=True, env=child_env(), timeout=60, text=True)
        assert bar.returncode == 0 and "lag 0" in bar.stdout and "msg/s" in bar.stdout
    finally:
        kill(hub)


def test_push_refusals_are_one_line_errors(tmp_path: Path) -> None:
    with Writer(tmp_path / "j") as writer:
        writer.append(b"x")
    bad_id = subprocess.run([*JOURNALQ, "hub", "push", "--to", "http://127.0.0.1:9", "--client-id", "a.b", "--once",
                             str(tmp_path / "j")], capture_output=True, env=child_env(), timeout=30, text=True)
    assert bad_id.returncode == 2  # a usage error, as hub status says it
    assert bad_id.stderr.startswith("journalq: error: Invalid value for '--client-id': client id 'a.b'")
    no_journal = subprocess.run([*JOURNALQ, "hub", "push", "--to", "http://127.0.0.1:9", "--client-id", "a", "--once",
                                 str(tmp_path / "nothing")],
                                capture_output=True, env=child_env(), timeout=30, text=True)
    assert no_journal.returncode == 1 and "no such directory" in no_journal.stderr
    started = time.monotonic()
    unreachable = subprocess.run([*JOURNALQ, "hub", "push", "--to", "http://127.0.0.1:9", "--client-id", "a", "--once",
                                  "--give-up-after", "1", str(tmp_path / "j")], capture_output=True, env=child_env(),
                                 timeout=30, text=True)
    assert unreachable.returncode == 1 and "gave up after 1 s" in unreachable.stderr
    assert '"event":"retry"' in unreachable.stdout and time.monotonic() - started < 20
