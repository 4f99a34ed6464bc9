"""Analysis options: declared once, as the analysis dataclass' fields.

Each option is a dataclass field made with :func:`option` (default, choices, help text in the
field's metadata; its type is the field's annotation).  Everything else is derived from that one
declaration: the registry's option list (:func:`options_of`), the CLI's ``-O NAME=VALUE`` parsing
(:meth:`Option.parse`, by the field's type), the help / listing text (:meth:`Option.describe`) and
the analysis label (:func:`label_of`).

Examples
--------
>>> from gpuclust.analyses.overcommit import Overcommit
>>> opt = {o.name: o for o in options_of(Overcommit)}
>>> opt["window_end_us"].parse("7200000000"), opt["window_end_us"].parse("none")
(7200000000, None)
>>> opt["bucket_s"].parse("0.5")
Traceback (most recent call last):
...
gpuclust.analyses.options.OptionError: expected an integer, got '0.5'
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Option", "OptionError", "label_of", "option", "options_of", "tier_map_option"]

_META = "gpuclust.option"
_NONE_WORDS = ("none", "null", "default")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
#: List separators: ``,`` or ``+`` (as labels write lists), but not the ``+`` of ``1e+3``.
_LIST_SEP = re.compile(r",|(?<![eE])\+")


class OptionError(ValueError):
    """A ``NAME=VALUE`` text that the option's type or choices do not accept."""


def option(
    default: Any,
    help: str,
    *,
    choices: Sequence[Any] | None = None,
    default_text: str | None = None,
    fmt: str | None = None,
    always_in_label: bool = False,
) -> Any:
    """A dataclass field declaring an analysis option.

    Parameters
    ----------
    default
        The default value (immutable).
    help
        One line for ``--help``, the capability table and docs.
    choices
        The allowed values (for a list type: of each element).
    default_text
        How to show the default when ``repr`` would not say it (e.g. ``None`` meaning "20
        standard levels"); a ``None`` default is otherwise shown as "from dataset".
    fmt
        Format spec of the value in the label (default: ``str``).
    always_in_label
        Show the option in the label even at its default.
    """
    meta = {
        "help": help,
        "choices": tuple(choices) if choices is not None else None,
        "default_text": default_text,
        "fmt": fmt,
        "always_in_label": always_in_label,
    }
    return dataclasses.field(default=default, metadata={_META: meta})


def tier_map_option(
    help: str = "priority tier map; default: the dataset manifest's, else the trace version's default",
) -> Any:
    """The ``tier_map`` option shared by the analyses that split by priority tier."""
    from gpuclust.schema import TIER_MAPS

    return option(None, help, choices=tuple(TIER_MAPS))


def _optional(tp: Any) -> tuple[Any, bool]:
    """``(inner type, True)`` for ``X | None`` / ``Optional[X]``, else ``(tp, False)``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _type_name(tp: Any) -> str:
    tp, opt = _optional(tp)
    origin = typing.get_origin(tp)
    if origin in (tuple, list):
        name = f"list of {_type_name(typing.get_args(tp)[0])} (comma-separated)"
    else:
        name = {bool: "true/false", int: "integer", float: "number", str: "text"}.get(
            tp, getattr(tp, "__name__", str(tp))
        )
    return f"{name} or none" if opt else name


@dataclass(frozen=True)
class Option:
    """One option of an analysis: a field of its dataclass, with the metadata of :func:`option`."""

    name: str
    default: Any
    choices: tuple[Any, ...] | None
    help: str
    type: Any = str
    default_text: str | None = None
    fmt: str | None = None
    always_in_label: bool = False

    # ------------------------------------------------------------------------- parsing
    def parse(self, text: str) -> Any:
        """The value of ``text`` (from ``-O NAME=TEXT``) by the option's type; :class:`OptionError`
        (one line) when the type or the choices do not accept it."""
        return self._parse(self.type, text.strip())

    def _parse(self, tp: Any, text: str) -> Any:
        inner, opt = _optional(tp)
        if opt:
            return None if text.lower() in (*_NONE_WORDS, "") else self._parse(inner, text)
        origin = typing.get_origin(tp)
        if origin in (tuple, list):
            (elem, *_) = typing.get_args(tp)
            items = [s.strip() for s in _LIST_SEP.split(text) if s.strip()]
            if not items:
                raise OptionError(f"expected a comma-separated list, got {text!r}")
            return tuple(self._parse(elem, s) for s in items)
        if tp is bool:
            low = text.lower()
            if low in _TRUE or low in _FALSE:
                return low in _TRUE
            raise OptionError(f"expected true or false, got {text!r}")
        if tp is int:
            try:
                return int(text)
            except ValueError:
                raise OptionError(f"expected an integer, got {text!r}") from None
        if tp is float:
            try:
                return float(text)
            except ValueError:
                raise OptionError(f"expected a number, got {text!r}") from None
        if self.choices is not None and text not in self.choices:
            raise OptionError(f"expected one of {' / '.join(map(str, self.choices))}, got {text!r}")
        return text

    # ------------------------------------------------------------------------- text
    def format(self, value: Any) -> str:
        """``value`` as the label writes it (lists joined with ``+``)."""
        if isinstance(value, (tuple, list)):
            return "+".join(self.format(v) for v in value)
        return format(value, self.fmt) if self.fmt and isinstance(value, (int, float)) else str(value)

    @property
    def kind(self) -> str:
        """What values it takes: its choices, else its type."""
        if self.choices:
            listed = " / ".join(str(c) for c in self.choices)
            return f"one or more of {listed}" if typing.get_origin(_optional(self.type)[0]) in (tuple, list) else listed
        return _type_name(self.type)

    @property
    def default_str(self) -> str:
        if self.default_text is not None:
            return self.default_text
        return "from dataset" if self.default is None else self.format(self.default)

    def describe(self) -> str:
        """One line: ``name: kind (default ...) - help``."""
        return f"{self.name}: {self.kind} (default {self.default_str}) - {self.help}"

    def field(self) -> Any:
        """The dataclass field :func:`option` makes of this option (an option declared here, as
        :data:`CELL_USAGE_MODE`, and used as an analysis' field)."""
        return option(
            self.default,
            self.help,
            choices=self.choices,
            default_text=self.default_text,
            fmt=self.fmt,
            always_in_label=self.always_in_label,
        )


#: cell-usage's ``mode`` (its field is ``CELL_USAGE_MODE.field()``), declared here so the command
#: line's ``--mode`` offers it without importing the analysis (and its lookups) in every run.
CELL_USAGE_MODES: tuple[str, ...] = ("notebook", "exact")
CELL_USAGE_MODE = Option(
    "mode",
    "notebook",
    CELL_USAGE_MODES,
    "notebook = Google's notebook exactly; exact = time-weighted overlap with each hour",
    always_in_label=True,
)


def options_of(cls: type) -> tuple[Option, ...]:
    """The options of an analysis class: its dataclass fields made with :func:`option`, in order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata.get(_META)
        if meta is None:
            continue
        out.append(
            Option(
                f.name,
                f.default,
                meta["choices"],
                meta["help"],
                hints.get(f.name, str),
                meta["default_text"],
                meta["fmt"],
                meta["always_in_label"],
            )
        )
    return tuple(out)


def label_of(analysis: Any) -> str:
    """``name[opt=value,...]`` with the options that differ from their default (and those marked
    ``always_in_label``), in declaration order; just the name when there are none."""
    parts = []
    for o in options_of(type(analysis)):
        v = getattr(analysis, o.name)
        if o.always_in_label or v != o.default:
            parts.append(f"{o.name}={o.format(v)}")
    return f"{analysis.name}[{','.join(parts)}]" if parts else analysis.name
