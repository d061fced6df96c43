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
    evdb convert SRC DEST --dtype float32|bfloat16|float16 [--table T]... [--rounding R]
                 [--slot-dtype S] [--json]
    evdb serve PATH [--host H] [--port P] [--workers N] [--token-file F]
                    [--allow-root DIR]... [--max-keys K] [--cache-rows R] [--mmap-reads]
                    [--no-dashboard] [--max-scan-rows N]
                    [--follow [--poll-interval S] [--max-staleness S]
                              [--dtype int8|int4 [--cache-dir DIR]]]
    evdb warmup [--processes N] [--json]
    evdb size TRACE [--db PATH [--table T]] [--rows N,N,...] [--target X]... [--lru-only]
                    [--plot curve.png] [--bins N] [--json]

Each subcommand is a ``cmd_<name>`` that calls the library (``evdb``, ``evdb.offline``,
``evdb.io.export``) and prints its result: with ``--json`` one JSON object on stdout, otherwise
a short aligned summary. Progress bars go to stderr, and only when stderr is a terminal, so
pipes and CI logs stay quiet. Errors the library expects (``evdb.EvdbError``, a missing file)
print one line, ``evdb: error: ...``, on stderr, with the exit code of ``EXIT_CODES``, naming
the command's flags where the library's message names their Python arguments
(``include_slots=True`` reads ``--include-slots``); anything else is a bug and keeps its
traceback.

This module holds the group and its dispatch; the commands live by what they act on:
``commands_db`` (info, compact, checkpoint, reshard, convert), ``commands_files`` (export, import,
verify), ``commands_serve`` (serve) and ``commands_warmup`` (warmup), over ``output`` (what
they print), ``paths`` (the PATH checks) and ``exit_codes``.
"""

from __future__ import annotations

import re
from typing import Any

import click

import evdb

from .commands_db import cmd_checkpoint, cmd_compact, cmd_convert, cmd_info, cmd_reshard
from .commands_files import cmd_export, cmd_import, cmd_verify
from .commands_serve import cmd_serve
from .commands_size import cmd_size
from .commands_warmup import cmd_warmup
from .exit_codes import EXIT_CODES, exit_code

__all__ = ["EXIT_CODES", "cli", "exit_code", "flag_names", "main"]


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
            command = self.get_command(ctx, ctx.invoked_subcommand or "")
            if command is not None:
                message = flag_names(message, command)
            click.echo(f"evdb: error: {message}", err=True)
            raise click.exceptions.Exit(code) from None


# Library arguments that a flag sets under another name: a table's ``name`` is ``--table``.
_ALIASES = {"--table": ("table", "name")}


def flag_names(message: str, command: click.Command) -> str:
    """A library message in the command line's words: each Python argument that one of
    ``command``'s flags sets is named by the flag, ``include_slots=True`` as
    ``--include-slots``, ``format='npz'`` as ``--format 'npz'``, ``dtype must`` as ``--dtype
    must`` and ``base:`` as ``--base:`` (a table's ``name`` as ``--table``); a positional
    argument by its metavar (``dest:`` as ``DEST:``); other words (an option's value, a
    table's name) are left as they are."""
    for param in command.params:
        if isinstance(param, click.Argument) and param.name:
            word = rf"(?<![\w'\"./-]){re.escape(param.name)}"
            message = re.sub(rf"{word}(?=:)", param.human_readable_name, message)
            continue
        flags = [o for o in param.opts if o.startswith("--")]
        if not isinstance(param, click.Option) or not flags:
            continue
        flag = flags[0]
        for name in _ALIASES.get(flag, (flag[2:].replace("-", "_"),)):
            word = rf"(?<![\w'\"./-]){re.escape(name)}"  # not inside a value, a path, a name
            if param.is_flag:
                message = re.sub(rf"{word}=True\b", flag, message)
            message = re.sub(rf"{word}=", f"{flag} ", message)
            message = re.sub(rf"{word}(?=:| (?:must|needs|is|are|cannot|should)\b)", flag, message)
    return message


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
    cmd_convert,
    cmd_serve,
    cmd_size,
    cmd_warmup,
):
    cli.add_command(_command)


def main() -> None:
    """The ``evdb`` console script and ``python -m evdb``."""
    cli()
