"""The crash test with the hub and each client on a host of its own: network namespaces joined
by veth pairs (``ip netns``), so that clients reach the hub over a real link, through a proxy on
the hub's host that cuts connections, and links that go down and up. Needs root and a kernel that
allows network namespaces; skipped otherwise, saying why."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub_processes import JOURNALQ, Client, child_env, journal_pairs, run_scenario, segment_files, writer_command
from test_hub_crash import seed_journals

HUB_PORT, PROXY_PORT = 8090, 8091


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _unavailable() -> str | None:
    if sys.platform != "linux":
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    if shutil.which("ip") is None or shutil.which("ss") is None:
        return "the ip and ss commands (iproute2) are not installed"
    probe = f"jqprobe{os.getpid()}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"this machine does not allow network namespaces: {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


@pytest.fixture
def hosts() -> Iterator[dict[str, str]]:
    """A hub host and two client hosts: namespaces, each client joined to the hub by a veth pair
    (10.77.N.1 on the hub's side, 10.77.N.2 on client N's)."""
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    tag = os.getpid() % 100_000
    names = {"hub": f"jqhub{tag}", "c1": f"jqc1x{tag}", "c2": f"jqc2x{tag}"}
    try:
        for ns in names.values():
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
        for n, client in ((1, "c1"), (2, "c2")):
            hub_end, client_end = f"jh{n}x{tag}", f"jc{n}x{tag}"
            ip("link", "add", hub_end, "type", "veth", "peer", "name", client_end)
            ip("link", "set", hub_end, "netns", names["hub"])
            ip("link", "set", client_end, "netns", names[client])
            ip("-n", names["hub"], "addr", "add", f"10.77.{n}.1/24", "dev", hub_end)
            ip("-n", names[client], "addr", "add", f"10.77.{n}.2/24", "dev", client_end)
            ip("-n", names["hub"], "link", "set", hub_end, "up")
            ip("-n", names[client], "link", "set", client_end, "up")
            names[f"link{n}"] = client_end
        yield names
    finally:
        for key in ("hub", "c1", "c2"):
            ip("netns", "del", names[key], check=False)


def in_ns(ns: str) -> list[str]:
    return ["ip", "netns", "exec", ns]


def listening(ns: str, port: int) -> bool:
    out = subprocess.run([*in_ns(ns), "ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, timeout=10)
    return bool(out.stdout.strip())


@pytest.mark.slow
def test_hub_and_clients_on_hosts_of_their_own(tmp_path: Path, hosts: dict[str, str]) -> None:
    hub_root, logs = tmp_path / "hub", tmp_path / "logs"
    logs.mkdir()
    for name in ("c1", "c2"):
        seed_journals(tmp_path / name)
    proxy = subprocess.Popen(
        [*in_ns(hosts["hub"]), sys.executable, str(Path(__file__).with_name("hub_processes.py")), "proxy",
         "--listen", f"0.0.0.0:{PROXY_PORT}", "--upstream", f"127.0.0.1:{HUB_PORT}", "--chaos", "0.15"],
        env=child_env(),
    )
    clients = [
        Client(
            c, [tmp_path / c / "orders", tmp_path / c / "events"], f"http://10.77.{n}.1:{PROXY_PORT}", in_ns(hosts[c])
        )
        for n, c in ((1, "c1"), (2, "c2"))
    ]
    stop = tmp_path / "stop"
    writers = [writer_command([tmp_path / c / "orders"], [tmp_path / c / "events"], stop, 600, seed)
               for seed, c in enumerate(("c1", "c2"))]
    rng = random.Random(5)

    def start_the_hub() -> subprocess.Popen:
        with open(logs / "hub.log", "ab") as out:
            return subprocess.Popen(
                [*in_ns(hosts["hub"]), *JOURNALQ, "hub", "serve", "--root", str(hub_root), "--host", "127.0.0.1",
                 "--port", str(HUB_PORT)], stdout=out, stderr=subprocess.STDOUT, env=child_env())

    def cut() -> None:
        """Reset every connection through the proxy, or take a client's link down for a while."""
        if rng.random() < 0.5:
            proxy.send_signal(signal.SIGUSR1)
        else:
            n = rng.choice((1, 2))
            ns = hosts[f"c{n}"]
            ip("-n", ns, "link", "set", hosts[f"link{n}"], "down")
            time.sleep(rng.uniform(0.2, 1.0))
            ip("-n", ns, "link", "set", hosts[f"link{n}"], "up")

    try:
        assert proxy.poll() is None
        done = run_scenario(
            hub_root=hub_root, log_dir=logs, start_the_hub=start_the_hub,
            hub_ready=lambda: listening(hosts["hub"], HUB_PORT) and listening(hosts["hub"], PROXY_PORT),
            clients=clients, writers=writers, stop_file=stop, cut=cut, rounds=9, seed=23,
        )
    finally:
        proxy.send_signal(signal.SIGTERM)
        proxy.wait(10)
    assert done["hub killed"] >= 2 and done["client killed"] >= 2 and done["connections cut"] >= 2
    pairs = journal_pairs(hub_root, clients)
    assert len(pairs) == 10
    for source, copy in pairs:
        files = segment_files(source)
        assert len(files) > 1 and segment_files(copy) == files, f"{copy} differs from {source}"
    print(done)
