"""How production loads a shipped engine (recorded in the bundle manifest): a model of its own,
so that reading a manifest imports no backend (and no numpy)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LoadConfig(BaseModel):
    """How production should load a shipped engine: the configuration dossier timed it in."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    call: str
    """The loader call, in the backend's Python API, with ``ENGINE`` for the engine's path."""
    options: dict[str, str] = Field(default_factory=dict)
    """Options set on top of the library's defaults (e.g. ORT session options), by name."""
    environment: dict[str, str] = Field(default_factory=dict)
    """Environment variables the loading process needs."""
    note: str = ""
    """What else to know (e.g. what the options are for)."""
    snippet: str = ""
    """A few lines of Python that load the engine this way."""
