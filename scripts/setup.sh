#!/usr/bin/env bash
# Creates .venv/ in the project root and installs journalq (editable) with its test and benchmark tools
# and Spark (and a Java runtime for it when missing).
# Idempotent and quick when nothing changed: the install is redone only when pyproject.toml changes.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "journalq needs Python 3.11 or newer; $python is $("$python" --version 2>&1)" >&2
    exit 1
fi
# Spark (journalq.spark) needs a Java 17+ runtime: install one with apt-get only when missing or older.
java_major="$( (java -version 2>&1 || true) | sed -n 's/.*version "\(1\.\)\{0,1\}\([0-9]*\).*/\2/p' | head -n1)"
if [ -z "$java_major" ] || [ "$java_major" -lt 17 ]; then
    if command -v apt-get >/dev/null 2>&1; then
        sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openjdk-17-jre-headless
    else
        echo "warning: Spark needs Java 17 or newer; install it (no apt-get here)" >&2
    fi
fi
# The hub's test on separate hosts (tests/test_hub_netns.py) makes network namespaces with `ip`
# (iproute2) and checks listening ports with `ss`; it is skipped where they are missing.
if ! command -v ip >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 \
        || echo "warning: could not install iproute2; the hub's namespace test will be skipped" >&2
fi
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
stamp=.venv/.journalq-installed
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e '.[test,bench,spark]'
    echo "$want" > "$stamp"
fi
