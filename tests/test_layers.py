"""The layering of DESIGN.md, checked: a package imports only the layers below it (so that, say,
the journal stays usable, testable and fuzzable without the queue or the server)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "journalq"

# What each layer may import of journalq's other layers (DESIGN.md's table). Modules at the
# package's top (errors, closing) are shared by all; ``cli`` may import everything.
MAY_IMPORT = {
    "journal": set(),
    "shard": {"journal"},
    "queue": {"journal", "shard"},
    "hub": {"journal", "shard"},
    "server": {"journal", "shard", "queue", "hub"},
    "spark": {"journal", "shard", "queue"},
}


def _imports(file: Path) -> list[tuple[int, str]]:
    """(line, module) of every ``journalq.`` import in ``file``, at any depth (lazy ones too)."""
    found = []
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.startswith("journalq.")]
    return found


@pytest.mark.parametrize("layer", sorted(MAY_IMPORT))
def test_a_layer_imports_only_the_layers_below_it(layer: str) -> None:
    files = sorted((PACKAGE / layer).rglob("*.py"))
    assert files, f"no package journalq.{layer}"
    wrong = [
        f"{file.relative_to(PACKAGE)}:{line} imports {module}"
        for file in files
        for line, module in _imports(file)
        if (other := module.split(".")[1]) in MAY_IMPORT.keys() | {"cli"}
        and other != layer
        and other not in MAY_IMPORT[layer]
    ]
    assert not wrong, "\n".join(wrong)


def test_relative_imports_do_not_hide_a_layer_crossing() -> None:
    """The check above reads absolute imports: the package uses no relative ones."""
    relative = [
        f"{file.relative_to(PACKAGE)}:{node.lineno}"
        for file in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(file.read_text(), str(file)))
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]
    assert not relative, relative
