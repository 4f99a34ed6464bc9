"""pandas, imported when first used.

A ``gpuclust analyze`` process that never builds a DataFrame (an analysis whose ``finalize``
returns Arrow tables, no plots) should not pay for importing pandas: about 0.15 s of one core,
before any data is read, which is a sixth of cell-usage's whole run at 1.6e7 windows (docs/user/scale.md,
"Start-up"). Modules that use pandas import it as ``from gpuclust._lazy import pandas as pd``; the
first attribute read (``pd.DataFrame``) imports the real module, and every read after that is a
plain attribute read of this module object.  Type checkers see the real module.
"""

from __future__ import annotations

import importlib
import types
from typing import TYPE_CHECKING, Any

__all__ = ["LazyModule", "pandas"]


class LazyModule(types.ModuleType):
    """A stand-in for the module ``name`` that imports it on the first attribute read."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__dict__["_lazy_target"] = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):  # dunders (copy, pickle, doctest probes): not a use
            raise AttributeError(attr)
        mod = importlib.import_module(self.__dict__["_lazy_target"])  # thread-safe: the import lock
        self.__dict__.update({k: v for k, v in mod.__dict__.items() if not k.startswith("__")})
        return getattr(mod, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self.__dict__['_lazy_target']!r}>"


if TYPE_CHECKING:
    import pandas
else:
    pandas = LazyModule("pandas")
