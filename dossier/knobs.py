"""Knobs and the knob database.

A knob is one compiler option with a set of allowed values and a default. The knob database is
every knob a backend exposes on this host, in the backend's own order (the order matters: the
``fast`` strategy walks the selection, and TensorRT reports its knobs in a fixed order).
"""

from __future__ import annotations

import difflib
import enum

from pydantic import BaseModel, ConfigDict, Field

from dossier.errors import SelectionError
from dossier.hashing import digest_json


class KnobPhase(str, enum.Enum):
    """When a knob acts."""

    BUILD = "build"
    """Baked into the engine when it is built."""
    LOAD = "load"
    """Applied when the engine is loaded (a session option); recorded with the engine."""
    TRANSFORM = "transform"
    """Applied to the model before the compiler sees it (quantization, another precision): the
    transformed model is what is compiled, so the knob is part of the build."""


class Knob(BaseModel):
    """One compiler option."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """Name without the leading '-', e.g. ``graph_optimization_level`` or ``optimizer:NchwcTransformer``."""
    values: tuple[str, ...] | None
    """Allowed values in the backend's order; None for an unbounded knob (it can be pinned, not swept)."""
    default: str
    """The value the compiler uses when the knob is not set."""
    help: str = ""
    """What the knob does, as the backend describes it."""
    value_hint: str | None = None
    """For an unbounded knob: the value type the backend names (e.g. ``int32_t``)."""
    phase: KnobPhase = KnobPhase.BUILD
    """Whether the knob acts at build time or at load time."""
    changes_numerics: bool = False
    """True when a non-default value is known to change the outputs beyond rounding."""

    @property
    def bounded(self) -> bool:
        """True when the knob has a finite list of allowed values."""
        return self.values is not None

    def allowed_text(self) -> str:
        """The allowed values the way TensorRT prints them: ``-name=[a|b]`` or ``-name=int32_t``."""
        if self.values is None:
            return f"-{self.name}={self.value_hint or '...'}"
        return f"-{self.name}=[{'|'.join(self.values)}]"


class KnobDatabase(BaseModel):
    """All knobs a backend exposes on this host."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str
    """Backend name, e.g. ``onnxruntime``."""
    tuner_version: str
    """Version of whatever defines the knobs (TensorRT's tuner version, the ORT or torch version)."""
    knobs: tuple[Knob, ...] = Field(default_factory=tuple)
    """The knobs, in the backend's order."""

    def names(self) -> list[str]:
        """Knob names in the backend's order."""
        return [k.name for k in self.knobs]

    def get(self, name: str) -> Knob:
        """The knob called ``name`` (leading '-' optional); SelectionError with a suggestion if unknown."""
        bare = name[1:] if name.startswith("-") else name
        for knob in self.knobs:
            if knob.name == bare:
                return knob
        close = difflib.get_close_matches(bare, self.names(), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join('-' + c for c in close)}?" if close else (
            f"`dossier knobs --backend {self.backend}` lists the {len(self.knobs)} knobs")
        raise SelectionError(f"unknown knob -{bare} for backend {self.backend}", hint=hint)

    def digest(self) -> str:
        """xxh3-128 of the database's canonical JSON: changes when any knob, value or default does."""
        return digest_json(self.model_dump(mode="json"))
