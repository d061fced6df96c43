"""Imports go down only (STYLE.md section 0): kernels know arrays, tiers know records, only
Table knows the whole row. A wrong-way import fails here, the way an import-linter "layers"
contract would."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "evdb"

# Each layer may import the layers after it, never those before it.
LAYERS = [
    {"evdb.demo", "evdb.torch", "evdb.offline", "evdb.io.export", "evdb.io.importer"}
    | {"evdb.distributed"}  # sharding: a layer above Database and Table (DESIGN)
    | {"evdb.__main__", "evdb.tools"},  # callers: the command line (tools/), tools, bindings
    {"evdb", "evdb.database", "evdb.checkpoint"}  # "evdb" is the facade, for callers only
    | {"evdb.publish"},  # Database.publish's body, beside the checkpoint code it builds on
    {"evdb.table", "evdb.pulled", "evdb.strings"}  # Table, and the modules of its method bodies
    | {"evdb.reads", "evdb.writes", "evdb.maintenance", "evdb.table_meta"}
    | {"evdb.neighbors", "evdb.sampling"},  # Table.neighbors' body; the dashboard's row sample
    {"evdb.dedup"},
    {"evdb.tiers"},
    {"evdb.config", "evdb.admission", "evdb.bags", "evdb.hashindex", "evdb.arrays"}
    | {"evdb.changelog"},
    {"evdb.initializers", "evdb.optim", "evdb.keys", "evdb.records", "evdb.io"}
    | {
        "evdb.locking",
        "evdb.ttl",
    },  # the database's readers-writer lock, taken by Database and Table
    {"evdb.kernels"},
    {"evdb.errors", "evdb._types"},
]


def layer_of(module: str) -> int:
    for i, layer in enumerate(LAYERS):
        if any(module == m or (m != "evdb" and module.startswith(m + ".")) for m in layer):
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name != "evdb":
            out.append((name, path))
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:`` (annotations only, no import)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            continue
        yield node
        yield from _runtime_nodes(node)


def evdb_imports(path: Path) -> set[str]:
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("evdb"):
            found.update(
                f"{node.module}.{a.name}" if node.module == "evdb" else node.module
                for a in node.names
            )
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("evdb"))
    return found


@pytest.mark.parametrize("name,path", modules(), ids=[m for m, _ in modules()])
def test_imports_go_down_only(name: str, path: Path) -> None:
    mine = layer_of(name)
    for target in evdb_imports(path):
        if target == "evdb.init":
            target = "evdb.initializers"
        theirs = layer_of(target)
        assert theirs >= mine, f"{name} (layer {mine}) imports {target} (layer {theirs})"


def test_kernels_use_no_table_knowledge() -> None:
    for name, path in modules():
        if name.startswith("evdb.kernels"):
            allowed = ("evdb.kernels", "evdb.errors")
            bad = {t for t in evdb_imports(path) if not t.startswith(allowed)}
            assert not bad, f"{name} imports {bad}"
