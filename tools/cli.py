"""The ``evdb`` command line: look after evdb databases from the shell.

Usage (``evdb`` is also ``python -m evdb``)::

    evdb info PATH [--json]
    evdb compact PATH [--table T] [--ttl-steps N] [--l2-threshold X] [--min-freq K]
                      [--step S] [--dry-run] [--json]
    evdb export PATH DEST --format F [--table T]... [--dtype float32|float16]
                          [--include-slots] [--json]
    evdb import SRC PATH --table T --format F [--freeze] [--json]
    evdb checkpoint PATH DEST [--base PREV] [--json]
    evdb verify PATH [--json]
    evdb reshard SRC DEST --shards M [--json]
    evdb serve PATH [--host H] [--port P] [--workers N] [--token-file F]
                    [--allow-root DIR]... [--max-keys K] [--cache-rows R] [--mmap-reads]
                    [--no-dashboard] [--max-scan-rows N]
                    [--follow [--poll-interval S] [--max-staleness S]]
    evdb size TRACE [--db PATH [--table T]] [--rows N,N,...] [--target X]... [--lru-only]
                    [--plot curve.png] [--bins N] [--json]

Each subcommand is a ``cmd_<name>`` that calls the library (``evdb``, ``evdb.offline``,
``evdb.io.export``) and prints its result: with ``--json`` one JSON object on stdout, otherwise
a short aligned summary. Progress bars go to stderr, and only when stderr is a terminal, so
pipes and CI logs stay quiet. Errors the library expects (``evdb.EvdbError``, a missing file)
print one line, ``evdb: error: ...``, on stderr, with the exit code of ``EXIT_CODES``; anything
else is a bug and keeps its traceback.

This module holds the group and its dispatch; the commands live by what they act on:
``commands_db`` (info, compact, checkpoint, reshard), ``commands_files`` (export, import,
verify) and ``commands_serve`` (serve), over ``output`` (what they print), ``paths`` (the PATH
checks) and ``exit_codes``.
"""

from __future__ import annotations

from typing import Any

import click

import evdb

from .commands_db import cmd_checkpoint, cmd_compact, cmd_info, cmd_reshard
from .commands_files import cmd_export, cmd_import, cmd_verify
from .commands_serve import cmd_serve
from .commands_size import cmd_size
from .exit_codes import EXIT_CODES, exit_code

__all__ = ["EXIT_CODES", "cli", "exit_code", "main"]


class _Cli(click.Group):
    """A group that turns expected errors into one line on stderr and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as e:
            code = exit_code(e)
            if code is None:  # click's own exceptions, and bugs (traceback, exit 1)
                raise
            message = " ".join(str(e).split()) or type(e).__name__
            click.echo(f"evdb: error: {message}", err=True)
            raise click.exceptions.Exit(code) from None


@click.group(
    cls=_Cli,
    epilog=EXIT_CODES,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(evdb.__version__, prog_name="evdb")
def cli() -> None:
    """Inspect, compact, export, import, checkpoint and verify evdb databases.

    PATH is a database directory (what evdb.open(PATH) opened); no command but import
    creates one. Close it in other processes first (compact, import and checkpoint take its
    lock; info, export and verify only read).
    """


for _command in (
    cmd_info,
    cmd_compact,
    cmd_export,
    cmd_import,
    cmd_checkpoint,
    cmd_verify,
    cmd_reshard,
    cmd_serve,
    cmd_size,
):
    cli.add_command(_command)


def main() -> None:
    """The ``evdb`` console script and ``python -m evdb``."""
    cli()
