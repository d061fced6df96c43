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
    {
        "evdb.demo",
        "evdb.torch",
        "evdb.offline",
        "evdb.convert",
        "evdb.io.export",
        "evdb.io.importer",
    }
    | {
        "evdb.torch_autograd",
        "evdb.torch_inputs",
        "evdb.torch_metrics",
        "evdb.torch_checkpoint",
    }  # the binding's parts
    | {"evdb.io.export_quantized"}  # the int8/int4 serving export's writer
    | {"evdb.distributed"}  # sharding: a layer above Database and Table (DESIGN)
    | {"evdb.sizing", "evdb.sizing_logs", "evdb.sizing_lru", "evdb.sizing_report"}  # tier sizing
    | {"evdb.__main__", "evdb.tools"},  # callers: the command line (tools/), tools, bindings
    {"evdb", "evdb.database", "evdb.storage", "evdb.checkpoint", "evdb.checkpoint_restore"}
    | {"evdb.manifest", "evdb.publish", "evdb.publish_root"}  # the facade, its files on disk
    | {"evdb.view", "evdb.view_overlay", "evdb.view_sample"}  # a publication's tables, read
    | {"evdb.quantized"},  # a quantised serving export's tables, read
    {"evdb.table"},  # Table, over its halves: training and direct writes,
    {"evdb.table_upkeep"},  # compaction, stats and persistence,
    {"evdb.table_scans"},  # whole-table reads,
    {"evdb.table_reads", "evdb.pulled", "evdb.strings", "evdb.table_meta"}  # point reads
    | {"evdb.neighbors", "evdb.sampling"},  # Table.neighbors' body; the dashboard's row sample
    {"evdb.dedup", "evdb.trace", "evdb.trace_format", "evdb.trace_sample"}  # key trace
    | {"evdb.sizing_kernels"},  # a table's scratch, key trace and its kernels
    {"evdb.tiers"},
    {"evdb.config", "evdb.admission", "evdb.bags", "evdb.hashindex", "evdb.arrays"}
    | {"evdb.changelog"},
    {"evdb.initializers", "evdb.optim", "evdb.keys", "evdb.records", "evdb.io"}
    | {"evdb.locking", "evdb.ttl"},  # the lock Database and Table take; the TTL verdict
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


# -- the house rules of the tier boundary (issue 27) ------------------------------------------
PROJECT = ROOT.parent
SOURCES = sorted(p for d in ("evdb", "api", "tools") for p in (PROJECT / d).rglob("*.py"))
BACKENDS = ("evdb.kernels.cpu", "evdb.kernels.reference", "evdb.kernels.gpu")


def _imported(path: Path) -> set[str]:
    """Every module a file imports, ``from a import b`` counted as both a and a.b (b may be
    a submodule: ``from evdb.kernels import cpu`` imports a backend)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else f"<relative>.{node.module}"
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _rel(path: Path) -> str:
    return path.relative_to(PROJECT).as_posix()


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_only_kernels_and_tiers_import_a_backend(path: Path) -> None:
    """Above the tiers, kernels are reached through the registry (``backend(name)``), so a
    table runs whatever backend its tiers were built with; api/ reaches no kernel at all."""
    rel = _rel(path)
    imported = _imported(path)
    if rel.startswith("api/"):
        bad = {m for m in imported if m.startswith("evdb.kernels")}
        assert not bad, f"{rel} imports {sorted(bad)}: api/ reads tables, it runs no kernel"
    if rel.startswith(("evdb/kernels/", "evdb/tiers/")):
        return
    bad = {m for m in imported if m.startswith(BACKENDS)}
    assert not bad, f"{rel} imports {sorted(bad)}: use evdb.kernels.backend(name)"


def test_the_chain_knows_roles_not_tiers() -> None:
    """The chain stacks any ``CacheTier`` over any ``Tier``: it imports no concrete tier."""
    imported = _imported(ROOT / "tiers" / "chain.py")
    concrete = ("evdb.tiers.cache", "evdb.tiers.dram", "evdb.tiers.hbm", "evdb.tiers.rocks")
    assert not {m for m in imported if m.startswith(concrete)}


def _private_reaches(path: Path) -> list[str]:
    """``x._name`` where x is not ``self``/``cls`` and ``_name`` is not an attribute this
    module itself assigns on ``self`` (a class's private state is touched only by the module
    that owns it, its own methods through ``self``)."""
    tree = ast.parse(path.read_text())
    own = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in ("self", "cls")
    }
    own |= {  # names defined at the top of a class of this module (class attributes, methods)
        t.id if isinstance(t, ast.Name) else getattr(t, "name", "")
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        for stmt in cls.body
        for t in (
            stmt.targets
            if isinstance(stmt, ast.Assign)
            else [stmt.target]
            if isinstance(stmt, ast.AnnAssign)
            else [stmt]
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
            else []
        )
    }
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            and node.attr not in own
        ):
            found.append(f"{_rel(path)}:{node.lineno} .{node.attr}")
    return found


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_no_module_reaches_into_another_ones_privates(path: Path) -> None:
    """A ``_private`` attribute or function is used only by the module that defines it:
    what the layers above need is public (``Table.records``, ``Database.check_open``...)."""
    assert not _private_reaches(path)
