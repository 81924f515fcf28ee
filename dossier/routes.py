"""Routes and selections.

A route gives a value to knobs; its canonical text is ``-name=value`` tokens sorted by name, as
TensorRT spells build routes. A selection is the user's expression of which knobs vary and which
are pinned, in trtexec ``--tuneBuildRoutes`` syntax: ``-a=[x|y] -b=z`` (tokens separated by
white space; ``[..|..]`` varies a knob, a bare value pins it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pydantic import BaseModel, ConfigDict

from dossier.errors import SelectionError
from dossier.knobs import KnobDatabase

_TOKEN = re.compile(r"^-(?P<name>[^=\s\[\]|]+)=(?P<value>.*)$")
_LIST = re.compile(r"^\[(?P<body>.*)\]$")


def _token(token: str) -> tuple[str, tuple[str, ...], bool]:
    """(knob name, values, pinned) of one selection token, ``-k=v`` or ``-k=[a|b]``;
    SelectionError when it is neither."""
    m = _TOKEN.match(token)
    if not m:
        raise SelectionError(f"selection token {token!r} is not -knob=value or -knob=[a|b]")
    lm = _LIST.match(m["value"])
    values = tuple(lm["body"].split("|")) if lm else (m["value"],)
    return m["name"], values, lm is None


class Route(BaseModel):
    """Values for a set of knobs. Knobs not named take their default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    values: tuple[tuple[str, str], ...]
    """(knob, value) pairs sorted by knob name."""

    @classmethod
    def of(cls, values: Mapping[str, str] | Iterable[tuple[str, str]]) -> Route:
        """A route from a mapping or pairs (sorted here)."""
        items = dict(values.items() if isinstance(values, Mapping) else values)
        return cls(values=tuple(sorted(items.items())))

    @classmethod
    def parse(cls, text: str, db: KnobDatabase | None = None) -> Route:
        """Parse ``-a=x -b=y``; with ``db``, check knob names and values."""
        pairs: dict[str, str] = {}
        for token in text.split():
            m = _TOKEN.match(token)
            if not m or _LIST.match(m["value"]):
                raise SelectionError(f"route token {token!r} is not of the form -knob=value")
            name, value = m["name"], m["value"]
            if name in pairs:
                raise SelectionError(f"route names knob -{name} twice")
            if db is not None:
                knob = db.get(name)
                if knob.values is not None and value not in knob.values:
                    raise SelectionError(
                        f"value {value!r} is not allowed for -{name}",
                        hint=f"allowed: {knob.allowed_text()}")
            pairs[name] = value
        return cls.of(pairs)

    def as_dict(self) -> dict[str, str]:
        """The route as a {knob: value} dict."""
        return dict(self.values)

    def text(self) -> str:
        """Canonical text: ``-a=x -b=y`` sorted by knob name."""
        return " ".join(f"-{k}={v}" for k, v in self.values)

    def effective(self, db: KnobDatabase) -> dict[str, str]:
        """Every knob of ``db`` with its value under this route (defaults filled in)."""
        named = self.as_dict()
        return {k.name: named.get(k.name, k.default) for k in db.knobs}

    def non_default(self, db: KnobDatabase) -> dict[str, str]:
        """The knobs this route sets to something other than their default."""
        defaults = {k.name: k.default for k in db.knobs}
        return {k: v for k, v in self.values if defaults.get(k) != v}

    def __str__(self) -> str:
        return self.text() or "(default route)"


class SelectionItem(BaseModel):
    """One knob of a selection: the values it takes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    knob: str
    """Knob name without the leading '-'."""
    values: tuple[str, ...]
    """Listed values in the user's order (one value when pinned)."""
    pinned: bool
    """True for ``-k=v`` (fixed), False for ``-k=[a|b]`` (varied)."""


class Selection(BaseModel):
    """Which knobs vary and which are pinned, in the user's order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    items: tuple[SelectionItem, ...]
    """The knobs in the order the user wrote them."""

    @classmethod
    def parse(cls, text: str, db: KnobDatabase) -> Selection:
        """Parse trtexec ``--tuneBuildRoutes`` syntax against ``db``.

        Raises SelectionError for: an empty selection, a malformed token, an unknown knob, a value
        not allowed, a knob named twice, a value listed twice, an empty list, or a swept
        unbounded knob (trtexec refuses those too; an unbounded knob can only be pinned).
        """
        tokens = text.split()
        if not tokens:
            raise SelectionError("the selection is empty",
                                 hint="name at least one knob, e.g. -knob=[a|b]")
        items: list[SelectionItem] = []
        seen: set[str] = set()
        for token in tokens:
            name, values, pinned = _token(token)
            knob = db.get(name)
            if knob.name in seen:
                raise SelectionError(f"knob -{knob.name} appears twice in the selection")
            seen.add(knob.name)
            if any(not v for v in values):
                raise SelectionError(f"empty value in {token!r}")
            if not pinned and knob.values is None:
                raise SelectionError(
                    f"knob -{knob.name} has unbounded values ({knob.value_hint or '...'}) and "
                    "cannot be swept", hint="pin it with a single value instead")
            dupes = sorted({v for v in values if values.count(v) > 1})
            if dupes:
                raise SelectionError(f"value {dupes[0]!r} is listed twice for -{knob.name}")
            if knob.values is not None:
                for v in values:
                    if v not in knob.values:
                        raise SelectionError(f"value {v!r} is not allowed for -{knob.name}",
                                             hint=f"allowed: {knob.allowed_text()}")
            items.append(SelectionItem(knob=knob.name, values=values, pinned=pinned))
        return cls(items=tuple(items))

    @classmethod
    def recorded(cls, text: str) -> Selection:
        """A selection as a search recorded it (canonical, checked against its knob database
        when the search ran): its knobs and values, read without a database. SelectionError
        for a token that is not ``-knob=value`` or ``-knob=[a|b]``."""
        items = [SelectionItem(knob=name, values=values, pinned=pinned)
                 for name, values, pinned in map(_token, text.split())]
        return cls(items=tuple(items))

    def text(self) -> str:
        """The selection in trtexec syntax, in the user's order."""
        return " ".join(
            f"-{i.knob}={i.values[0]}" if i.pinned else f"-{i.knob}=[{'|'.join(i.values)}]"
            for i in self.items)

    @property
    def varied(self) -> list[SelectionItem]:
        """The knobs that vary, in the user's order."""
        return [i for i in self.items if not i.pinned]

    def baseline(self, db: KnobDatabase) -> Route:
        """The baseline route as trtexec defines it: pinned knobs at their pinned value, varied
        knobs at the backend's default (even when the default is not among the listed values)."""
        return Route.of({i.knob: i.values[0] if i.pinned else db.get(i.knob).default
                         for i in self.items})
