"""The README's examples, run as written, so that they cannot rot unseen.

Each fenced ```python block runs in a fresh directory (its relative paths, ``data/...``, land there);
one whose ``http://127.0.0.1:8080`` names the server gets a real ``journalq serve`` on a free port
instead, and a ``zk://`` URL the session's ZooKeeper server. A fenced ```sh block marked
``<!-- readme-test: run -->`` runs line by line in bash (its ``journalq serve`` line starts the server,
its ``curl`` lines are checked for the status their comment gives, a comment that is JSON is the
output expected, and the sample values listed in ``SAMPLES`` stand for what an earlier line printed).
Every ``journalq`` command line of the README, in its blocks and its inline code, names a command that
exists and options that it takes; bench/README.md's commands name scripts, benchmarks and options
that exist; the "Layout" table names every module of each package, and only those. A marker comment
on the line before a block changes what is done with it: ``<!-- readme-test: skip (why) -->`` skips
it, ``<!-- readme-test: continues -->`` runs a python block after the block before it, in the same
namespace. A failure names the README's line.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
from test_server_harness import JOURNALQ, REPO, ServerProcess, start_server  # noqa: F401 - a fixture of these tests

from journalq.cli.main import cli
from journalq.closing import Closing

README = REPO / "README.md"
BENCH_README = REPO / "bench" / "README.md"
MARKER = re.compile(r"<!--\s*readme-test:\s*(.*?)\s*-->")
SERVER_ADDRESS = re.compile(r"(?:http://)?(?:127\.0\.0\.1|localhost):8080")
ZK_URL = re.compile(r"zk://[^\s\"']+")
# Files that the shell examples read, made in their directory first.
INPUT_FILES = {"lines.txt": b"resize 2.jpg\nresize 3.jpg\n", "photo.jpg": bytes(range(256))}
# Sample values in the shell examples, each standing for what an earlier line printed (all its matches,
# in a line's arguments): the id of a message posted, the receipts of a receive.
SAMPLES = {
    "0.1a2b3c4d": re.compile(r"(?im)^x-message-id: (\S+)"),
    "RECEIPT...": re.compile(r'"receipt":"([^"]+)"'),
}


@dataclass(frozen=True)
class Block:
    """A fenced code block: where its first line is, its language, its text, and its marker."""

    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str  # "" or what the readme-test comment before the fence says

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"

    def lines(self) -> Iterator[tuple[int, str]]:
        """(README line, text) of each line of the block."""
        for number, text in enumerate(self.text.splitlines(), self.line + 1):
            yield number, text


def fenced_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        opening = re.match(r"```(\w*)\s*$", lines[i])
        if opening is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.search(before)
        blocks.append(Block(path, i + 1, opening[1], "\n".join(lines[i + 1 : end]) + "\n", marker[1] if marker else ""))
        i = end + 1
    return blocks


BLOCKS = fenced_blocks(README)
PYTHON = [b for b in BLOCKS if b.lang == "python"]
SH_RUN = [b for b in BLOCKS if b.lang == "sh" and b.marker == "run"]


def skip_if_marked(block: Block) -> None:
    if block.marker.startswith("skip"):
        pytest.skip(f"{block.where}: {block.marker}")


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JOURNALQ_DATA", raising=False)
    return tmp_path


def test_the_markers_are_ones_the_test_knows() -> None:
    """A misspelt marker would be ignored, and its block run or skipped against the README's word."""
    known = re.compile(r"run|continues|skip \(.+\)")
    bad = [
        f"README.md:{n}: {m[1]!r}"
        for n, line in enumerate(README.read_text().splitlines(), 1)
        if (m := MARKER.search(line)) and not known.fullmatch(m[1])
    ]
    assert not bad, bad


# -- the python blocks ----------------------------------------------------------------------------


@pytest.mark.parametrize("block", PYTHON, ids=[b.where for b in PYTHON])
def test_python_block(block: Block, in_tmp: Path, request: pytest.FixtureRequest) -> None:
    skip_if_marked(block)
    chain = [block]
    while chain[0].marker == "continues":
        chain.insert(0, PYTHON[PYTHON.index(chain[0]) - 1])
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    for part in chain:
        source = part.text
        if SERVER_ADDRESS.search(source):
            server = request.getfixturevalue("start_server")(data=in_tmp / "server-data")
            source = SERVER_ADDRESS.sub(server.url, source)
        if ZK_URL.search(source):
            zookeeper = request.getfixturevalue("zookeeper_server")
            source = ZK_URL.sub(zookeeper.url(f"/readme{os.getpid()}x{part.line}"), source)
        # Compiled as the README's lines, so that a traceback names the README line that failed.
        code = compile("\n" * part.line + source, str(README), "exec")
        try:
            exec(code, namespace)
        except Exception as exc:
            raise AssertionError(f"{part.where}: the python block failed: {exc!r}") from exc
        finally:
            if part is chain[-1]:  # what the blocks left open (a broker used after its with, say)
                for value in namespace.values():
                    if isinstance(value, Closing):
                        value.close()


# -- the shell blocks that run ----------------------------------------------------------------------


def split_comment(line: str) -> tuple[str, str]:
    """A shell line's command and its trailing comment (what it prints, say)."""
    command, sep, comment = line.partition("  # ")
    if not sep:
        command, _, comment = line.partition(" # ")
    return command.rstrip(), comment.strip()


@dataclass
class ShellRun:
    """The state of one sh block's run: its directory, its server, the sample values learnt."""

    cwd: Path
    start: Callable[..., ServerProcess]
    server: ServerProcess | None = None
    learnt: dict[str, str] | None = None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{JOURNALQ.parent}{os.pathsep}{env.get('PATH', '')}"
        env.pop("JOURNALQ_DATA", None)
        return env

    def serve(self, command: str) -> None:
        """``journalq serve --data D --port P [options]``: the test's server, with those options."""
        args = shlex.split(command)[2:]
        data = self.cwd / "data"
        options = []
        while args:
            arg = args.pop(0)
            if arg in ("--data", "--port"):
                value = args.pop(0)
                if arg == "--data":
                    data = self.cwd / value
            else:
                options.append(arg)
        self.server = self.start(*options, data=data)

    def run(self, where: str, line: str) -> None:
        command, comment = split_comment(line)
        if command.startswith("journalq serve"):
            self.serve(command)
            return
        if SERVER_ADDRESS.search(command):
            if self.server is None:
                self.server = self.start(data=self.cwd / "data")
            command = SERVER_ADDRESS.sub(self.server.url, command)
        command = re.sub(r"\s*\[[^\]]*\]", "", command)  # optional parts: run without them
        for sample, value in (self.learnt or {}).items():
            command = command.replace(sample, value)
        answer = self.cwd / ".answer"
        curl = command.startswith("curl ")
        if curl:
            command += f" --silent --output {answer} --write-out '%{{http_code}}'"
        done = subprocess.run(["bash", "-c", command], cwd=self.cwd, env=self.env(), capture_output=True, timeout=60)
        out = done.stdout.decode(errors="replace")
        said = f"{where}: `{line.strip()}` (run as `{command}`)"
        assert done.returncode == 0, f"{said}: exit status {done.returncode}; {done.stderr.decode(errors='replace')}"
        if curl:
            status, out = out, answer.read_text(errors="replace")
            expected = re.match(r"\d{3}\b", comment)
            if expected:
                assert status == expected[0], f"{said}: status {status}, not {expected[0]}; {out}"
        elif comment.startswith("{"):
            assert [json.loads(x) for x in out.splitlines()] == [json.loads(comment)], f"{said}: printed {out!r}"
        for sample, pattern in SAMPLES.items():
            found = pattern.findall(out)
            if found:
                self.learnt = {**(self.learnt or {}), sample: " ".join(dict.fromkeys(found))}


@pytest.mark.parametrize("block", SH_RUN, ids=[b.where for b in SH_RUN])
def test_shell_block(block: Block, in_tmp: Path, start_server: Callable[..., ServerProcess]) -> None:  # noqa: F811
    if re.search(r"(?m)^curl ", block.text) and shutil.which("curl") is None:
        pytest.skip(f"{block.where}: its curl lines need curl")
    for name, content in INPUT_FILES.items():
        (in_tmp / name).write_bytes(content)
    shell = ShellRun(in_tmp, start_server)
    for number, line in block.lines():
        if line.strip() and not line.lstrip().startswith("#"):
            shell.run(f"{block.path.name}:{number}", line)


# -- every journalq command named, and the benchmarks' commands -----------------------------------------


def command_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line, command) of each ``journalq`` command in the sh blocks (continuation lines joined) and in
    inline code."""
    for block in fenced_blocks(path):
        if block.lang != "sh" or block.marker.startswith("skip"):
            continue
        current: tuple[int, str] | None = None
        for number, line in block.lines():
            command = split_comment(line)[0]
            if current and (current[1].endswith("\\") or (line.startswith(" ") and command.strip())):
                current = (current[0], current[1].rstrip("\\") + " " + command.strip())
                continue
            if current:
                yield current
            current = (number, command) if command.startswith("journalq ") else None
        if current:
            yield current
    in_blocks = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_blocks = not in_blocks
        elif not in_blocks:
            for span in re.findall(r"`(journalq [^`]+)`", line):
                yield number, span


def option_problems(command: str) -> list[str]:
    """What in ``journalq ...`` names no command or an option its command does not take."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    node: click.Command = cli
    path = ["journalq"]
    rest = words[1:]
    while isinstance(node, click.Group) and rest:
        names = [n for n in rest[0].split("|") if n and n != "..."]
        if not names or not all(re.fullmatch(r"[a-z][a-z-]*", n) for n in names):
            break
        missing = [n for n in names if n not in node.commands]
        if missing:
            return [f"`{' '.join(path)}` has no command {', '.join(missing)}"]
        if len(names) > 1:  # alternatives: each exists; their options are not named here
            return []
        node = node.commands[names[0]]
        path.append(names[0])
        rest = rest[1:]
    takes = {"-h", "--help"}
    for param in node.params:
        takes.update(param.opts)
        takes.update(param.secondary_opts)
    options = [m[1] for word in rest if (m := re.match(r"[\[(]?(--?[A-Za-z][-A-Za-z]*)", word))]
    return [f"`{' '.join(path)}` takes no option {option}" for option in options if option not in takes]


def test_every_journalq_command_in_the_readme_exists_with_its_options() -> None:
    problems = [f"README.md:{n}: {p}" for n, command in command_lines(README) for p in option_problems(command)]
    assert not problems, "\n".join(problems)


def test_the_option_check_finds_what_is_not_there() -> None:
    assert option_problems("journalq queue send jobs x --delay 1 --file f") == []
    assert option_problems("journalq queue send jobs x --dleay 1") == ["`journalq queue send` takes no option --dleay"]
    assert option_problems("journalq queue sned jobs") == ["`journalq queue` has no command sned"]
    assert option_problems("journalq hub serve|push|pull") == ["`journalq hub` has no command pull"]


def test_the_benchmarks_commands_exist() -> None:
    problems = []
    helps: dict[str, str] = {}
    for number, line in enumerate(BENCH_README.read_text().splitlines(), 1):
        match = re.match(r"\s*\.venv/bin/python (bench/\S+\.py)(.*)", line)
        if match is None:
            continue
        script, args = match[1], split_comment(match[2])[0].split()
        if not (REPO / script).exists():
            problems.append(f"bench/README.md:{number}: no {script}")
            continue
        if script not in helps:
            done = subprocess.run([sys.executable, script, "--help"], cwd=REPO, capture_output=True, text=True)
            helps[script] = done.stdout
        text = helps[script]
        names = re.search(r"benchmarks to run:(.*?)\n\s*\n", text, re.S)
        for arg in args:
            if arg.startswith("-"):
                if not re.search(rf"(?m)^\s+{re.escape(arg)}\b", text):
                    problems.append(f"bench/README.md:{number}: {script} takes no option {arg}")
            elif names is not None and not arg.isdigit() and arg not in re.split(r"[,\s]+", names[1]):
                problems.append(f"bench/README.md:{number}: {script} has no benchmark {arg}")
    assert helps, "bench/README.md names no bench/ command"
    assert not problems, "\n".join(problems)


def test_the_layout_table_names_every_module_and_only_modules_there_are() -> None:
    """Each package's row in "## Layout" names its modules (and sub-packages, ``name/``): one added
    or renamed without the table saying so is reported, as is a name the table gives that is no
    module of the package (``journalq``, the command's name, aside)."""
    text = README.read_text()
    table = text[text.index("## Layout") : text.index("## Tests and benchmarks")]
    src = REPO / "src"
    problems = []
    rows = re.findall(r"(?m)^\| `(journalq\.\w+)` \| (.*) \|$", table)
    assert rows, "no package rows under ## Layout"
    for package, description in rows:
        base = src / package.replace(".", "/")
        named = {n.rstrip("/") for n in re.findall(r"`([a-z][a-z0-9_]*/?)`", description)} - {"journalq"}
        for dotted in re.findall(r"`(journalq\.[a-z_.]+)`", description):
            named.add(dotted)
            if not (src / (dotted.replace(".", "/") + ".py")).exists() and dotted != "journalq.Error":
                problems.append(f"{package}: `{dotted}` is no module")
        if not base.is_dir():
            continue
        there = {p.stem for p in base.glob("*.py")} | {p.name for p in base.iterdir() if (p / "__init__.py").exists()}
        everywhere = {p.stem for p in base.rglob("*.py")}
        problems += [f"{package}: `{n}` is no module of it" for n in sorted(named - everywhere - there) if "." not in n]
        problems += [f"{package}: its module `{n}` is not in the table" for n in sorted(there - named - {"__init__"})]
    assert not problems, "README.md, ## Layout:\n" + "\n".join(problems)
