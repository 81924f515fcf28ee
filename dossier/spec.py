"""Release specs: ``release.toml``, what a release is tuned for and how.

Paths inside a spec are relative to the spec's folder. Every section but ``[release]``,
``[model]``, ``[validation]`` and ``[tune]`` is optional.

Every number of a spec is bounded: finite (no ``inf`` or ``nan``), and at most a maximum far
beyond any real use but below what would overflow, exhaust memory or switch a check off (the
maxima are the fields' ``le`` constraints here, and :data:`dossier.measure.timing.TIMING_MAXIMA` for ``[timing]``).
A spec outside them is refused with SpecError (exit 3) before anything runs.
"""

from __future__ import annotations

import difflib
import os
import sys
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dossier.errors import SpecError
from dossier.files import read_small
from dossier.measure.target import TargetConditions
from dossier.measure.timing import TimingSettings
from dossier.names import RELEASE_NAME, RELEASE_NAME_MAX, RELEASE_VERSION_MAX
from dossier.scenario import ScenarioSection
from dossier.validation import Metric

StrategyName = Literal["fast", "mixed", "full", "random", "budget"]
"""The search strategies (:mod:`dossier.strategies` registers one class per name)."""
BUILTIN_BACKENDS = ("onnxruntime", "torch-inductor", "tensorrt")
"""Backends that ship with dossier; others register through the backend registry, which
checks the name when a search starts (so the spec keeps ``backend`` a string)."""

DIM_MAX = 2**31 - 1
"""The largest dimension of a shape (what every backend's int32 shape fields hold)."""

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ReleaseSection(_Section):
    """Which release this is."""

    name: str = Field(pattern=RELEASE_NAME, max_length=RELEASE_NAME_MAX)
    """Release name: letters, digits, '.', '_' and '-'."""
    version: int = Field(1, ge=1, le=RELEASE_VERSION_MAX)
    """Release version; a new bundle of the same name needs a higher one."""
    description: str = ""
    """One line for people."""


class ModelSection(_Section):
    """The model to compile."""

    path: str
    """Model file (ONNX for onnxruntime and tensorrt), or ``module:factory`` for torch-inductor."""


class ValidationSection(_Section):
    """The validation set."""

    path: str
    """Folder of pair-NNN/{inputs,references}.arrow."""


class CalibrationSection(_Section):
    """The calibration set: inputs only, for routes that need data to build (static
    quantization). Never overlaps the validation or hold-out set."""

    path: str
    """Folder of sample-NNN/inputs.arrow (or pair-NNN/inputs.arrow)."""


class HoldoutSection(_Section):
    """The hold-out set: pairs never seen during the search, on which the route about to ship
    is checked once more."""

    path: str
    """Folder of pair-NNN/{inputs,references}.arrow, like the validation set."""


class AccuracyRule(_Section):
    """When a route's outputs are accurate enough: every loss of every pair below the threshold.

    Models that carry the rule in their own flat fields (the ``[tune]`` table, the worker's
    request) extend this class, so the four fields are declared once and stored bytes keep
    their flat form."""

    metric: Metric = "l0"
    """Loss: l0, l1, l2, linf or cos."""
    threshold: float = Field(gt=0, allow_inf_nan=False)
    """Admissible when every loss of every pair is below this (finite: infinity would switch
    the accuracy check off)."""
    atol: float = Field(1e-5, ge=0, le=1e6, allow_inf_nan=False)
    """Absolute tolerance for l0 (at most 1e6: a larger one switches the check off)."""
    rtol: float = Field(1e-5, ge=0, le=1e3, allow_inf_nan=False)
    """Relative tolerance for l0 (at most 1e3)."""


class TuneSection(AccuracyRule):
    """How to search, and the accuracy rule a route must pass."""

    backend: str = Field("onnxruntime", json_schema_extra={"examples": list(BUILTIN_BACKENDS)})
    """Compiler backend: a name of the backend registry (built in: onnxruntime,
    torch-inductor, tensorrt)."""
    strategy: StrategyName = "fast"
    """fast, mixed, full, random or budget."""
    selection: str
    """Knobs to vary and pin, trtexec syntax: ``-a=[x|y] -b=z``."""
    max_builds: int | None = Field(None, ge=1, le=10**6)
    """random and budget: routes measured at most, the baseline included."""
    max_search_s: float | None = Field(None, gt=0, le=365 * 86400.0, allow_inf_nan=False)
    """random and budget: seconds of trials at most (the sum of their wall times)."""
    seed: int = Field(0, ge=0, le=2**32 - 1)
    """random and budget: the seed of the draws (the same seed, the same proposals)."""
    patience: int | None = Field(None, ge=1, le=10**6)
    """budget: proposals in a row without a gain of the minimum effect before the search stops
    (default 50)."""


class ShapeEntry(_Section):
    """One input shape combination of the traffic the release is tuned for."""

    weight: float = Field(1.0, gt=0, le=1e12, allow_inf_nan=False)
    """Share of the traffic (weights need not sum to 1)."""
    inputs: dict[str, list[int]]
    """Shape of every input (every dimension from 1 to 2**31 - 1)."""

    @field_validator("inputs")
    @classmethod
    def _dimensions(cls, v: dict[str, list[int]]) -> dict[str, list[int]]:
        for name, dims in v.items():
            if any(d < 1 or d > DIM_MAX for d in dims):
                raise ValueError(f"input {name!r} has shape {tuple(dims)}: every dimension must "
                                 f"be at least 1 and at most {DIM_MAX}")
        return v


class DeploymentSection(_Section):
    """Expected use, to weigh the search's cost against its benefit."""

    inferences_per_day: float = Field(0, ge=0, le=1e15, allow_inf_nan=False)
    """Expected inferences per day on one host."""
    horizon_days: float = Field(90, gt=0, le=36500, allow_inf_nan=False)
    """How long the release is expected to serve (at most a century)."""
    hosts: int = Field(1, ge=1, le=10**9)
    """Hosts it serves on."""


class ReleaseSpec(_Section):
    """A release spec."""

    release: ReleaseSection
    """Release identity."""
    model: ModelSection
    """The model."""
    validation: ValidationSection
    """The validation set."""
    calibration: CalibrationSection | None = None
    """The calibration set (static quantization routes need one)."""
    holdout: HoldoutSection | None = None
    """The hold-out set (optional; recommended whenever routes change the numbers)."""
    tune: TuneSection
    """The search."""
    timing: TimingSettings = TimingSettings()
    """Timing and decision settings."""
    shapes: list[ShapeEntry] = Field(default_factory=list)
    """Shape distribution the release is tuned for."""
    builder: dict[str, Any] = Field(default_factory=dict)
    """Backend builder options kept apart from knobs (TensorRT: optimization level, hardware
    compatibility, version-compatible, timing iterations...)."""
    deployment: DeploymentSection = DeploymentSection()
    """Expected use."""
    target: TargetConditions = TargetConditions()
    """The conditions the engine will serve under (cores, co-tenants, GPU share): what the
    figures are measured as close to as the host allows (:mod:`dossier.measure.target`)."""
    scenario: ScenarioSection = ScenarioSection()
    """The load profile the release serves (:mod:`dossier.scenario`): single-stream (the
    default), server or offline."""
    base_dir: str = Field("", exclude=True)
    """Folder the spec's relative paths are resolved against."""

    @field_validator("timing")
    @classmethod
    def _bounded(cls, timing: TimingSettings) -> TimingSettings:
        """Every ``[timing]`` number finite and at most its maximum
        (:meth:`~dossier.measure.timing.TimingSettings.out_of_bounds`)."""
        problem = timing.out_of_bounds()
        if problem:
            raise ValueError(problem)
        return timing

    def resolve(self, path: str) -> Path:
        """A path of the spec, resolved against the spec's folder."""
        p = Path(path)
        return p if p.is_absolute() else Path(self.base_dir) / p

    def resolved(self, *, model: Path, validation: Path, selection: str) -> ReleaseSpec:
        """This spec as a search runs it: the model and the data sets as absolute paths, the
        selection in canonical form; no ``base_dir`` (its paths do not depend on one).
        It is what the tuning cache header keeps, and what reading the header gives back."""
        return self.model_copy(update={
            "model": ModelSection(path=str(model)),
            "validation": ValidationSection(path=str(validation)),
            "calibration": CalibrationSection(path=str(self.resolve(self.calibration.path)
                                                       .resolve()))
            if self.calibration else None,
            "holdout": HoldoutSection(path=str(self.resolve(self.holdout.path).resolve()))
            if self.holdout else None,
            "tune": self.tune.model_copy(update={"selection": selection}),
            "base_dir": ""})

    def model_path(self) -> Path:
        """The model file (absolute); ``module:factory`` references are returned unresolved."""
        try:
            if ":" in self.model.path and not Path(self.resolve(self.model.path)).exists() \
                    and "/" not in self.model.path.split(":")[0]:
                return Path(self.model.path)
            path = self.resolve(self.model.path).resolve()
            if path.is_dir():
                raise SpecError(f"[model] path {self.model.path[:200]!r} is a folder ({path}), "
                                "not a model file",
                                hint="name the model file in it, e.g. path = \"model.onnx\"")
            try:
                os.stat(path)  # a name too long to be looked up, say: said here, not later
            except (FileNotFoundError, NotADirectoryError):
                pass  # said by the backend's check of the model
            return path
        except (OSError, RuntimeError) as exc:  # a symbolic link loop, a name over NAME_MAX
            why = getattr(exc, "strerror", None) or str(exc)
            raise SpecError(f"model path {self.model.path[:200]!r}: {why}") from None


SPEC_MAX_BYTES = 16 << 20
"""Largest release spec read (a FIFO or a device is refused at once, see read_small)."""


def load_spec(path: Path, overrides: dict[str, Any] | None = None) -> ReleaseSpec:
    """Read a release spec; ``overrides`` replace keys of ``[tune]`` (CLI flags)."""
    path = Path(path)
    try:
        data = tomllib.loads(read_small(path, SPEC_MAX_BYTES).decode("utf-8"))
    except FileNotFoundError:
        raise SpecError(f"release spec {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read release spec {path}: {exc}") from exc
    except (tomllib.TOMLDecodeError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise SpecError(f"{path} is not valid TOML: {exc}") from exc
    if not isinstance(data.get("tune", {}), dict):
        raise SpecError(f"{path}: tune: must be a table ([tune]), not a {type(data['tune']).__name__}")
    tune = dict(data.get("tune", {}))
    tune.update({k: v for k, v in (overrides or {}).items() if v is not None})
    data["tune"] = tune
    try:
        spec = ReleaseSpec.model_validate({**data, "base_dir": str(path.parent.resolve())})
    except ValidationError as exc:
        errors = exc.errors()
        # a misspelt key is why the key it stands for is missing: it is named first
        err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        loc = [str(p) for p in err["loc"]]
        if loc[:1] == ["tune"] and len(loc) > 1 and (overrides or {}).get(loc[1]) is not None:
            raise SpecError(f"--{loc[1]} {overrides[loc[1]]}: {err['msg']}",  # type: ignore[index]
                            hint=f"the command line overrides tune.{loc[1]} of {path}") from exc
        if err["type"] == "extra_forbidden":
            unknown = _unknown_key(path, err["loc"], err["input"])
            if tuple(err["loc"][:1]) == ("tune",) and len(err["loc"]) == 2:
                backend = tune.get("backend")
                raise UnknownTuneKeyError(
                    str(unknown), key=str(err["loc"][1]), path=path,
                    backend=backend if isinstance(backend, str)
                    else str(TuneSection.model_fields["backend"].default)) from exc
            raise unknown from exc
        raise SpecError(f"{path}: {_where(err['loc'])}: {err['msg']}") from exc
    return spec


class UnknownTuneKeyError(SpecError):
    """A key ``[tune]`` does not have: it may name knobs of the backend, which
    :func:`dossier.spec_knobs.load_release_spec` says (this module knows no backend)."""

    def __init__(self, message: str, *, key: str, path: Path, backend: str) -> None:
        super().__init__(message, hint="")
        self.key, self.path, self.backend = key, path, backend


def _where(loc: tuple[int | str, ...]) -> str:
    """A place in the spec as its author wrote it: ``tune.threshold``, ``[[shapes]] entry 2:
    weight`` (entries numbered from 1, as every other message about them)."""
    if len(loc) > 1 and loc[0] == "shapes" and isinstance(loc[1], int):
        rest = ".".join(str(p) for p in loc[2:])
        return f"[[shapes]] entry {loc[1] + 1}" + (f": {rest}" if rest else "")
    return ".".join(str(p) for p in loc)


def _unknown_key(path: Path, loc: tuple[int | str, ...], value: object) -> SpecError:
    """A key or table the spec does not have, with the closest names it does have."""
    model: Any = ReleaseSpec
    for part in loc[:-1]:
        if isinstance(part, int):  # an entry of [[shapes]]
            continue
        field = getattr(model, "model_fields", {}).get(part)
        annotation = field.annotation if field is not None else None
        args = typing.get_args(annotation)
        model = args[0] if typing.get_origin(annotation) is list and args else annotation
    known = [name for name, f in getattr(model, "model_fields", {}).items() if not f.exclude]
    name = str(loc[-1])
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    if len(loc) == 1:
        what = f"unknown table [{name}]" if isinstance(value, dict) else f"unknown key {name}"
        suggest = ", ".join(f"[{c}]" if isinstance(value, dict) else c for c in close)
    else:
        what = f"{_where(loc[:-1])}: unknown key {name}"
        suggest = ", ".join(close)
    return SpecError(f"{path}: {what}" + (f" (did you mean {suggest}?)" if suggest else ""),
                     hint=f"known: {', '.join(known)}" if not close and known else None)
