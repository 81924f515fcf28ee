"""The TensorRT Python API as the real bindings define it, for checking the backend and its fakes.

``tests/assets/tensorrt-api/VERSION.json`` lists the classes, members, enum members and return
classes of a ``tensorrt-cu13-bindings`` wheel, read from its ``tensorrt.so`` without loading it
(``bench/tensorrt_api.py`` regenerates them). :class:`Api` answers whether a name exists in
*every* listed version; :class:`Checked` wraps a test fake so that each TensorRT name the backend
touches through it must exist there (and is recorded).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ASSETS = Path(__file__).parent / "assets" / "tensorrt-api"
FORMAT = "dossier-tensorrt-api-1"


@dataclass(frozen=True)
class Listing:
    """One bindings wheel's API."""

    version: str
    module: frozenset[str]
    classes: Mapping[str, Mapping[str, str]]
    enums: Mapping[str, frozenset[str]]
    returns: Mapping[str, str]

    @classmethod
    def load(cls, path: Path) -> Listing:
        """Read and validate a listing (a file on disk: its shape is checked, not trusted)."""
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{path.name}: not a {FORMAT} listing")
        version, module = data.get("tensorrt_version"), data.get("module")
        classes, enums, returns = data.get("classes"), data.get("enums"), data.get("returns")
        if not (isinstance(version, str) and path.name == f"{version}.json"
                and isinstance(module, list) and all(isinstance(m, str) for m in module)
                and isinstance(classes, dict) and isinstance(enums, dict)
                and isinstance(returns, dict)):
            raise ValueError(f"{path.name}: malformed listing")
        for name, members in classes.items():
            if not isinstance(members, dict) or not all(
                    k in ("method", "property") for k in members.values()):
                raise ValueError(f"{path.name}: class {name} is malformed")
        for name, values in enums.items():
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise ValueError(f"{path.name}: enum {name} is malformed")
        return cls(version, frozenset(module), classes,
                   {k: frozenset(v) for k, v in enums.items()}, returns)

    def kind(self, owner: str | None, name: str) -> str | None:
        """What ``owner.name`` is: "class", "enum", "method", "property", "member" (of an
        enum), "module" (a module-level name that is none of those), or None if absent.
        ``owner`` None is the ``tensorrt`` module; nested types are ``Outer.Inner``."""
        qualified = name if owner is None else f"{owner}.{name}"
        if qualified in self.enums:
            return "enum"
        if qualified in self.classes and (owner is not None or name in self.module):
            return "class"
        if owner is None:
            return "module" if name in self.module else None
        if owner in self.enums:
            return "member" if name in self.enums[owner] else None
        return self.classes.get(owner, {}).get(name)


def listings() -> list[Listing]:
    """Every committed listing, oldest version first."""
    found = [Listing.load(p) for p in ASSETS.glob("*.json")]
    return sorted(found, key=lambda x: tuple(int(p) for p in x.version.split(".")))


@dataclass
class Api:
    """The names every listed TensorRT version has; :meth:`require` fails on any other."""

    versions: list[Listing] = field(default_factory=listings)
    seen: set[tuple[str, str]] = field(default_factory=set)

    def kind(self, owner: str | None, name: str) -> str:
        kinds = {v.version: v.kind(owner, name) for v in self.versions}
        where = f"{owner or 'tensorrt'}.{name}"
        missing = sorted(v for v, k in kinds.items() if k is None)
        if missing:
            raise AssertionError(f"{where} is not in the TensorRT Python bindings "
                                 f"{', '.join(missing)}")
        if len(set(kinds.values())) > 1:
            raise AssertionError(f"{where} is not the same kind of name in every version: {kinds}")
        self.seen.add((owner or "tensorrt", name))
        return next(iter(kinds.values()))  # type: ignore[return-value]

    def returns(self, where: str) -> str | None:
        found = {v.returns.get(where) for v in self.versions}
        return found.pop() if len(found) == 1 else None


_PLAIN = (type(None), bool, int, float, str, bytes, bytearray, memoryview, tuple, list, dict)


class Checked:
    """A test fake seen as the TensorRT object ``owner`` (a class name; None for the module).

    Every attribute read or written through it must exist in every listed version (else
    AssertionError, which the backend does not catch). Classes and nested types come back
    checked; calling a class needs its ``__init__``; what a method or property returns is
    checked as the class the fake's object stands for (``kinds``: fake type -> TensorRT
    class), which must be the class the real binding returns where the listing knows it.
    A checked class can be subclassed (the backend's logger derives from ``trt.ILogger``)."""

    __slots__ = ("_obj", "_owner", "_api", "_kinds")

    def __init__(self, obj: Any, owner: str | None, api: Api,
                 kinds: Mapping[type, str]) -> None:
        for k, v in (("_obj", obj), ("_owner", owner), ("_api", api), ("_kinds", kinds)):
            object.__setattr__(self, k, v)

    def _wrap(self, value: Any, owner: str | None, where: str) -> Any:
        api, kinds = object.__getattribute__(self, "_api"), object.__getattribute__(self, "_kinds")
        fake_kind = kinds.get(type(value))
        expected = api.returns(where)
        if fake_kind is None or isinstance(value, _PLAIN):
            if expected and not isinstance(value, _PLAIN) and value is not None:
                raise AssertionError(f"{where} returns a TensorRT {expected}; the fake returns "
                                     f"an unmapped {type(value).__name__}")
            return value
        if expected and expected != fake_kind:
            raise AssertionError(f"{where} returns a TensorRT {expected}; the fake returns "
                                 f"one standing for {fake_kind}")
        return Checked(value, fake_kind, api, kinds)

    def __getattribute__(self, name: str) -> Any:
        obj = object.__getattribute__(self, "_obj")
        owner = object.__getattribute__(self, "_owner")
        api = object.__getattribute__(self, "_api")
        kinds = object.__getattribute__(self, "_kinds")
        if name == "__mro_entries__":  # `class X(trt.ILogger)` derives from the fake class
            return lambda bases: (obj,)
        if name == "__class__":  # isinstance() asks; answer for the wrapper, not TensorRT
            return Checked
        kind = api.kind(owner, name)
        value = getattr(obj, name)
        where = name if owner is None else f"{owner}.{name}"
        if kind in ("class", "enum"):
            return Checked(value, where, api, kinds)
        if kind == "method" or (kind == "module" and callable(value)):
            wrap = object.__getattribute__(self, "_wrap")
            return _Method(value, lambda result: wrap(result, None, where))
        if kind == "property":
            return object.__getattribute__(self, "_wrap")(value, None, where)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        owner = object.__getattribute__(self, "_owner")
        kind = object.__getattribute__(self, "_api").kind(owner, name)
        if kind != "property":
            raise AssertionError(f"{owner}.{name} is a {kind}, not a settable property")
        setattr(object.__getattribute__(self, "_obj"), name, _unwrap(value))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        owner = object.__getattribute__(self, "_owner")
        api = object.__getattribute__(self, "_api")
        api.kind(owner, "__init__")
        result = object.__getattribute__(self, "_obj")(*map(_unwrap, args),
                                                       **{k: _unwrap(v) for k, v in kwargs.items()})
        return Checked(result, owner, api, object.__getattribute__(self, "_kinds"))


class _Method:
    """A bound method of a fake: arguments unwrapped, the result checked."""

    def __init__(self, fn: Callable[..., Any], check: Callable[[Any], Any]) -> None:
        self._fn, self._check = fn, check

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._check(self._fn(*map(_unwrap, args),
                                    **{k: _unwrap(v) for k, v in kwargs.items()}))


def _unwrap(value: Any) -> Any:
    return object.__getattribute__(value, "_obj") if isinstance(value, Checked) else value
