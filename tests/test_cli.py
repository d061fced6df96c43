"""The ``evdb`` command line, run as users run it: ``python -m evdb ...`` in a subprocess.

Each test checks the exit code (0 ok, 1 failure, 2 usage, 3 corrupt, 4 not found), that
``--json`` prints one JSON object on stdout and nothing else, and that an expected error is
one line on stderr without a traceback.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import evdb

ROOT = Path(__file__).resolve().parents[1]


def evdb_cli(*args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "evdb", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "100"},
    )


def ok_json(*args: object) -> dict[str, Any]:
    """Run a command with --json; it must succeed and print exactly one JSON object."""
    done = evdb_cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    out = json.loads(done.stdout)  # raises if stdout holds anything else
    assert isinstance(out, dict)
    return out


def fails(code: int, *args: object) -> str:
    """Run a command that must fail with code and one line on stderr; return that line."""
    done = evdb_cli(*args)
    assert done.returncode == code, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("evdb: error: "), done.stderr
    return lines[0]


def digest(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A database at step 10: "item" (ttl_steps=5) with 1000 rows written at step 0, of
    which 0..49 were written again at step 10 (so 950 have expired), and "user"."""
    path = tmp_path / "db"
    with evdb.open(path) as d:
        item = d.create_table("item", dim=4, ttl_steps=5, dram_rows=100)
        item.upsert(np.arange(1000), np.ones((1000, 4), dtype=np.float32))
        d.advance(10)
        item.upsert(np.arange(50), np.full((50, 4), 2.0, dtype=np.float32))
        d.create_table("user", dim=2).upsert([1, 2, 3], [[0.0, 0.0], [1.0, 0.0], [0.0, 3.0]])
    return path


def test_help_lists_the_commands_and_exit_codes() -> None:
    done = evdb_cli("--help")
    assert done.returncode == 0
    for command in ("info", "compact", "export", "import", "checkpoint", "verify", "warmup"):
        assert command in done.stdout
    assert "Exit codes" in done.stdout and "4  not found" in done.stdout
    assert "Exit codes" in evdb_cli("compact", "--help").stdout


def test_info_json(db: Path) -> None:
    out = ok_json("info", db)
    assert out["path"] == str(db) and out["step"] == 10 and out["checkpoint"] is None
    item = out["tables"]["item"]
    assert (item["dim"], item["key_type"], item["rows"]) == (4, "int64", 50)
    assert item["config"]["ttl_steps"] == 5
    assert item["stats"]["rows"] == 50
    assert out["tables"]["user"]["rows"] == 3


def test_info_human(db: Path) -> None:
    done = evdb_cli("info", db)
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[:4] == [f"path    {db}", "kind    database", "step    10", "tables  2"]
    header = next(i for i, line in enumerate(lines) if line.startswith("table "))
    assert lines[header + 1].split()[:4] == ["item", "4", "int64", "50"]


@pytest.mark.parametrize(
    "command",
    [
        ["info"],
        ["compact"],
        ["compact", "--dry-run"],
        ["verify"],
        ["checkpoint", "{tmp}/dest"],
        ["export", "{tmp}/dest", "--format", "npz"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_missing_path_is_not_found(tmp_path: Path, command: list[str]) -> None:
    missing = tmp_path / "missing"
    rest = [c.format(tmp=tmp_path) for c in command[1:]]
    line = fails(4, command[0], missing, *rest)
    assert str(missing) in line
    assert not missing.exists()  # never created
    assert list(tmp_path.iterdir()) == []


def test_unknown_table_is_not_found(db: Path) -> None:
    before = digest(db)
    assert "nope" in fails(4, "compact", db, "--table", "nope", "--dry-run")
    assert digest(db) == before
    assert "nope" in fails(4, "compact", db, "--table", "nope")
    with evdb.open(db, read_only=True) as d:
        assert d.tables() == ["item", "user"]


@pytest.mark.parametrize(
    "args",
    [
        ["compact", "{db}", "--ttl-steps", "-1"],
        ["compact", "{db}", "--min-freq", "many"],
        ["compact", "{db}", "--bogus"],
        ["export", "{db}", "{db}/../out", "--format", "xml"],
        ["export", "{db}", "{db}/../out", "--format", "npz", "--dtype", "float64"],
        ["info"],
    ],
)
def test_bad_option_is_a_usage_error(db: Path, args: list[str]) -> None:
    before = digest(db)
    done = evdb_cli(*[a.format(db=db) for a in args])
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "Error" in done.stderr and done.stdout == ""
    assert digest(db) == before


def test_bad_value_found_by_evdb_is_a_usage_error(db: Path) -> None:
    assert "--l2-threshold must be" in fails(2, "compact", db, "--l2-threshold", "nan")
    assert "DEST: " in fails(2, "checkpoint", db, db)  # dest exists


def test_errors_name_the_flags_not_the_python_arguments(db: Path, tmp_path: Path) -> None:
    line = fails(2, "export", db, tmp_path / "out", "--format", "word2vec", "--include-slots")
    assert "--include-slots needs" in line and "--format 'word2vec'" in line, line
    assert "include_slots" not in line and "format=" not in line, line
    line = fails(2, "export", db, tmp_path / "out", "--format", "word2vec", "--dtype", "float16")
    assert "--dtype must be 'float32' for --format 'word2vec'" in line, line
    # values, paths and longer names that contain a flag's name are left as they are
    from evdb.tools.cli import cli, flag_names

    message = "no table 'format' in /x/dtype; format_version=2"
    assert flag_names(message, cli.commands["export"]) == message


def test_errors_name_table_base_and_the_positional_arguments_as_the_usage_does(
    db: Path, tmp_path: Path
) -> None:
    """A table's ``name`` reads ``--table``, ``base`` ``--base``, ``path``/``dest``/``src``
    the usage line's PATH, DEST and SRC."""
    line = fails(4, "export", db, tmp_path / "out", "--format", "npz", "--table", "nope")
    assert "evdb: error: --table: no table 'nope'" in line, line
    assert "--table: no table 'nope'" in fails(4, "compact", db, "--table", "nope")
    src = tmp_path / "v.npz"
    np.savez(src, keys=np.arange(2), values=np.ones((2, 3), np.float32))
    line = fails(2, "import", src, db, "--table", "bad/name", "--format", "npz")
    assert "evdb: error: --table must be 1-128 characters" in line and "got 'bad/name'" in line
    line = fails(2, "import", src, db, "--table", "item", "--format", "npz")
    assert "--table: 'item' has dim 4" in line, line
    assert "--base: " in fails(4, "checkpoint", db, tmp_path / "ck", "--base", db)
    assert "SRC: " in fails(4, "import", tmp_path / "nofile", db, "--table", "x", "--format", "npz")
    assert "PATH: " in fails(4, "info", tmp_path / "missing")
    for line in (
        fails(4, "export", db, tmp_path / "out", "--format", "npz", "--table", "nope"),
        fails(2, "checkpoint", db, db),
    ):
        assert not re.search(r"(?<![\w-])(name|dest|path|table):", line), line


def test_locked_database_is_a_one_line_failure(db: Path) -> None:
    with evdb.open(db):
        line = fails(1, "compact", db)
    assert "open in another process" in line


def test_dry_run_compact_leaves_the_database_unchanged(db: Path) -> None:
    before = digest(db)
    out = ok_json("compact", db, "--dry-run")
    assert digest(db) == before
    assert out["dry_run"] is True
    item = out["tables"]["item"]
    assert item["removed"] == {"ttl": item["rows_before"] - 50, "l2": 0, "min_freq": 0}
    assert item["kept"] == 50
    with evdb.open(db, read_only=True) as d:  # the expired rows are all still stored
        assert len(d.table("item")) == 50
        assert d.table("item").stats()["tiers"]["rocksdb"]["rows"] > 900


def test_compact_removes_expired_rows(db: Path) -> None:
    out = ok_json("compact", db)
    item = out["tables"]["item"]
    assert item["kept"] == 50 and item["removed"]["ttl"] == item["rows_before"] - 50 > 900
    assert out["rows_before"] == out["kept"] + sum(out["removed"].values())
    assert out["tables"]["user"] == {
        "rows_before": 3,
        "kept": 3,
        "removed": {"ttl": 0, "l2": 0, "min_freq": 0},
        "rules": {"ttl_steps": None, "l2_threshold": None, "min_freq": None},
    }
    with evdb.open(db, read_only=True) as d:
        t = d.table("item")
        assert t.stats()["tiers"]["rocksdb"]["rows"] + t.stats()["tiers"]["dram"]["rows"] <= 50
        keys = np.concatenate([k for k, _ in t.items()])
        assert sorted(keys.tolist()) == list(range(50))
    # human output, and the rules given on the command line
    done = evdb_cli("compact", db, "--table", "user", "--l2-threshold", "0.5", "--min-freq", "0")
    assert done.returncode == 0
    assert done.stdout.splitlines()[1].split() == ["user", "3", "2", "0", "1", "0"]


def test_checkpoint_and_verify(db: Path, tmp_path: Path) -> None:
    full, incr = tmp_path / "full", tmp_path / "incr"
    out = ok_json("checkpoint", db, full)
    manifest = json.loads((full / "MANIFEST.json").read_text())
    assert out["kind"] == "full" and out["step"] == 10
    assert out["tables"] == {"item": 50, "user": 3}
    assert out["bytes"] == sum(f["size"] for f in manifest["files"].values()) > 0
    assert out["files"] == len(manifest["files"])
    assert ok_json("verify", full) == {
        "path": str(full),
        "ok": True,
        "kind": "full",
        "step": 10,
        "files": out["files"],
        "bytes": out["bytes"],
    }
    with evdb.open(db) as d:
        d.table("user").upsert([4], [[1.0, 1.0]])
    out = ok_json("checkpoint", db, incr, "--base", full)
    assert out["kind"] == "incremental" and out["changed_rows"] == {"item": 0, "user": 1}
    assert out["tables"] == {"item": 50, "user": 4}
    assert ok_json("verify", incr)["ok"] is True
    done = evdb_cli("verify", incr)
    assert done.returncode == 0 and done.stdout.startswith("OK: ")
    assert ok_json("info", incr)["tables"]["user"] == {"rows": 4, "changed_rows": 1}
    assert "base" in fails(4, "checkpoint", db, tmp_path / "x", "--base", tmp_path / "nope")


def test_verify_a_flipped_byte_is_corrupt(db: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ok_json("checkpoint", db, ckpt)
    manifest = json.loads((ckpt / "MANIFEST.json").read_text())
    victim = max(manifest["files"], key=lambda f: manifest["files"][f]["size"])
    data = bytearray((ckpt / victim).read_bytes())
    data[len(data) // 2] ^= 0x01
    (ckpt / victim).unlink()  # it may be a hard link into the database: break the link
    (ckpt / victim).write_bytes(bytes(data))
    line = fails(3, "verify", ckpt)
    assert Path(victim).name in line and "checksum" in line
    fails(3, "info", ckpt)  # opening verifies too
    assert fails(4, "verify", db)  # a database, not a checkpoint: nothing to verify


def test_export_then_verify(db: Path, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    out = ok_json("export", db, dest, "--format", "npz", "--table", "user", "--include-slots")
    assert out["kind"] == "export-npz" and set(out["tables"]) == {"user"}
    assert out["tables"]["user"]["rows"] == 3
    with np.load(dest / out["tables"]["user"]["file"]) as z:
        assert sorted(z["keys"].tolist()) == [1, 2, 3]
        assert z["values"].dtype == np.float32
    assert ok_json("verify", dest)["ok"] is True
    half = ok_json("export", db, tmp_path / "half", "--format", "npz", "--dtype", "float16")
    assert set(half["tables"]) == {"item", "user"} and half["dtype"] == "float16"
    bf16 = ok_json("export", db, tmp_path / "bf16", "--format", "serving", "--dtype", "bfloat16")
    assert bf16["dtype"] == "bfloat16"
    with evdb.open(tmp_path / "bf16", read_only=True) as served:
        assert served.table("user").stats()["dtype"] == "bfloat16"
    assert "nope" in fails(4, "export", db, tmp_path / "o2", "--format", "npz", "--table", "nope")


def test_import_into_a_file_or_a_sharded_root_is_one_line_saying_what_it_is(
    tmp_path: Path,
) -> None:
    src = tmp_path / "v.npz"
    np.savez(src, keys=np.arange(2), values=np.ones((2, 3), np.float32))
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    line = fails(2, "import", src, a_file, "--table", "t", "--format", "npz")
    assert f"PATH: {a_file} is a file; evdb.open takes the directory of a database" in line
    root = tmp_path / "root"  # a sharded root: its layout file is what says so
    root.mkdir()
    (root / "sharding.json").write_text('{"format": 1, "world_size": 2, "tables": {}}')
    line = fails(2, "import", src, root, "--table", "t", "--format", "npz")
    assert f"PATH: {root} is a sharded database or checkpoint" in line
    assert "evdb.distributed.open(path) on every rank" in line and "--shards 1" in line
    assert a_file.read_text() == "x" and sorted(p.name for p in root.iterdir()) == ["sharding.json"]


def test_info_of_a_serving_export_shows_no_optimizer_or_ttl(db: Path, tmp_path: Path) -> None:
    """A serving export's tables are values only: info says so, and shows no optimizer, TTL
    or l2 column (it showed 'sgd' and '-', which were not the trained tables')."""
    ok_json("export", db, tmp_path / "snap", "--format", "serving")
    done = evdb_cli("info", tmp_path / "snap")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1] == "kind    serving export (values only: no optimizer state, TTL or admission)"
    header = next(line for line in lines if line.startswith("table "))
    assert header.split() == [
        *("table", "dim", "key_type", "rows", "on_disk", "disk_bytes", "dtype", "bytes_per_row")
    ]
    assert "optimizer" in evdb_cli("info", db).stdout  # a database still shows its config


def test_info_of_an_int8_export_gives_its_dtype_and_bytes_a_row(db: Path, tmp_path: Path) -> None:
    """A quantised export is frozen files, not a database: info reads them as served."""
    ok_json("export", db, tmp_path / "q", "--format", "serving", "--dtype", "int8")
    out = ok_json("info", tmp_path / "q")
    assert out["checkpoint"]["kind"] == "export-serving"
    source = ok_json("info", db)["tables"]
    for name, t in out["tables"].items():
        assert t["rows"] == source[name]["rows"] and t["stats"]["dtype"] == "int8"
        dram = t["stats"]["tiers"]["dram"]
        assert dram["rows"] == t["rows"]
        assert dram["bytes_per_row"] * t["rows"] == pytest.approx(dram["bytes"])
    lines = evdb_cli("info", tmp_path / "q").stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("table "))
    assert lines[at].split()[-2:] == ["dtype", "bytes_per_row"]
    shown = {line.split()[0]: line.split()[-2] for line in lines[at + 1 :] if line.strip()}
    assert shown == {name: "int8" for name in out["tables"]}


def test_import_then_info(tmp_path: Path) -> None:
    src, path = tmp_path / "vectors.npz", tmp_path / "db"
    np.savez(src, keys=np.arange(10, dtype=np.int64), values=np.ones((10, 3), np.float32))
    out = ok_json("import", src, path, "--table", "emb", "--format", "npz", "--freeze")
    assert out["rows"] == 10 and out["created"] is True and out["frozen"] is True
    assert ok_json("info", path)["tables"]["emb"]["rows"] == 10
    done = evdb_cli("import", src, path, "--table", "emb", "--format", "npz")
    assert done.returncode == 0 and "rows" in done.stdout
    assert "SRC: " in fails(
        4, "import", tmp_path / "none.npz", path, "--table", "e", "--format", "npz"
    )


def test_progress_bar_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    from evdb.tools import output

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    with output.progress_bar("scan") as progress:  # pytest's stderr is no terminal
        assert progress is None
    tty = Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    with output.progress_bar("scan") as progress:
        assert progress is not None
        for done in (10, 50, 100):
            progress(done, 100)
    assert "scan" in tty.getvalue() and "100%" in tty.getvalue()


def test_warmup_compiles_every_kernel_into_the_cache() -> None:
    from evdb.kernels.warmup import kernel_names

    out = ok_json("warmup", "--processes", "2")
    assert out["kernels"] == len(kernel_names()) > 20 and out["cached"] is True
    assert out["compiled"] + out["already_cached"] == out["kernels"]
    again = ok_json("warmup", "--processes", "1")  # everything loads from the cache now
    assert again["compiled"] == 0 and again["already_cached"] == again["kernels"]
    assert again["cache"] == out["cache"]


def test_every_package_is_installed() -> None:
    """pyproject lists the packages (tools/ maps to evdb.tools, api/ to evdb.api): a new one
    must be added."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "evdb").rglob("__init__.py")
    }
    mapped = {"evdb.tools": "tools"}
    for init in (ROOT / "api").rglob("__init__.py"):
        folder = init.parent.relative_to(ROOT)
        mapped[".".join(("evdb", *folder.parts))] = folder.as_posix()
    # folders of data files, listed as packages with their package-data (setuptools warned on
    # every install that they "look importable" while they were data of their parents)
    data = {"evdb.kernels.cuda": "evdb/kernels/cuda", "evdb.api.static": "api/static"}
    assert set(config["packages"]) == found | set(mapped) | set(data)
    assert config["package-dir"] == mapped
    for package, folder in data.items():
        files = [f for f in (ROOT / folder).iterdir() if f.is_file()]
        patterns = config["package-data"][package]
        assert files and all(any(f.match(p) for p in patterns) for f in files), package


def test_info_shows_the_keys_each_tier_answered(tmp_path: Path) -> None:
    with evdb.open(tmp_path / "db") as d:
        t = d.create_table("t", dim=2, dram_rows=10)
        t.upsert(np.arange(50), np.ones((50, 2), np.float32))
        t.push(t.pull(np.arange(60)), np.zeros((60, 2), np.float32))
        t.lookup(np.arange(100))
        want = t.stats()["reads"]
    done = evdb_cli("info", tmp_path / "db")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    header = lines.index(next(line for line in lines if line.split()[:2] == ["table", "reads"]))
    assert lines[header].split()[2:] == list(want["pull"])
    for line, op in zip(lines[header + 1 : header + 3], ("pull", "lookup"), strict=True):
        assert line.split() == ["t", op, *map(str, want[op].values())]
    assert sum(want["pull"].values()) == 60 and sum(want["lookup"].values()) > 0
