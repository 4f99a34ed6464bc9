"""Makes the slow reference and the hypothesis strategies of this folder importable under unique
module names (``gpuclust_mixture_reference``, ``gpuclust_mixture_strategies``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def _load(name: str, filename: str) -> None:
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(filename))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)


_load("gpuclust_mixture_reference", "reference.py")
_load("gpuclust_mixture_strategies", "mixture_strategies.py")
