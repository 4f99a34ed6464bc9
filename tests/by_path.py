"""Load a test folder's helper module by its path, once, under a unique name: ``tests/analyses``
and ``tests/mixture`` are no packages, so their references (``overcommit_reference.py``,
``mixture/reference.py``, a sibling test module's builders) cannot be imported by name."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load(name: str, path: Path) -> ModuleType:
    """The module of the file ``path`` as ``sys.modules[name]``, executed the first time only."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None, path
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]
