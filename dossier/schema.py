"""JSON Schema files for every file format dossier writes or reads, generated from its models.

The files under ``schemas/`` (committed once; a wheel installs them as the package
``dossier.schemas``) are never edited by hand: ``dossier schema`` writes them,
``dossier schema --check`` (and ``tests/test_schemas.py``) fails when they drift from the
models. Field descriptions come from
the models' attribute docstrings. The JSON is deterministic: sorted keys, two-space indent,
trailing newline.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from dossier.audit import BundleDiff, Explanation
from dossier.bundle.manifest import FORMAT_VERSION, Manifest, ModelIdentity, ValidationInfo
from dossier.cache import CacheHeader, DecisionRecord, SessionRecord
from dossier.errors import OutputError
from dossier.fingerprint import Fingerprint
from dossier.spec import ReleaseSpec
from dossier.trial import TrialRecord
from dossier.verify import VerifyReport

DIALECT = "https://json-schema.org/draft/2020-12/schema"
_MAJOR = FORMAT_VERSION.split(".")[0]

SCHEMAS: dict[str, tuple[type[BaseModel], str]] = {
    f"bundle-manifest.v{_MAJOR}.schema.json": (Manifest, "serialization"),
    f"bundle-model.v{_MAJOR}.schema.json": (ModelIdentity, "serialization"),
    f"bundle-validation.v{_MAJOR}.schema.json": (ValidationInfo, "serialization"),
    "tuning-cache-header.schema.json": (CacheHeader, "serialization"),
    "tuning-cache-trial.schema.json": (TrialRecord, "serialization"),
    "tuning-cache-session.schema.json": (SessionRecord, "serialization"),
    "tuning-cache-decision.schema.json": (DecisionRecord, "serialization"),
    "fingerprint.schema.json": (Fingerprint, "serialization"),
    "release-spec.schema.json": (ReleaseSpec, "validation"),
    "explanation.v1.schema.json": (Explanation, "serialization"),
    "bundle-diff.schema.json": (BundleDiff, "serialization"),
    "verify-report.schema.json": (VerifyReport, "serialization"),
}
"""File name -> (model, mode). Files dossier writes are described as written
("serialization"); the release spec, which people write, as accepted ("validation")."""

_INTERNAL_FIELDS: dict[type[BaseModel], tuple[str, ...]] = {ReleaseSpec: ("base_dir",)}
"""Fields that never appear in the file (set by the loader, excluded when dumping)."""


def schema_of(model: type[BaseModel], mode: str = "serialization") -> dict[str, Any]:
    """The JSON Schema of ``model`` (with the dialect)."""
    schema = model.model_json_schema(mode=mode)  # type: ignore[arg-type]
    for name in _INTERNAL_FIELDS.get(model, ()):
        schema.get("properties", {}).pop(name, None)
        if name in schema.get("required", []):
            schema["required"].remove(name)
    return {"$schema": DIALECT, **schema}


def render(schema: dict[str, Any]) -> str:
    """Deterministic JSON text: sorted keys, indent 2, trailing newline."""
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def generate() -> dict[str, str]:
    """Every schema file: name -> text."""
    return {name: render(schema_of(model, mode)) for name, (model, mode) in sorted(SCHEMAS.items())}


def write_schemas(folder: Path) -> list[Path]:
    """Write every schema file into ``folder`` (created if needed) and remove schema files
    there that are no longer generated; return the written paths."""
    folder = Path(folder)
    files = generate()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.schema.json"):
            if stale.name not in files:
                stale.unlink()
        written = []
        for name, text in files.items():
            path = folder / name
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
            written.append(path)
    except OSError as exc:
        raise OutputError(f"cannot write schemas into {folder}: {exc.strerror}") from exc
    return written


def check_schemas(folder: Path) -> list[str]:
    """Names of schema files in ``folder`` that are missing, differ from the generated text,
    or are no longer generated (empty: up to date)."""
    folder = Path(folder)
    files = generate()
    drifted = []
    for name, text in files.items():
        path = folder / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            drifted.append(name)
    if folder.is_dir():
        drifted += [p.name for p in folder.glob("*.schema.json") if p.name not in files]
    return sorted(drifted)


def packaged_dir() -> Path:
    """The folder of the installed schema files: the package ``dossier.schemas`` (the checkout's
    ``schemas/`` in an editable install, or when the library is imported from a checkout)."""
    found = importlib.util.find_spec("dossier.schemas")
    if found is None or found.origin is None:  # dossier/ imported from a checkout: schemas/ beside it
        return Path(__file__).resolve().parent.parent / "schemas"
    return Path(found.origin).parent


def packaged_schema(name: str) -> dict[str, Any]:
    """A schema shipped with the package (``dossier/schemas/NAME``), parsed."""
    data: dict[str, Any] = json.loads((packaged_dir() / name).read_text(encoding="utf-8"))
    return data
