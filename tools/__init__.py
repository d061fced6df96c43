"""The ``evdb`` command line, installed as ``evdb.tools`` (never as a top-level ``tools``).

See :mod:`evdb.tools.cli`; ``evdb --help`` and ``python -m evdb --help`` list the commands.
"""
