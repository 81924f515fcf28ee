"""Reading a release spec the way a user means it: an unknown ``[tune]`` key that names knobs of
the spec's backend (``threads``: the thread-count knobs) is said as such, with the knobs and
where knobs go (``selection``), rather than as a misspelt ``[tune]`` key (``threshold``?).

Apart from :mod:`dossier.spec`, which knows no backend (the bundle reads specs too)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from dossier.backends.registry import get_backend
from dossier.errors import DossierError, SpecError
from dossier.spec import ReleaseSpec, UnknownTuneKeyError, load_spec


def load_release_spec(path: Path, overrides: dict[str, Any] | None = None) -> ReleaseSpec:
    """:func:`dossier.spec.load_spec`, with an unknown ``[tune]`` key that names knobs of the
    backend said as knobs (SpecError, exit 3)."""
    try:
        return load_spec(path, overrides)
    except UnknownTuneKeyError as exc:
        knob = knob_key(exc.path, exc.key, exc.backend)
        if knob is None:
            raise
        raise knob from None


def knob_key(path: Path, name: str, backend: str) -> SpecError | None:
    """The SpecError for ``[tune]`` key ``name`` when it names knobs of ``backend`` (the knob
    names that hold it, or close to it); None when it names none, or the backend cannot say
    (not installed here)."""
    try:
        db = get_backend(backend).knob_database()
    except (DossierError, ImportError, OSError, RuntimeError):
        return None
    key = name.lower().strip("-_ ")
    if len(key) < 3:
        return None
    close = set(difflib.get_close_matches(key, [k.name for k in db.knobs], n=3, cutoff=0.75))
    knobs = [k for k in db.knobs if key in k.name.lower() or k.name in close]
    if not knobs:
        return None
    listed = ", ".join(f"-{k.name}" for k in knobs[:4])
    values = knobs[0].values or ("VALUE",)
    example = f"-{knobs[0].name}=[{'|'.join(values[:2])}]"
    return SpecError(f"{path}: tune: {name} is not a [tune] key; it names knobs of the "
                     f"{backend} backend: {listed}",
                     hint=f"knobs are chosen in selection, e.g. selection = \"{example}\"; "
                          f"`dossier knobs --backend {backend}` lists them")
