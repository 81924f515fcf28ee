"""The bundle manifest (format ``dossier-bundle`` 1.1) and the models of its JSON files.

A reader checks ``format`` and ``format_version`` before anything else (:func:`parse_manifest`):
an unknown major version is refused with :class:`~dossier.errors.BundleFormatError`; a newer
minor version of a known major is read with a note, its unknown fields ignored (minor versions
only ever add optional fields). The dossier id is the xxh3-128 of the manifest's canonical JSON
(sorted keys, compact) without the ``dossier_id`` field, computed over the JSON as it is on disk,
so fields this reader does not know are covered too.
"""

from __future__ import annotations

import json
import re
import types
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dossier.errors import BundleFormatError
from dossier.hashing import canonical_json, digest_json
from dossier.load_config import LoadConfig
from dossier.names import (
    RELEASE_NAME,
    RELEASE_NAME_MAX,
    RELEASE_VERSION_MAX,
    check_file_name,
    has_control,
)
from dossier.trial import Reading, Shipped, TimingSummary

FORMAT: Literal["dossier-bundle"] = "dossier-bundle"
"""Value of the manifest's ``format`` field."""
FORMAT_VERSION = "1.1"
"""The format version this code writes (MAJOR.MINOR)."""
READABLE_MAJORS = (1,)
"""Major format versions this code reads."""
MANIFEST_NAME = "manifest.json"
MANIFEST_MAX_BYTES = 16 << 20
"""A manifest larger than this is refused before it is parsed."""
MODEL_JSON = "model.json"
"""The model's identity (:class:`ModelIdentity`)."""
VALIDATION_JSON = "validation.json"
"""What the validation set is (:class:`ValidationInfo`)."""
BUNDLE_SUFFIX = ".dossier"
"""A bundle folder is ``NAME-VERSION.dossier``."""
ARCHIVE_SUFFIX = ".dossier.tar"
"""Its single-file form is ``NAME-VERSION.dossier.tar``."""

_DIGEST = r"^[0-9a-f]{32}$"
_VERSION = re.compile(r"^(\d+)\.(\d+)$")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def check_relative_path(path: str) -> str:
    """``path`` when it is a plain relative POSIX path inside a bundle; ValueError otherwise."""
    parts = path.split("/")
    if (not path or path.startswith("/") or "\\" in path or has_control(path)
            or any(p in ("", ".", "..") for p in parts)):
        raise ValueError(f"{path!r} is not a relative path inside the bundle")
    return path


class FileEntry(_Model):
    """One file of the bundle."""

    path: str
    """Relative POSIX path inside the bundle folder."""
    size: int = Field(ge=0)
    """Size in bytes."""
    digest: str = Field(pattern=_DIGEST)
    """xxh3-128 of the content, 32 hex digits."""

    @field_validator("path")
    @classmethod
    def _relative(cls, path: str) -> str:
        return check_relative_path(path)


class ExternalFile(_Model):
    """A file the model references (ONNX external data)."""

    path: str
    """Location relative to the model file's folder, as the model names it."""
    size: int = Field(ge=0)
    """Size in bytes."""
    digest: str = Field(pattern=_DIGEST)
    """xxh3-128 of the content."""


class ModelIdentity(_Model):
    """What model was tuned: ``model.json``."""

    file_name: str
    """The model file's name (no folder)."""

    @field_validator("file_name")
    @classmethod
    def _plain(cls, name: str) -> str:
        return check_file_name(name)
    size: int = Field(ge=0)
    """Size in bytes."""
    digest: str = Field(pattern=_DIGEST)
    """xxh3-128 of the model file."""
    algorithm: Literal["xxh3-128"] = "xxh3-128"
    """Digest algorithm (detects corruption, not forgery)."""
    external_data: list[ExternalFile] = Field(default_factory=list)
    """External weight files (ONNX initializers stored outside the model file), by location."""
    external_data_known: bool = True
    """False when the model file was not at hand when bundling, so external files are unknown."""


class ValidationInfo(_Model):
    """How accuracy was judged: ``validation.json``."""

    # metric..rtol are dossier.spec.AccuracyRule's fields, declared again on purpose: a stored
    # format reads what older versions wrote (no new constraints, same schema), and the
    # manifest stays free of the spec's imports (numpy, pyarrow) for a fast verify.

    metric: str
    """Loss metric: l0, l1, l2, linf or cos."""
    threshold: float
    """A route is admissible when every loss of every pair is below this."""
    atol: float
    """Absolute tolerance (l0 only)."""
    rtol: float
    """Relative tolerance (l0 only)."""
    pairs: list[str]
    """Pair folder names under ``validation/``."""
    pair_inputs: dict[str, dict[str, list[int]]]
    """Per pair, the shape of every input."""
    digest: str = Field(pattern=_DIGEST)
    """xxh3-128 over every tensor of the set (as in the tuning cache header)."""
    references: str
    """How the reference outputs were produced (``method`` of provenance.json), or "unknown"."""
    provenance: str | None = None
    """Bundle path of the provenance file, when the set has one."""


class EngineEntry(_Model):
    """One engine artifact of the bundle."""

    path: str
    """Bundle path of the engine file."""
    route: str
    """The build route it was built with (load-time knobs included; apply them when loading)."""
    trial_index: int
    """Index of the tuning trial that built it."""
    size: int = Field(ge=0)
    """Size in bytes."""
    digest: str = Field(pattern=_DIGEST)
    """xxh3-128 of the file."""
    facts: dict[str, str] = Field(default_factory=dict)
    """What the backend reported about the built engine."""
    flags: dict[str, bool] = Field(default_factory=dict)
    """Boolean engine facts the verify policy uses (e.g. layout_optimized)."""
    load: LoadConfig | None = None
    """How production should load it: the configuration it was timed in (format 1.1)."""


class Engines(_Model):
    """The shipped engine and the baseline engine (to re-time both on a target host)."""

    shipped: EngineEntry
    """The engine to deploy."""
    baseline: EngineEntry | None
    """The baseline (default route) engine; the same entry as ``shipped`` when the baseline ships;
    null when the bundle has none (imported from trtexec, which keeps only the winner's engine)."""


class Summary(Shipped):
    """What was searched, how it was judged, and what won."""

    # baseline_route, shipped_route, shipped_index, gain: declared by Shipped

    strategy: str
    """Search strategy."""
    selection: str
    """The selection, trtexec syntax."""
    metric: str
    """Loss metric."""
    threshold: float
    """Admissibility threshold (every loss below it)."""
    atol: float
    """Absolute tolerance (l0)."""
    rtol: float
    """Relative tolerance (l0)."""
    validation_pairs: int
    """Number of validation pairs."""
    inferences_per_sample: int | None = Field(None, ge=1)
    """Inferences in one timed sample (``[timing] inputs``); None in bundles from before the
    setting, whose samples ran every validation pair (:attr:`per_sample`)."""
    baseline_timing: TimingSummary | None
    """The baseline's latency in its own trial."""
    speedup: float | None
    """Shipped route's speedup over the baseline (baseline median / shipped median); None without gain."""
    speedup_ci_low: float | None
    """Lower end of the speedup's confidence interval."""
    speedup_ci_high: float | None
    """Upper end of the speedup's confidence interval."""
    confidence: float
    """Confidence level of every interval (e.g. 0.95)."""
    p_value: float | None
    """Rank-test p-value of the shipped route against the baseline."""
    result: str
    """``1.234x [1.200, 1.270] (p=0.001)``, or ``no significant gain``."""
    reason: str
    """The decision's reason, in a sentence."""
    decision_rule: str
    """The decision rule in force, in words."""
    runner_up_route: str | None
    """The next-best admissible route."""
    runner_up_speedup: float | None
    """Its speedup over the baseline."""
    trial_counts: dict[str, int]
    """Baseline and search trials per outcome (ok, rejected, build_failed, ...)."""
    confirm_trials: int
    """Confirmation re-measurements (not counted in ``trial_counts``)."""
    search_wall_s: float
    """Wall time of the search: the sum over every tune session."""
    build_s_total: float
    """Sum of every trial's engine build time."""
    sessions: int
    """Runs of tune (and tune --continue) the search took."""
    aa: Reading | None = None
    """The run's calibration: the baseline against a second load of itself (format 1.1)."""
    confirm_aa: Reading | None = None
    """The same check in the independent confirmation, when it ran (format 1.1)."""

    @property
    def per_sample(self) -> int:
        """Inferences in one timed sample: every latency is a sample divided by them."""
        return self.inferences_per_sample or self.validation_pairs


class Manifest(_Model):
    """``manifest.json``: identity, summary and file table of a bundle."""

    format: Literal["dossier-bundle"] = FORMAT
    """Always "dossier-bundle"."""
    format_version: str = Field(FORMAT_VERSION, pattern=r"^\d+\.\d+$")
    """MAJOR.MINOR. Readers refuse an unknown major; a newer minor only adds optional fields."""
    dossier_id: str = Field(pattern=_DIGEST)
    """xxh3-128 of this manifest's canonical JSON without this field."""
    release: str = Field(pattern=RELEASE_NAME, max_length=RELEASE_NAME_MAX)
    """Release name: letters, digits, '.', '_' and '-' (the spec's rule)."""
    release_version: int = Field(ge=1, le=RELEASE_VERSION_MAX)
    """Release version; a later bundle of the same name has a higher one."""
    description: str = ""
    """Release description."""
    parent: str | None = Field(None, pattern=_DIGEST)
    """Dossier id of the bundle this one replaces, if any."""
    created_at: str
    """When the search that produced the bundle finished (UTC, ISO 8601)."""
    tool_version: str
    """dossier version that wrote the bundle."""
    backend: str
    """Compiler backend."""
    tuner_version: str
    """Version of the knob source (ORT / torch / TensorRT tuner)."""
    knob_db_digest: str = Field(pattern=_DIGEST)
    """xxh3-128 of the knob database (knobs.json)."""
    model: ModelIdentity
    """The model tuned (also in model.json)."""
    model_included: bool
    """Whether the model file (and its external data) is under ``model/``."""
    engines: Engines
    """The engine artifacts."""
    summary: Summary
    """The search and its result."""
    tuning_host: dict[str, str] = Field(default_factory=dict)
    """Summary of the tuning host (hostname, CPU, backend stack); details in fingerprint.json."""
    warnings: list[str] = Field(default_factory=list)
    """What the writer found questionable (e.g. too few validation pairs)."""
    files: list[FileEntry]
    """Every file of the bundle but manifest.json, sorted by path."""

    @field_validator("files")
    @classmethod
    def _sorted_unique(cls, files: list[FileEntry]) -> list[FileEntry]:
        paths = [f.path for f in files]
        if paths != sorted(paths) or len(set(paths)) != len(paths):
            raise ValueError("the file table must be sorted by path, without duplicates")
        if MANIFEST_NAME in paths:
            raise ValueError("the file table must not list manifest.json")
        return files

    @model_validator(mode="after")
    def _engines_listed(self) -> Manifest:
        table = {f.path: f for f in self.files}
        for engine in (self.engines.shipped, self.engines.baseline):
            if engine is None:
                continue
            entry = table.get(engine.path)
            if entry is None or (entry.size, entry.digest) != (engine.size, engine.digest):
                raise ValueError(f"engine {engine.path} does not match the file table")
        return self

    def table(self) -> dict[str, FileEntry]:
        """The file table by path."""
        return {f.path: f for f in self.files}

    @property
    def name(self) -> str:
        """``NAME-VERSION``: the bundle's folder name without ``.dossier``."""
        return f"{self.release}-{self.release_version}"


def body_digest(raw: dict[str, Any]) -> str:
    """The dossier id of a manifest given as parsed JSON: xxh3-128 of its canonical JSON
    without ``dossier_id``."""
    return digest_json({k: v for k, v in raw.items() if k != "dossier_id"})


def manifest_bytes(manifest: Manifest) -> bytes:
    """How a manifest is stored: indented JSON with sorted keys and a trailing newline."""
    data = manifest.model_dump(mode="json")
    return (json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def seal(manifest: Manifest) -> Manifest:
    """``manifest`` with its dossier id computed."""
    data = manifest.model_dump(mode="json")
    return manifest.model_copy(update={"dossier_id": body_digest(data)})


def parse_version(text: object, where: str) -> tuple[int, int]:
    """(major, minor) of a format version string; BundleFormatError when malformed."""
    m = _VERSION.match(text) if isinstance(text, str) else None
    if not m:
        raise BundleFormatError(f"{where}: format_version {text!r} is not MAJOR.MINOR")
    return int(m[1]), int(m[2])


def parse_manifest(data: bytes, where: str = MANIFEST_NAME) -> tuple[dict[str, Any], Manifest,
                                                                      list[str]]:
    """Check the format version first, then parse a manifest.

    Returns the JSON as read, the model, and notes for the reader (a newer minor version).
    Raises BundleFormatError for anything that is not a manifest of a readable format version.
    """
    if len(data) > MANIFEST_MAX_BYTES:
        raise BundleFormatError(f"{where} is larger than {MANIFEST_MAX_BYTES >> 20} MiB; "
                                "not a dossier manifest")
    try:
        raw = json.loads(data)
        canonical_json(raw)  # the dossier id is computed over this: no NaN, no lone surrogate
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise BundleFormatError(f"{where} is not valid JSON ({exc})",
                                hint="the bundle is corrupt; fetch it again") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        found = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise BundleFormatError(f"{where} is not a dossier bundle manifest (format {found!r}, "
                                f"expected {FORMAT!r})")
    version = raw.get("format_version")
    major, minor = parse_version(version, where)
    known_major, known_minor = parse_version(FORMAT_VERSION, "this reader")
    readable = ", ".join(f"{m}.x" for m in READABLE_MAJORS)
    if major not in READABLE_MAJORS:
        raise BundleFormatError(
            f"{where}: bundle format version {version} cannot be read; this dossier reads "
            f"format versions {readable} (up to {FORMAT_VERSION})",
            hint="upgrade dossier on this host" if major > known_major
            else "re-bundle the run with a dossier that writes a readable format")
    notes: list[str] = []
    content: dict[str, Any] = raw
    if major == known_major and minor > known_minor:
        notes.append(f"bundle format {version} is newer than this reader's {FORMAT_VERSION}; "
                     "fields it does not know are ignored")
        content = _prune(Manifest, raw)
    try:
        manifest = Manifest.model_validate(content)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise BundleFormatError(f"{where} does not match bundle format {version}: {loc}: "
                                f"{err['msg']}", hint="the bundle is corrupt; fetch it again") from exc
    return raw, manifest, notes


def _prune(model: type[BaseModel], data: Any) -> Any:
    """``data`` without the keys ``model`` (and its nested models) do not know."""
    if not isinstance(data, dict):
        return data
    out = {}
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is None:
            continue
        out[key] = _prune_value(field.annotation, value)
    return out


def _prune_value(annotation: Any, value: Any) -> Any:
    models = _models_in(annotation)
    if len(models) != 1:
        return value
    (inner,) = models
    origin = typing.get_origin(annotation)
    if isinstance(value, list) and origin is list:
        return [_prune(inner, v) for v in value]
    if isinstance(value, dict) and origin is dict:
        return {k: _prune(inner, v) for k, v in value.items()}
    return _prune(inner, value)


def _models_in(annotation: Any) -> set[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {annotation}
    found: set[type[BaseModel]] = set()
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list, dict, tuple):
        for arg in typing.get_args(annotation):
            found |= _models_in(arg)
    return found


__all__ = ["FORMAT", "FORMAT_VERSION", "MANIFEST_MAX_BYTES", "MANIFEST_NAME", "READABLE_MAJORS",
           "Engines", "EngineEntry", "ExternalFile", "FileEntry", "Manifest", "ModelIdentity",
           "Summary", "ValidationInfo", "body_digest", "check_relative_path",
           "manifest_bytes", "parse_manifest", "parse_version", "seal"]
