"""evdb's REST service (installed as ``evdb.api``; ``pip install evdb[serve]``).

``evdb serve PATH`` runs it under uvicorn; ``create_app(Settings(path=...))`` builds it for
tests or for an ASGI server of your choice.
"""

from __future__ import annotations

from .app import create_app
from .settings import Settings

__all__ = ["Settings", "create_app"]
