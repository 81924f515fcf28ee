"""JSON Schema files for every file format dossier writes or reads, generated from its models.

The files under ``schemas/`` (committed once; a wheel installs them as the package
``dossier.schemas``) are never edited by hand: ``dossier schema`` writes them,
``dossier schema --check`` (and ``tests/bundle/test_schemas.py``) fails when they drift from the
models. Field descriptions come from the models' attribute docstrings, read here from their
source (not by pydantic's ``use_attribute_docstrings`` when each model class is made, which
costs every command that imports the models the parsing of their source). The JSON is
deterministic: sorted keys, two-space indent, trailing newline.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import json
import os
import textwrap
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from dossier.audit import BundleDiff, Explanation
from dossier.bundle.manifest import FORMAT_VERSION, Manifest, ModelIdentity, ValidationInfo
from dossier.bundle.overview import Overview
from dossier.cache import CacheHeader, DecisionRecord, HoldoutRecord, SessionRecord
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
    "tuning-cache-holdout.schema.json": (HoldoutRecord, "serialization"),
    "fingerprint.schema.json": (Fingerprint, "serialization"),
    "release-spec.schema.json": (ReleaseSpec, "validation"),
    "explanation.v1.schema.json": (Explanation, "serialization"),
    "bundle-diff.schema.json": (BundleDiff, "serialization"),
    "verify-report.schema.json": (VerifyReport, "serialization"),
    "bundle-overview.schema.json": (Overview, "serialization"),
}
"""File name -> (model, mode). Files dossier writes are described as written
("serialization"); the release spec, which people write, as accepted ("validation")."""

_INTERNAL_FIELDS: dict[type[BaseModel], tuple[str, ...]] = {ReleaseSpec: ("base_dir",)}
"""Fields that never appear in the file (set by the loader, excluded when dumping)."""


@functools.cache
def _own_field_docs(cls: type[BaseModel]) -> dict[str, str]:
    """The docstrings written under the annotated attributes of ``cls`` itself (the string
    right after ``name: type [= default]``), cleaned like any docstring."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # pragma: no cover - a class made without source
        return {}
    node = ast.parse(source).body[0]
    docs: dict[str, str] = {}
    if isinstance(node, ast.ClassDef):
        for stmt, after in zip(node.body, node.body[1:], strict=False):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def field_docs(cls: type[BaseModel]) -> dict[str, str]:
    """Field name -> attribute docstring for every field of ``cls``: a field takes the docstring
    of the class (in the MRO) that declares it last; a field with ``Field(description=...)``
    keeps that."""
    docs: dict[str, str] = {}
    for name, info in cls.model_fields.items():
        owner = next((k for k in cls.__mro__ if name in k.__dict__.get("__annotations__", {})),
                     None)
        if info.description is None and owner is not None and issubclass(owner, BaseModel):
            doc = _own_field_docs(owner).get(name)
            if doc is not None:
                docs[name] = doc
    return docs


class _Described(GenerateJsonSchema):
    """pydantic's JSON Schema, with each model field's attribute docstring as its description
    (placed as pydantic places a ``Field(description=...)``: beside the field's type, and left
    out beside a ``$ref`` whose model already says the same)."""

    def model_schema(self, schema: core_schema.ModelSchema) -> JsonSchemaValue:
        json_schema = super().model_schema(schema)
        cls = schema["cls"]
        properties = json_schema.get("properties", {})
        for name, doc in field_docs(cls).items():
            key = self._key(cls.model_fields[name], name)
            if key in properties and "description" not in properties[key]:
                properties[key] = self.handle_ref_overrides({**properties[key],
                                                             "description": doc})
        return json_schema

    def _key(self, info: FieldInfo, name: str) -> str:
        """The field's property name in this schema (its alias, where it has one)."""
        if not self.by_alias:
            return name
        alias = info.validation_alias if self.mode == "validation" else info.serialization_alias
        return alias if isinstance(alias, str) else info.alias or name


def schema_of(model: type[BaseModel], mode: str = "serialization") -> dict[str, Any]:
    """The JSON Schema of ``model`` (with the dialect and the fields' descriptions)."""
    schema = model.model_json_schema(mode=mode, schema_generator=_Described)  # type: ignore[arg-type]
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
    there that are no longer generated; return the written paths.

    The changed files are written beside their targets first and renamed into place only once
    all of them are written, so a full disk leaves the folder as it was (DiskFullError, exit 74;
    other failures OutputError, exit 7)."""
    from dossier.diskfull import output_error
    from dossier.files import new_staging, remove_stale_staging

    folder = Path(folder)
    files = generate()
    staged: list[tuple[Path, Path]] = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(folder)  # what a killed earlier run left
        for name, text in files.items():
            path = folder / name
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                tmp = new_staging(folder, name, directory=False)
                staged.append((tmp, path))
                tmp.write_text(text, encoding="utf-8")
        for tmp, path in staged:
            os.replace(tmp, path)
        staged = []
        for stale in folder.glob("*.schema.json"):
            if stale.name not in files:
                stale.unlink()
    except OSError as exc:
        raise output_error(exc, folder, f"writing schemas into {folder}",
                           f"write schemas into {folder}") from exc
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
    return [folder / name for name in files]


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
