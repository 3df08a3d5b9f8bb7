#!/usr/bin/env bash
# Creates .venv/ in the project root and installs journalq (editable) with its test and benchmark tools,
# Spark (and a Java runtime for it when missing) and the ZooKeeper store's kazoo (and Debian's ZooKeeper
# server for its tests when missing).
# Idempotent and quick when nothing changed: the install is redone only when pyproject.toml changes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "journalq needs Python 3.11 or newer; $python is $("$python" --version 2>&1)" >&2
    exit 1
fi
# apt_install WHY PACKAGE...: install Debian packages with apt-get, or say WHY they are needed.
apt_install() {
    local why="$1"; shift
    if command -v apt-get >/dev/null 2>&1; then
        local sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@"
    else
        echo "warning: $why; install $* (no apt-get here)" >&2
    fi
}
# Spark (journalq.spark) needs a Java 17+ runtime: install one with apt-get only when missing or older.
java_major="$( (java -version 2>&1 || true) | sed -n 's/.*version "\(1\.\)\{0,1\}\([0-9]*\).*/\2/p' | head -n1)"
if [ -z "$java_major" ] || [ "$java_major" -lt 17 ]; then
    apt_install "Spark needs Java 17 or newer" openjdk-17-jre-headless
fi
# The ZooKeeper store's tests start a real ZooKeeper server (journalq.queue.zookeeper.server): install
# Debian's zookeeper package only when its jar is missing (without it, those tests skip).
if [ ! -f /usr/share/java/zookeeper.jar ]; then
    apt_install "the ZooKeeper store's tests need a ZooKeeper server" zookeeper
fi
# The server benchmark's lean HTTP client (bench/server_load.py falls back to a Python one without it).
if ! command -v wrk >/dev/null 2>&1; then
    apt_install "the server benchmark prefers wrk" wrk \
        || echo "warning: wrk not installed; the server benchmark uses its Python client" >&2
fi
# bench/count_instructions.py counts a consumer's instructions with valgrind (a timing on a shared
# machine cannot see a change of a few per cent; a count can).
if ! command -v valgrind >/dev/null 2>&1; then
    apt_install "bench/count_instructions.py needs valgrind" valgrind \
        || echo "warning: valgrind not installed; bench/count_instructions.py will not run" >&2
fi
# The hub's test on separate hosts (tests/test_hub_netns.py) makes network namespaces with `ip`
# (iproute2) and checks listening ports with `ss`; it is skipped where they are missing.
if ! command -v ip >/dev/null 2>&1; then
    apt_install "the hub's test on separate hosts needs ip" iproute2 \
        || echo "warning: could not install iproute2; the hub's namespace test will be skipped" >&2
fi
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
stamp=.venv/.journalq-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e '.[test,bench,spark,zookeeper]'
    echo "$want" > "$stamp"
fi
