"""Makes the slow reference and the hypothesis strategies of this folder importable under unique
module names (``gpuclust_mixture_reference``, ``gpuclust_mixture_strategies``)."""

from __future__ import annotations

from pathlib import Path

import by_path

by_path.load("gpuclust_mixture_reference", Path(__file__).with_name("reference.py"))
by_path.load("gpuclust_mixture_strategies", Path(__file__).with_name("mixture_strategies.py"))
