"""Repository-level pytest settings: doctests of the torch binding need torch installed."""

import importlib.util

collect_ignore = [] if importlib.util.find_spec("torch") else ["evdb/torch.py"]
