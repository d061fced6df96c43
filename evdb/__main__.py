"""``python -m evdb``: the ``evdb`` command line (``evdb.tools.cli``)."""

from __future__ import annotations

from evdb.tools.cli import main

if __name__ == "__main__":
    main()
