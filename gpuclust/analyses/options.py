"""Analysis options: declared once, as the analysis dataclass' fields.

Each option is a dataclass field made with :func:`option` (default, help text, choices, bounds and
checks in the field's metadata; its type is the field's annotation).  Everything else is derived
from that one declaration: the registry's option list (:func:`options_of`), the checks an analysis
runs when it is made (:func:`check_options`, from ``Analysis.__post_init__``), the CLI's ``-O
NAME=VALUE`` parsing (:meth:`Option.parse`, by the field's type), the help / listing text
(:meth:`Option.describe`), the ``Parameters`` section of the class docstring
(:func:`parameters_doc`) and the analysis label (:func:`label_of`).  A rule between options
(``cpi_min < cpi_max``) is a :class:`Relation` in the class' ``option_relations``.

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
>>> Overcommit(bucket_s=-5)
Traceback (most recent call last):
...
gpuclust.analyses.options.OptionError: overcommit: option bucket_s: must be > 0, got -5
>>> Overcommit(window_start_us=7200000000, window_end_us=3600000000)
Traceback (most recent call last):
...
gpuclust.analyses.options.OptionError: overcommit: options window_start_us, window_end_us: must satisfy window_end_us >= window_start_us, got window_start_us=7200000000, window_end_us=3600000000
"""

from __future__ import annotations

import dataclasses
import inspect
import numbers
import re
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FLAG_OPTIONS",
    "Option",
    "OptionError",
    "Relation",
    "check_options",
    "label_of",
    "option",
    "options_of",
    "parameters_doc",
    "tier_map_option",
    "with_parameters_doc",
]

_META = "gpuclust.option"
_NONE_WORDS = ("none", "null", "default")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
#: List separators: ``,`` or ``+`` (as labels write lists), but not the ``+`` of ``1e+3``
#: (``machine+time`` is two items).
_LIST_SEP = re.compile(r",|(?<!\d[eE])\+")


class OptionError(ValueError):
    """An option value that its type, choices, bounds or check (or a relation between options)
    do not accept; one line."""


#: ``(predicate of the value, the rule it states)``: e.g. ``(_is_range, "two integers LO,HI with LO <= HI")``.
Check = tuple[Callable[[Any], bool], str]


def option(
    default: Any,
    help: str,
    *,
    choices: Sequence[Any] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    check: Check | None = None,
    normalize: Callable[[Any], Any] | None = None,
    example: str | None = None,
    flag: str | None = None,
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
        One line for ``--help``, the capability table and the class docstring.
    choices
        The allowed values (for a list type: of each element).
    ge, gt, le, lt
        Bounds of the value (of each element of a list): ``>=``, ``>``, ``<=``, ``<``.
    check
        ``(predicate, rule)``: a further rule of the (normalized) value, e.g. ``(lambda r: len(r)
        == 2 and r[0] <= r[1], "two integers LO,HI with LO <= HI")``.
    normalize
        Applied to the value once its type passed, before the bounds and the check (e.g. sort a
        list of levels).
    example
        A valid ``-O`` text other than the default, where one cannot be derived from the type,
        choices and bounds (``tests/engine/test_cli_options.py`` drives every option with one).
    flag
        A command-line flag that stands for ``-O NAME=VALUE`` (``--tier-map``).
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
        "ge": ge,
        "gt": gt,
        "le": le,
        "lt": lt,
        "check": check,
        "normalize": normalize,
        "example": example,
        "flag": flag,
        "default_text": default_text,
        "fmt": fmt,
        "always_in_label": always_in_label,
    }
    return dataclasses.field(default=default, metadata={_META: meta})


def _optional(tp: Any) -> tuple[Any, bool]:
    """``(inner type, True)`` for ``X | None`` / ``Optional[X]``, else ``(tp, False)``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _is_list(tp: Any) -> bool:
    return typing.get_origin(_optional(tp)[0]) in (tuple, list)


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


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


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
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    check: Check | None = None
    normalize: Callable[[Any], Any] | None = None
    example: str | None = None
    flag: str | None = None

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

    # ------------------------------------------------------------------------- checks
    @property
    def bounds(self) -> str | None:
        """The bounds as a rule (``> 0``, ``in [0, 100]``, ``in (0, 1]``); None: unbounded."""
        lo = f"({_num(self.gt)}" if self.gt is not None else f"[{_num(self.ge)}" if self.ge is not None else None
        hi = f"{_num(self.lt)})" if self.lt is not None else f"{_num(self.le)}]" if self.le is not None else None
        if lo and hi:
            return f"in {lo}, {hi}"
        if lo:
            return f"{'>' if lo[0] == '(' else '>='} {lo[1:]}"
        if hi:
            return f"{'<' if hi[-1] == ')' else '<='} {hi[:-1]}"
        return None

    def _in_bounds(self, x: Any) -> bool:
        return not (
            (self.ge is not None and not x >= self.ge)
            or (self.gt is not None and not x > self.gt)
            or (self.le is not None and not x <= self.le)
            or (self.lt is not None and not x < self.lt)
        )

    def _scalar(self, tp: Any, x: Any) -> Any:
        """``x`` as a value of type ``tp`` (NumPy scalars as Python's), or :class:`OptionError`."""
        if tp is bool:
            if isinstance(x, bool):
                return x
            raise OptionError(f"expected true or false, got {x!r}")
        if tp is int:
            if isinstance(x, numbers.Integral) and not isinstance(x, bool):
                return int(x)
            raise OptionError(f"expected an integer, got {x!r}")
        if tp is float:
            if isinstance(x, numbers.Real) and not isinstance(x, bool):
                return x if isinstance(x, (int, float)) else float(x)
            raise OptionError(f"expected a number, got {x!r}")
        if tp is str and not isinstance(x, str):
            raise OptionError(f"expected text, got {x!r}")
        if self.choices is not None and x not in self.choices:
            raise OptionError(f"expected one of {' / '.join(map(str, self.choices))}, got {x!r}")
        return x

    def validate(self, value: Any) -> Any:
        """``value`` checked against the option's type, choices, bounds and check, and normalized
        (a list given as text parsed, a list made a tuple, ``normalize`` applied); an
        :class:`OptionError` stating the rule and the value when it fails one.

        >>> o = Option("levels", None, None, "levels", tuple[float, ...] | None, ge=0, le=1, normalize=sorted)
        >>> o.validate("0.9,0.5"), o.validate(None)
        ((0.5, 0.9), None)
        >>> o.validate([0.5, 2])
        Traceback (most recent call last):
        ...
        gpuclust.analyses.options.OptionError: must be each in [0, 1], got [0.5, 2]
        """
        tp, optional = _optional(self.type)
        if value is None:
            if optional or self.default is None:
                return None
            raise OptionError(f"expected {_type_name(self.type)}, got None")
        if typing.get_origin(tp) in (tuple, list):
            elem = typing.get_args(tp)[0]
            items = self._parse(tp, value) if isinstance(value, str) else value
            if not isinstance(items, (tuple, list)) or not items:
                raise OptionError(f"expected one or more values, got {value!r}")
            v: Any = tuple(self._scalar(elem, x) for x in items)
        else:
            v = self._scalar(tp, value)
        if self.normalize is not None:
            v = self.normalize(v)
        if isinstance(v, list):
            v = tuple(v)
        if not all(self._in_bounds(x) for x in (v if isinstance(v, tuple) else (v,))):
            raise OptionError(f"must be {'each ' if isinstance(v, tuple) else ''}{self.bounds}, got {value!r}")
        if self.check is not None and not self.check[0](v):
            raise OptionError(f"must be {self.check[1]}, got {value!r}")
        return v

    # ------------------------------------------------------------------------- text
    def format(self, value: Any) -> str:
        """``value`` as the label writes it (lists joined with ``+``)."""
        if isinstance(value, (tuple, list)):
            return "+".join(self.format(v) for v in value)
        return format(value, self.fmt) if self.fmt and isinstance(value, (int, float)) else str(value)

    @property
    def kind(self) -> str:
        """What values it takes: its choices, else its type, and its bounds."""
        if self.choices:
            listed = " / ".join(str(c) for c in self.choices)
            return f"one or more of {listed}" if _is_list(self.type) else listed
        bounds = self.bounds
        name = _type_name(self.type)
        return f"{name}, {'each ' if _is_list(self.type) else ''}{bounds}" if bounds else name

    @property
    def default_str(self) -> str:
        if self.default_text is not None:
            return self.default_text
        return "from dataset" if self.default is None else self.format(self.default)

    def describe(self) -> str:
        """One line: ``name: kind (default ...) - help``."""
        return f"{self.name}: {self.kind} (default {self.default_str}) - {self.help}"

    def field(self, help: str | None = None) -> Any:
        """The dataclass field :func:`option` makes of this option (an option declared here, as
        :data:`CELL_USAGE_MODE`, and used as an analysis' field); ``help`` replaces its help."""
        return option(
            self.default,
            self.help if help is None else help,
            choices=self.choices,
            ge=self.ge,
            gt=self.gt,
            le=self.le,
            lt=self.lt,
            check=self.check,
            normalize=self.normalize,
            example=self.example,
            flag=self.flag,
            default_text=self.default_text,
            fmt=self.fmt,
            always_in_label=self.always_in_label,
        )


@dataclass(frozen=True)
class Relation:
    """A rule between options of one analysis, declared in its class' ``option_relations``:
    ``holds`` of the options' values (in the order of ``options``) and the rule in words."""

    options: tuple[str, ...]
    holds: Callable[..., bool]
    rule: str


def _tier_map_option() -> Option:
    from gpuclust.schema import TIER_MAPS

    return Option(
        "tier_map",
        None,
        tuple(TIER_MAPS),
        "priority tier map; default: the dataset manifest's, else the trace version's default",
        flag="--tier-map",
    )


#: The ``tier_map`` option of the analyses that split by priority tier (their field is
#: :func:`tier_map_option`); the command line's ``--tier-map`` stands for ``-O tier_map=NAME``.
TIER_MAP = _tier_map_option()


def tier_map_option(help: str | None = None) -> Any:
    """The ``tier_map`` option shared by the analyses that split by priority tier (``help``: its
    help text, when it says more than :data:`TIER_MAP`'s)."""
    return TIER_MAP.field(help)


#: cell-usage's ``mode`` (its field is ``CELL_USAGE_MODE.field()``), declared here so the command
#: line's ``--mode`` offers it without importing the analysis (and its lookups) in every run.
CELL_USAGE_MODES: tuple[str, ...] = ("notebook", "exact")
CELL_USAGE_MODE = Option(
    "mode",
    "notebook",
    CELL_USAGE_MODES,
    "cell-usage: notebook = Google's notebook exactly; exact = time-weighted overlap with each hour",
    always_in_label=True,
    flag="--mode",
)

#: The options a command-line flag stands for (``--tier-map``, ``--mode``): the commands that run
#: analyses add a flag for each (:func:`gpuclust.engine.command.add_run_options`).
FLAG_OPTIONS: tuple[Option, ...] = (TIER_MAP, CELL_USAGE_MODE)


def _option(name: str, f: dataclasses.Field[Any], tp: Any) -> Option:
    meta = f.metadata[_META]
    return Option(
        name,
        f.default,
        meta["choices"],
        meta["help"],
        tp,
        meta["default_text"],
        meta["fmt"],
        meta["always_in_label"],
        meta["ge"],
        meta["gt"],
        meta["le"],
        meta["lt"],
        meta["check"],
        meta["normalize"],
        meta["example"],
        meta["flag"],
    )


_OPTIONS: dict[type, tuple[Option, ...]] = {}


def options_of(cls: type) -> tuple[Option, ...]:
    """The options of an analysis class: its dataclass fields made with :func:`option`, in order."""
    found = _OPTIONS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)
        found = _OPTIONS[cls] = tuple(_option(f.name, f, hints.get(f.name, str)) for f in fields if _META in f.metadata)
    return found


def check_options(analysis: Any) -> None:
    """Check (and normalize, in place) every option of a new analysis by its declaration, then the
    class' ``option_relations``; an :class:`OptionError` naming the analysis, the option, the rule
    and the value when one fails (``Analysis.__post_init__`` calls it)."""
    cls = type(analysis)
    name = getattr(analysis, "name", "") or cls.__name__
    for o in options_of(cls):
        v = getattr(analysis, o.name)
        try:
            new = o.validate(v)
        except OptionError as e:
            raise OptionError(f"{name}: option {o.name}: {e}") from None
        if new is not v:
            object.__setattr__(analysis, o.name, new)
    for r in getattr(cls, "option_relations", ()):
        values = [getattr(analysis, n) for n in r.options]
        if not r.holds(*values):
            got = ", ".join(f"{n}={v!r}" for n, v in zip(r.options, values, strict=True))
            raise OptionError(f"{name}: options {', '.join(r.options)}: must satisfy {r.rule}, got {got}")


def parameters_doc(options: Sequence[Option], width: int = 96) -> str:
    """The numpydoc ``Parameters`` section of ``options`` (unindented).

    >>> print(parameters_doc([Option("tail", 0.1, None, "share of the largest collections", float, gt=0, le=1)]))
    Parameters
    ----------
    tail : number, in (0, 1], default 0.1
        share of the largest collections
    """
    lines = ["Parameters", "----------"]
    for o in options:
        lines.append(f"{o.name} : {o.kind}, default {o.default_str}")
        text = o.help + (f"; must be {o.check[1]}" if o.check else "")
        lines += textwrap.wrap(text, width, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines)


def _declared_options(cls: type) -> list[Option]:
    """The options of a class being made (its base classes' dataclass fields and its own option
    fields, not yet made dataclass fields), for its docstring."""
    fields: dict[str, tuple[dataclasses.Field[Any], Any]] = {}
    names = vars(sys.modules[cls.__module__]) if cls.__module__ in sys.modules else {}
    for klass in reversed(cls.__mro__):
        if "__dataclass_fields__" in vars(klass):
            for f in vars(klass)["__dataclass_fields__"].values():
                if _META in f.metadata:
                    fields[f.name] = (f, f.type)
        for name, ann in vars(klass).get("__annotations__", {}).items():
            f = vars(klass).get(name)
            if isinstance(f, dataclasses.Field) and _META in f.metadata:
                fields[name] = (f, ann)
    out = []
    for name, (f, ann) in fields.items():
        tp = ann
        if isinstance(ann, str):
            try:
                tp = eval(ann, dict(names))  # the annotation as the module reads it (builtins)
            except Exception:
                tp = ann
        out.append(_option(name, f, tp))
    return out


def with_parameters_doc(cls: type) -> None:
    """Give ``cls`` (an analysis class being made) the ``Parameters`` section of its options in its
    docstring, before its ``Examples`` (``Analysis.__init_subclass__`` calls it): the options'
    declarations are the one source of their documentation."""
    opts = _declared_options(cls)
    if not opts:
        return
    doc = inspect.cleandoc(vars(cls).get("__doc__") or "")
    section = parameters_doc(opts)
    at = doc.find("\nExamples\n--------")
    head, tail = (doc[:at], doc[at:]) if at >= 0 else (doc, "")
    cls.__doc__ = "\n\n".join(p for p in (head.strip(), section, tail.strip()) if p)


def label_of(analysis: Any) -> str:
    """``name[opt=value,...]`` with the options that differ from their default (and those marked
    ``always_in_label``), in declaration order; just the name when there are none."""
    parts = []
    for o in options_of(type(analysis)):
        v = getattr(analysis, o.name)
        if o.always_in_label or v != o.default:
            parts.append(f"{o.name}={o.format(v)}")
    return f"{analysis.name}[{','.join(parts)}]" if parts else analysis.name
