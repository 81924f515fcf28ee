"""TensorRT backend (enterprise TensorRT >= 11.1, Linux, NVIDIA GPU).

Knobs are the build-route knobs of TensorRT's global performance tuner: the knob database is the
``IBuilderConfig.all_build_routes`` JSON, a route is set with ``IBuilderConfig.build_route``.
Builder options (optimization level, tiling, compatibility, timing iterations, memory pools) are
*not* knobs: they are :class:`BuilderOptions`, fixed for a whole search and recorded with every
engine. Written against the documented 11.x API (see the project's TensorRT reference notes);
``tensorrt`` and ``cuda`` (cuda-python) are imported inside methods only, so this module imports
everywhere and its pure parts (knob JSON, plan header, builder option mapping, optimization
profile) work without TensorRT.

Errors raised here, besides the interface's BuildError / EngineRuntimeError:

- :class:`KnobJsonError` (an InputError): the knob database JSON is malformed.
- :class:`PlanHeaderError` (a BundleFormatError): bytes that are not a TensorRT plan, or a plan
  header this reader does not know. A BundleError because plans reach this parser as bundle
  engine files (``verify``, ``explain``); the build path never lets it escape.
- BackendUnavailableError: TensorRT / cuda-python not installed, TensorRT older than 11.1, or a
  platform where the tuner is disabled (``all_build_routes`` is empty: TensorRT-RTX, Windows, a
  TensorRT built without the tuner).

The TensorRT names used here (classes, methods, properties, enum members) are checked in CI
against listings read from the real bindings wheels of :data:`BINDINGS_CHECKED`
(``tests/assets/tensorrt-api``, made by ``bench/tensorrt_api.py``).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dossier.backends.interface import (
    Backend,
    BuildError,
    BuildInfo,
    EngineRuntimeError,
    LoadConfig,
    ModelSignature,
    Runner,
)
from dossier.backends.onnx_model import onnx_signature
from dossier.errors import BackendUnavailableError, BundleFormatError, InputError, SelectionError
from dossier.knobs import Knob, KnobDatabase
from dossier.routes import Route

MIN_VERSION = (11, 1)
"""First TensorRT release with build routes (``IBuilderConfig.build_route``)."""
BINDINGS_CHECKED = ("11.1.0.106", "11.4.0.106")
"""TensorRT Python bindings whose API listing every TensorRT name used here is checked against
(the oldest and the newest 11.x wheel with build routes on PyPI)."""
INTERNAL_OPTIONS_ENV = "TRT_INTERNAL_OPTIONS"
"""TensorRT's internal switches; its ``bypass_build_route_whitelist`` lets TensorRT accept knobs
that ``all_build_routes`` does not list. Recorded with every engine built."""

_NAME = re.compile(r"^[^=\s\[\]|]+$")
"""What a knob name may be: anything a route token ``-name=value`` can carry."""


class KnobJsonError(InputError):
    """The TensorRT knob database JSON (``all_build_routes``) is malformed."""

    hint = ("the knob database is the JSON TensorRT returns from IBuilderConfig.all_build_routes "
            "(trtexec --helpBuildRoute prints it); pass it unchanged")


class PlanHeaderError(BundleFormatError):
    """Bytes that are not a TensorRT plan, or a plan header of a layout this reader does not know."""


# --------------------------------------------------------------------------------------------
# Knob database


def parse_knob_json(text: str) -> KnobDatabase:
    """Parse TensorRT's ``all_build_routes`` JSON into a knob database.

    Each ``tuner_options`` entry has ``option`` (``-name``, namespaces kept: ``-kgen:tiling``),
    ``allowed_values`` (``-name=[a|b]`` is bounded; ``-name=int32_t``, or ``...`` inside the
    brackets, is unbounded: such a knob can be pinned, not swept), ``default_value`` and
    ``help``. ``help`` may be missing (it is descriptive only); unknown extra fields are ignored
    so a newer TensorRT's JSON still reads. Knob names are stored without the leading '-'.

    Raises:
        BackendUnavailableError: ``text`` is empty: TensorRT returns an empty string where the
            tuner is disabled (TensorRT-RTX, Windows).
        KnobJsonError: malformed JSON, a missing or mistyped field, ``allowed_values`` naming
            another knob, a default outside a bounded list, a duplicate knob or value.
    """
    if not text.strip():
        raise BackendUnavailableError(
            "TensorRT's global performance tuner is not available on this platform: "
            "IBuilderConfig.all_build_routes is empty, as on TensorRT-RTX, on Windows and in a "
            "TensorRT built without the tuner",
            hint="build routes exist only in enterprise TensorRT >= 11.1 on Linux, not in "
                 "TensorRT-RTX or on Windows")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise KnobJsonError(f"the TensorRT knob database is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise KnobJsonError("the TensorRT knob database is not a JSON object")
    tuner_version = data.get("tuner_version")
    if not isinstance(tuner_version, str) or not tuner_version:
        raise KnobJsonError("the TensorRT knob database has no tuner_version string")
    options = data.get("tuner_options")
    if not isinstance(options, list):
        raise KnobJsonError("the TensorRT knob database has no tuner_options list")
    knobs: list[Knob] = []
    seen: set[str] = set()
    for i, entry in enumerate(options):
        knob = _parse_option(entry, f"tuner_options[{i}]")
        if knob.name in seen:
            raise KnobJsonError(f"tuner_options[{i}]: knob -{knob.name} is listed twice")
        seen.add(knob.name)
        knobs.append(knob)
    return KnobDatabase(backend="tensorrt", tuner_version=tuner_version, knobs=tuple(knobs))


def _parse_option(entry: object, where: str) -> Knob:
    if not isinstance(entry, dict):
        raise KnobJsonError(f"{where} is not a JSON object")
    fields: dict[str, str] = {}
    for key in ("option", "allowed_values", "default_value"):
        value = entry.get(key)
        if value is None:
            raise KnobJsonError(f"{where} has no {key!r}")
        if not isinstance(value, str):
            raise KnobJsonError(f"{where}: {key!r} is not a string")
        fields[key] = value
    help_text = entry.get("help", "")
    if not isinstance(help_text, str):
        raise KnobJsonError(f"{where}: 'help' is not a string")
    option = fields["option"]
    name = option[1:] if option.startswith("-") else option
    if not _NAME.match(name):
        raise KnobJsonError(f"{where}: option {option!r} is not a usable knob name")
    where = f"{where} (-{name})"
    allowed = fields["allowed_values"]
    bare = allowed[1:] if allowed.startswith("-") else allowed
    named, eq, spec = bare.partition("=")
    if not eq:
        raise KnobJsonError(f"{where}: allowed_values {allowed!r} is not of the form "
                            f"-{name}=[a|b] or -{name}=<type>")
    if named != name:
        raise KnobJsonError(f"{where}: allowed_values {allowed!r} names knob -{named}, "
                            f"not -{name}")
    default = fields["default_value"]
    values: tuple[str, ...] | None
    hint: str | None = None
    if spec.startswith("[") or spec.endswith("]"):
        if not (spec.startswith("[") and spec.endswith("]")) or len(spec) < 2:
            raise KnobJsonError(f"{where}: allowed_values {allowed!r} has unbalanced brackets")
        items = spec[1:-1].split("|")
        if any(not v or not _NAME.match(v) for v in items):
            raise KnobJsonError(f"{where}: allowed_values {allowed!r} has an empty or "
                                "unusable value")
        dupes = sorted({v for v in items if items.count(v) > 1})
        if dupes:
            raise KnobJsonError(f"{where}: value {dupes[0]!r} is listed twice in {allowed!r}")
        if any("..." in v for v in items):  # an open-ended list: examples, not the allowed set
            values, hint = None, spec
        else:
            values = tuple(items)
            if default not in values:
                raise KnobJsonError(f"{where}: default_value {default!r} is not one of the "
                                    f"allowed values {allowed!r}")
    else:
        if not spec or any(c.isspace() for c in spec):
            raise KnobJsonError(f"{where}: allowed_values {allowed!r} names no value type")
        values, hint = None, spec
    return Knob(name=name, values=values, default=default, help=help_text, value_hint=hint)


# --------------------------------------------------------------------------------------------
# Builder options

_TILING = {"none": ("NONE", 0), "fast": ("FAST", 1), "moderate": ("MODERATE", 2),
           "full": ("FULL", 3)}
_HARDWARE = {"none": ("NONE", "none"), "ampere_plus": ("AMPERE_PLUS", "ampere+"),
             "same_compute_capability": ("SAME_COMPUTE_CAPABILITY", "sameComputeCapability")}
_PLATFORM = {"same_as_build": ("SAME_AS_BUILD", "SameAsBuild"),
             "windows_amd64": ("WINDOWS_AMD64", "WindowsAMD64")}


class BuilderOptions(BaseModel):
    """TensorRT builder settings that are not build-route knobs. They are fixed for a whole
    search (the same for the baseline and every candidate) and recorded with the engine."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    builder_optimization_level: int = Field(default=3, ge=0, le=5)
    """``IBuilderConfig.builder_optimization_level``; 0-5, TensorRT's default 3."""
    tiling_optimization_level: Literal["none", "fast", "moderate", "full"] = "none"
    """``IBuilderConfig.tiling_optimization_level``; trtexec's default is none."""
    hardware_compatibility_level: Literal["none", "ampere_plus", "same_compute_capability"] = "none"
    """Engines portable across GPU architectures (ampere_plus) or across GPUs of the same compute
    capability. Both limit tactics (and may cost speed)."""
    version_compatible: bool = False
    """``BuilderFlag.VERSION_COMPATIBLE``: the engine runs on later 11.x runtimes (may be slower)."""
    exclude_lean_runtime: bool = False
    """``BuilderFlag.EXCLUDE_LEAN_RUNTIME``: do not embed the lean runtime (needs
    version_compatible; the engine then needs a lean runtime library of the same version)."""
    avg_timing_iterations: int = Field(default=8, ge=1)
    """``IBuilderConfig.avg_timing_iterations``: timing runs averaged per tactic. The API's
    default is 1; we follow trtexec's 8 (``--avgTiming``) so engines match what trtexec builds."""
    max_aux_streams: int | None = Field(default=None, ge=0)
    """``IBuilderConfig.max_aux_streams``; None lets TensorRT decide."""
    workspace_bytes: int | None = Field(default=None, ge=1)
    """Limit of the WORKSPACE memory pool in bytes; None keeps TensorRT's default (device memory)."""
    runtime_platform: Literal["same_as_build", "windows_amd64"] = "same_as_build"
    """Platform the engine will run on; windows_amd64 cross-builds (the engine cannot run here)."""

    @model_validator(mode="after")
    def _lean_needs_vc(self) -> BuilderOptions:
        if self.exclude_lean_runtime and not self.version_compatible:
            raise ValueError("exclude_lean_runtime needs version_compatible")
        return self

    def to_trtexec_args(self) -> list[str]:
        """The trtexec flags that build with the same settings. Levels are always spelled out
        (so a changed trtexec default cannot change the build); switches only when on."""
        args = [f"--builderOptimizationLevel={self.builder_optimization_level}",
                f"--tilingOptimizationLevel={_TILING[self.tiling_optimization_level][1]}",
                f"--avgTiming={self.avg_timing_iterations}",
                f"--hardwareCompatibilityLevel={_HARDWARE[self.hardware_compatibility_level][1]}"]
        if self.version_compatible:
            args.append("--versionCompatible")
        if self.exclude_lean_runtime:
            args.append("--excludeLeanRuntime")
        if self.max_aux_streams is not None:
            args.append(f"--maxAuxStreams={self.max_aux_streams}")
        if self.workspace_bytes is not None:
            args.append(f"--memPoolSize=workspace:{self.workspace_bytes}B")
        if self.runtime_platform != "same_as_build":
            args.append(f"--runtimePlatform={_PLATFORM[self.runtime_platform][1]}")
        return args

    def apply(self, config: Any, trt: Any) -> None:
        """Set these options on an ``IBuilderConfig`` (``trt`` is the ``tensorrt`` module).

        Every option is written, flags set or cleared explicitly, so the result does not depend
        on what the config held before."""
        config.builder_optimization_level = self.builder_optimization_level
        config.tiling_optimization_level = getattr(
            trt.TilingOptimizationLevel, _TILING[self.tiling_optimization_level][0])
        config.hardware_compatibility_level = getattr(
            trt.HardwareCompatibilityLevel, _HARDWARE[self.hardware_compatibility_level][0])
        for flag, on in ((trt.BuilderFlag.VERSION_COMPATIBLE, self.version_compatible),
                         (trt.BuilderFlag.EXCLUDE_LEAN_RUNTIME, self.exclude_lean_runtime)):
            if on:
                config.set_flag(flag)
            else:
                config.clear_flag(flag)
        config.avg_timing_iterations = self.avg_timing_iterations
        if self.max_aux_streams is not None:
            config.max_aux_streams = self.max_aux_streams
        if self.workspace_bytes is not None:
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, self.workspace_bytes)
        config.runtime_platform = getattr(trt.RuntimePlatform,
                                          _PLATFORM[self.runtime_platform][0])

    def facts(self) -> dict[str, str]:
        """The options as engine facts (strings), plus the equivalent trtexec flags."""
        out = {k: ("" if v is None else str(v).lower() if isinstance(v, bool) else str(v))
               for k, v in self.model_dump().items()}
        out["trtexec_args"] = " ".join(self.to_trtexec_args())
        return out


# --------------------------------------------------------------------------------------------
# Optimization profile


@dataclass(frozen=True)
class InputProfile:
    """min / opt / max shape of one input in a TensorRT optimization profile."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


ShapePoint = tuple[Mapping[str, Sequence[int]], float]
"""One entry of a shape distribution: the shape of every input, and its weight."""


def optimization_profile(shapes: Sequence[ShapePoint | Any]) -> dict[str, InputProfile]:
    """min / opt / max per input from a shape distribution.

    ``shapes`` holds entries ``({input: shape}, weight)``, or objects with ``inputs`` and
    ``weight`` attributes (the release spec's ``[[shapes]]`` entries). min and max are taken
    elementwise over every entry; opt is the shape of the entry with the largest weight (the
    first one on a tie). Inputs come out in the order the first entry names them.

    Raises InputError for an empty distribution, entries naming different inputs, ranks that
    differ, negative or non-integer dimensions, or a negative / non-finite weight.
    """
    points: list[tuple[dict[str, tuple[int, ...]], float]] = []
    for i, entry in enumerate(shapes):
        entry = cast(Any, entry)
        if hasattr(entry, "inputs") and hasattr(entry, "weight"):
            mapping, weight = entry.inputs, entry.weight
        else:
            try:
                mapping, weight = entry
            except (TypeError, ValueError):
                raise InputError(f"shape entry {i} is not ({{input: shape}}, weight)") from None
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) \
                or not math.isfinite(weight) or weight < 0:
            raise InputError(f"shape entry {i} has weight {weight!r}; weights are finite and >= 0")
        if not isinstance(mapping, Mapping) or not mapping:
            raise InputError(f"shape entry {i} names no inputs")
        dims: dict[str, tuple[int, ...]] = {}
        for name, shape in mapping.items():
            dims[name] = _shape(shape, f"shape entry {i}: input {name!r}")
        points.append((dims, float(weight)))
    if not points:
        raise InputError("the shape distribution is empty",
                         hint="give at least one [[shapes]] entry with the shape of every input")
    first = points[0][0]
    for i, (dims, _) in enumerate(points[1:], start=1):
        if set(dims) != set(first):
            raise InputError(f"shape entry {i} names inputs {sorted(dims)}, entry 0 names "
                             f"{sorted(first)}; every entry gives every input")
        for name, shape in dims.items():
            if len(shape) != len(first[name]):
                raise InputError(f"input {name!r} has rank {len(shape)} in shape entry {i} and "
                                 f"rank {len(first[name])} in entry 0")
    best = max(range(len(points)), key=lambda k: (points[k][1], -k))
    return {name: InputProfile(
        min=tuple(min(p[0][name][d] for p in points) for d in range(len(first[name]))),
        opt=points[best][0][name],
        max=tuple(max(p[0][name][d] for p in points) for d in range(len(first[name]))))
        for name in first}


def _shape(shape: object, where: str) -> tuple[int, ...]:
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence) or any(
            isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        raise InputError(f"{where} has shape {shape!r}; dimensions are integers >= 0")
    return tuple(int(d) for d in shape)


# --------------------------------------------------------------------------------------------
# Plan header

PLAN_TAG = 0x74727466
"""u32 little-endian at byte 0 of every TensorRT plan (b"ftrt")."""
KNOWN_SERIALIZATION_VERSIONS = (0,)
"""Serialization versions (u32 at byte 4) whose header layout is known; trtexec handles only 0."""
_HEADER_SIZE = 28


class PlanHeader(BaseModel):
    """The fields of a TensorRT plan's header that can be read without deserializing it."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    tag: int
    """u32 at byte 0; always 0x74727466."""
    serialization_version: int
    """u32 at byte 4."""
    trt_version: tuple[int, int, int, int]
    """Bytes 24..27: major, minor, patch, build of the TensorRT that built the plan."""

    @property
    def trt_version_text(self) -> str:
        """``major.minor.patch.build``, as ``trtexec --getPlanVersionOnly`` reports it."""
        return ".".join(str(v) for v in self.trt_version)

    def facts(self) -> dict[str, str]:
        """The header as engine facts."""
        return {"plan_tag": f"0x{self.tag:08x}",
                "plan_serialization_version": str(self.serialization_version),
                "plan_trt_version": self.trt_version_text}


def parse_plan_header(data: bytes) -> PlanHeader:
    """Read a plan's header (the first 28 bytes are enough).

    Layout: u32 little-endian tag 0x74727466 at byte 0, u32 serialization version at byte 4,
    TensorRT major, minor, patch, build as one byte each at bytes 24..27.

    Raises PlanHeaderError when ``data`` is shorter than 28 bytes, does not start with the tag,
    or has a serialization version whose layout is not known.
    """
    data = bytes(data[:_HEADER_SIZE])
    if len(data) < 8 or struct.unpack_from("<I", data, 0)[0] != PLAN_TAG:
        if len(data) >= 4:
            tag = f"0x{struct.unpack_from('<I', data, 0)[0]:08x}"
            raise PlanHeaderError(f"not a TensorRT plan (tag {tag}, expected 0x{PLAN_TAG:08x})")
        raise PlanHeaderError(f"not a TensorRT plan ({len(data)} bytes; a plan header has "
                              f"{_HEADER_SIZE})")
    if len(data) < _HEADER_SIZE:
        raise PlanHeaderError(f"truncated TensorRT plan ({len(data)} bytes; the header has "
                              f"{_HEADER_SIZE})")
    version = struct.unpack_from("<I", data, 4)[0]
    if version not in KNOWN_SERIALIZATION_VERSIONS:
        raise PlanHeaderError(
            f"TensorRT plan with serialization version {version}; this reader knows "
            f"{', '.join(map(str, KNOWN_SERIALIZATION_VERSIONS))}",
            hint="a newer dossier may read it; `trtexec --loadEngine=PLAN --getPlanVersionOnly` "
                 "prints its TensorRT version")
    major, minor, patch, build = data[24:28]
    return PlanHeader(tag=PLAN_TAG, serialization_version=version,
                      trt_version=(major, minor, patch, build))


def read_plan_header(path: Path) -> PlanHeader:
    """:func:`parse_plan_header` of the file at ``path``; PlanHeaderError if unreadable."""
    try:
        with open(path, "rb") as f:
            data = f.read(_HEADER_SIZE)
    except OSError as exc:
        raise PlanHeaderError(f"cannot read plan {path}: {exc.strerror or exc}") from None
    return parse_plan_header(data)


# --------------------------------------------------------------------------------------------
# Build route


def check_route(route: Route, db: KnobDatabase) -> None:
    """Refuse, before anything is built, a route that TensorRT's own whitelist would refuse.

    TensorRT validates build-route knob names against ``all_build_routes`` (unless
    ``bypass_build_route_whitelist`` is set through ``TRT_INTERNAL_OPTIONS``, which dossier does
    not follow); a value outside a bounded knob's list is refused too. Raises BuildError naming
    the first offending knob and the tuner version."""
    known = {k.name: k for k in db.knobs}
    unknown = [name for name, _ in route.values if name not in known]
    if unknown:
        bypass = (f"; {INTERNAL_OPTIONS_ENV} is set, and dossier does not follow its whitelist "
                  "bypass" if os.environ.get(INTERNAL_OPTIONS_ENV) else "")
        raise BuildError(f"knob -{unknown[0]} is not in IBuilderConfig.all_build_routes (tuner "
                         f"{db.tuner_version}, {len(known)} knobs); route {route} refused before "
                         f"building, as TensorRT would refuse it{bypass}")
    for name, value in route.values:
        allowed = known[name].values
        if allowed is not None and value not in allowed:
            raise BuildError(f"value {value!r} of -{name} is not in IBuilderConfig."
                             f"all_build_routes ({known[name].allowed_text()}); route {route} "
                             "refused before building")


def internal_options() -> dict[str, str]:
    """Whether ``TRT_INTERNAL_OPTIONS`` is set in this process, and its value, as engine facts."""
    value = os.environ.get(INTERNAL_OPTIONS_ENV)
    return {"trt_internal_options_set": "true" if value is not None else "false",
            "trt_internal_options": value or ""}


def set_build_route(config: Any, route: Route, errors: list[str] | None = None) -> None:
    """Set ``config.build_route`` to the route's text and read it back.

    The Python setter discards ``setBuildRoute``'s bool, so a rejected route (unknown knob, bad
    value) is only visible as a read-back that differs, or as an error in the TensorRT log.
    Tokens are compared as a set (TensorRT parses each knob separately, so order and spacing do
    not matter). ``errors`` is the log's error list; errors logged during the call fail it too.
    Raises BuildError.
    """
    text = route.text()
    logged = len(errors) if errors is not None else 0
    config.build_route = text
    got = config.build_route
    new_errors = errors[logged:] if errors is not None else []
    try:
        same = Route.parse(got or "").values == route.values
    except SelectionError:
        same = False
    if not same or new_errors:
        detail = f"; TensorRT logged: {new_errors[-1]}" if new_errors else ""
        raise BuildError(f"TensorRT did not accept build route {text!r} (read back "
                         f"{got!r}){detail}")


# --------------------------------------------------------------------------------------------
# Runtime glue (needs tensorrt and cuda-python)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _cudart() -> Any:
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        from cuda import cudart  # older cuda-python
    return cudart


def _check(cudart: Any, result: Any) -> Any:
    """Unpack a cuda-python ``(err, *values)`` result; EngineRuntimeError on a CUDA error."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        name = getattr(err, "name", str(err))
        raise EngineRuntimeError(f"CUDA error {name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _make_logger(trt: Any) -> Any:
    """A TensorRT logger that keeps the errors it sees (for messages: the Python API reports
    most failures as a None result or a discarded bool)."""

    class _Logger(trt.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt.ILogger.Severity.ERROR, trt.ILogger.Severity.INTERNAL_ERROR):
                self.errors.append(str(msg))

    return _Logger()


@dataclass
class _Bound:
    """Device buffers for one set of inputs (what :meth:`TensorRTRunner.prepare` returns)."""

    inputs: dict[str, tuple[int, tuple[int, ...]]]
    outputs: dict[str, tuple[int, tuple[int, ...], np.dtype]]


class TensorRTRunner(Runner):
    """A deserialized engine with one execution context, one CUDA stream and two events."""

    def __init__(self, trt: Any, cudart: Any, runtime: Any, engine: Any, context: Any) -> None:
        self._trt, self._cudart = trt, cudart
        self._runtime, self._engine, self._context = runtime, engine, context
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self._inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in names if n not in self._inputs]
        self._dtypes = {n: np.dtype(trt.nptype(engine.get_tensor_dtype(n))) for n in names}
        self._stream = _check(cudart, cudart.cudaStreamCreate())
        self._start = _check(cudart, cudart.cudaEventCreate())
        self._end = _check(cudart, cudart.cudaEventCreate())
        self._prepared: list[_Bound] = []

    def _malloc(self, nbytes: int) -> int:
        return int(_check(self._cudart, self._cudart.cudaMalloc(max(nbytes, 1))))

    def _free(self, bound: _Bound) -> None:
        for ptr, *_ in (*bound.inputs.values(), *bound.outputs.values()):
            self._cudart.cudaFree(ptr)

    def _bind(self, inputs: Mapping[str, np.ndarray]) -> _Bound:
        cudart = self._cudart
        if set(inputs) != set(self._inputs):
            raise EngineRuntimeError(f"inputs {sorted(inputs)} do not match the engine's "
                                     f"{sorted(self._inputs)}")
        bound = _Bound({}, {})
        try:
            for name in self._inputs:
                arr = np.ascontiguousarray(inputs[name])
                if arr.dtype != self._dtypes[name]:
                    raise EngineRuntimeError(f"input {name!r} is {arr.dtype}, the engine takes "
                                             f"{self._dtypes[name]}")
                if not self._context.set_input_shape(name, tuple(arr.shape)):
                    raise EngineRuntimeError(f"input {name!r} shape {tuple(arr.shape)} is outside "
                                             "the engine's optimization profile")
                ptr = self._malloc(arr.nbytes)
                bound.inputs[name] = (ptr, tuple(arr.shape))
                _check(cudart, cudart.cudaMemcpy(ptr, arr.ctypes.data, arr.nbytes,
                                                 cudart.cudaMemcpyKind.cudaMemcpyHostToDevice))
            for name in self._outputs:
                shape = tuple(self._context.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise EngineRuntimeError(f"output {name!r} has a data-dependent shape "
                                             f"{shape}; this runner does not support those")
                dtype = self._dtypes[name]
                nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                bound.outputs[name] = (self._malloc(nbytes), shape, dtype)
        except BaseException:
            self._free(bound)
            raise
        return bound

    def _use(self, bound: _Bound) -> None:
        """Point the context at ``bound``'s buffers (host-side calls only)."""
        for name, (ptr, shape) in bound.inputs.items():
            self._context.set_input_shape(name, shape)
            self._context.set_tensor_address(name, ptr)
        for name, (ptr, _, _) in bound.outputs.items():
            self._context.set_tensor_address(name, ptr)

    def _execute(self) -> None:
        if not self._context.execute_async_v3(int(self._stream)):
            raise EngineRuntimeError("IExecutionContext.execute_async_v3 failed")

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        cudart = self._cudart
        bound = self._bind(inputs)
        try:
            self._use(bound)
            self._execute()
            _check(cudart, cudart.cudaStreamSynchronize(self._stream))
            out: dict[str, np.ndarray] = {}
            for name, (ptr, shape, dtype) in bound.outputs.items():
                host = np.empty(shape, dtype=dtype)
                _check(cudart, cudart.cudaMemcpy(host.ctypes.data, ptr, host.nbytes,
                                                 cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost))
                out[name] = host
            return out
        finally:
            self._free(bound)

    def prepare(self, inputs: Mapping[str, np.ndarray]) -> object:
        """Copy the inputs to the device once; output buffers are allocated alongside."""
        bound = self._bind(inputs)
        self._prepared.append(bound)
        return bound

    def timed(self, prepared: object) -> float:
        """One inference on prepared device buffers, timed with CUDA events on the stream (ms).

        The context is pointed at the buffers before the start event, so host-side binding is
        not timed; the enqueue itself is (as in trtexec's GPU compute time)."""
        cudart = self._cudart
        if not isinstance(prepared, _Bound):
            raise TypeError("timed() takes what prepare() returned")
        self._use(prepared)
        _check(cudart, cudart.cudaEventRecord(self._start, self._stream))
        self._execute()
        _check(cudart, cudart.cudaEventRecord(self._end, self._stream))
        _check(cudart, cudart.cudaEventSynchronize(self._end))
        return float(_check(cudart, cudart.cudaEventElapsedTime(self._start, self._end)))

    def close(self) -> None:
        cudart = self._cudart
        for bound in self._prepared:
            self._free(bound)
        self._prepared.clear()
        if self._stream is not None:
            cudart.cudaEventDestroy(self._start)
            cudart.cudaEventDestroy(self._end)
            cudart.cudaStreamDestroy(self._stream)
            self._stream = None
        self._context = self._engine = self._runtime = None


# --------------------------------------------------------------------------------------------
# The backend


class TensorRTBackend(Backend):
    """Enterprise TensorRT >= 11.1: build routes from the global performance tuner."""

    name = "tensorrt"
    engine_suffix = ".plan"
    requirement = ("pip install tensorrt cuda-python (enterprise TensorRT >= 11.1 on Linux with "
                   "an NVIDIA GPU; build routes are not in TensorRT-RTX nor on Windows)")
    build_cores = 0  # tactic selection times kernels on the GPU: concurrent builds disturb it

    def __init__(self, options: BuilderOptions | None = None,
                 shapes: Sequence[ShapePoint | Any] | None = None) -> None:
        """``options`` apply to every build (default: trtexec's settings). ``shapes`` is the
        shape distribution the engine is tuned for; a model with dynamic inputs needs it."""
        self.options = options or BuilderOptions()
        self.shapes = list(shapes) if shapes else None
        self._db: KnobDatabase | None = None
        self._logger: Any = None


    def configure(self, options: Mapping[str, Any], shapes: list) -> None:
        """``[builder]`` options of the spec become :class:`BuilderOptions`; ``[[shapes]]`` the
        optimization profile."""
        try:
            self.options = BuilderOptions.model_validate(dict(options))
        except ValidationError as exc:
            err = exc.errors()[0]
            raise InputError(f"[builder] {'.'.join(map(str, err['loc']))}: {err['msg']}") from exc
        self.shapes = list(shapes) if shapes else None

    def available(self) -> bool:
        return (importlib.util.find_spec("tensorrt") is not None
                and importlib.util.find_spec("cuda") is not None)

    def require(self) -> None:
        """BackendUnavailableError naming what is missing and how to install it."""
        missing = [pkg for pkg, mod in (("tensorrt", "tensorrt"), ("cuda-python", "cuda"))
                   if importlib.util.find_spec(mod) is None]
        if missing:
            raise BackendUnavailableError(
                f"backend tensorrt needs {' and '.join(missing)}, not installed on this host; "
                f"install: {self.requirement}",
                hint="reading, verifying and explaining TensorRT bundles works without it")

    def _trt(self) -> Any:
        self.require()
        import tensorrt as trt

        if _version_tuple(trt.__version__)[:2] < MIN_VERSION:
            raise BackendUnavailableError(
                f"TensorRT {trt.__version__} is installed; build routes need TensorRT >= "
                f"{'.'.join(map(str, MIN_VERSION))}", hint=f"install: {self.requirement}")
        if self._logger is None:
            self._logger = _make_logger(trt)
        return trt

    def knob_database(self) -> KnobDatabase:
        """The knobs of ``IBuilderConfig.all_build_routes`` (read once per backend instance)."""
        if self._db is None:
            trt = self._trt()
            builder = trt.Builder(self._logger)
            config = builder.create_builder_config()
            self._db = parse_knob_json(config.all_build_routes)
        return self._db

    def signature(self, model: Path) -> ModelSignature:
        return onnx_signature(model)

    def stack(self) -> dict[str, str]:
        installed = {(d.metadata["Name"] or "").lower().replace("_", "-")
                     for d in metadata.distributions()}
        out: dict[str, str] = {pkg: metadata.version(pkg) for pkg in
               ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "cuda-python", "cuda-bindings",
                "onnx", "numpy") if pkg in installed}
        if self.available():
            import tensorrt as trt

            out["libnvinfer"] = trt.__version__  # the loaded library, not a wheel's label
        return out

    def engine_facts(self, route: Route, db: KnobDatabase) -> dict[str, bool]:
        return {"version_compatible": self.options.version_compatible,
                "hardware_compatible": self.options.hardware_compatibility_level != "none"}

    def build(self, model: Path, route: Route, engine: Path) -> BuildInfo:
        trt = self._trt()
        errors: list[str] = self._logger.errors
        errors.clear()
        try:
            builder = trt.Builder(self._logger)
            network = builder.create_network(0)
            parser = trt.OnnxParser(network, self._logger)
            if not parser.parse_from_file(str(model)):
                problems = [str(parser.get_error(i)) for i in range(parser.num_errors)]
                raise BuildError(f"TensorRT's ONNX parser rejected {Path(model).name}: "
                                 f"{problems[0] if problems else 'no detail'}")
            config = builder.create_builder_config()
            check_route(route, parse_knob_json(config.all_build_routes))
            self.options.apply(config, trt)
            set_build_route(config, route, errors)
            profile = self._profile(builder, network)
            if profile is not None and config.add_optimization_profile(profile) < 0:
                raise BuildError(f"TensorRT refused the optimization profile{_last(errors)}")
            plan = builder.build_serialized_network(network, config)
        except (RuntimeError, TypeError, ValueError) as exc:  # pybind-raised TensorRT failures
            raise BuildError(f"TensorRT failed while building route {route}: {exc}") from exc
        if plan is None:
            raise BuildError(f"TensorRT could not build route {route}{_last(errors)}")
        data = bytes(memoryview(plan))
        try:
            Path(engine).write_bytes(data)
        except OSError as exc:
            raise BuildError(f"cannot write engine {engine}: {exc.strerror or exc}") from exc
        facts = {"format": "tensorrt-plan", "build_route": route.text(),
                 "tensorrt_version": trt.__version__, **self.options.facts(),
                 **internal_options()}
        try:
            facts.update(parse_plan_header(data).facts())
        except PlanHeaderError as exc:  # a header layout we do not know must not fail the build
            facts["plan_header_error"] = str(exc)
        if self.shapes:
            facts["optimization_profile"] = json.dumps(
                {k: [list(p.min), list(p.opt), list(p.max)]
                 for k, p in optimization_profile(self.shapes).items()})
        return BuildInfo(facts)

    def _profile(self, builder: Any, network: Any) -> Any:
        inputs = [network.get_input(i) for i in range(network.num_inputs)]
        dynamic = [t.name for t in inputs if any(d < 0 for d in tuple(t.shape))]
        if not self.shapes:
            if dynamic:
                raise BuildError(f"input(s) {', '.join(dynamic)} have dynamic dimensions and no "
                                 "shape distribution was given; TensorRT needs an optimization "
                                 "profile (give the release's [[shapes]])")
            return None
        wanted = optimization_profile(self.shapes)
        names = {t.name for t in inputs}
        unknown = sorted(set(wanted) - names)
        missing = [n for n in dynamic if n not in wanted]
        if unknown or missing:
            raise BuildError(f"the shape distribution names {sorted(wanted)}; the model's dynamic "
                             f"inputs are {dynamic} (unknown: {unknown}, missing: {missing})")
        profile = builder.create_optimization_profile()
        for name, p in wanted.items():
            profile.set_shape(name, p.min, p.opt, p.max)
        return profile

    def production_load(self, route: Route, db: KnobDatabase) -> LoadConfig:
        opts = {"engine_host_code_allowed": "True"} if self.options.version_compatible else {}
        return LoadConfig(call="tensorrt.Runtime(logger).deserialize_cuda_engine(ENGINE bytes)",
                          options=opts, note="then engine.create_execution_context()",
                          snippet="import tensorrt as trt\n\nruntime = trt.Runtime("
                                  "trt.Logger(trt.Logger.WARNING))\n"
                                  + ("runtime.engine_host_code_allowed = True\n" if opts else "")
                                  + "engine = runtime.deserialize_cuda_engine(open(ENGINE, "
                                    "'rb').read())\ncontext = engine.create_execution_context()")

    def load(self, engine: Path, route: Route) -> Runner:
        """Deserialize a plan (build routes act at build time only; ``route`` is not used)."""
        trt = self._trt()
        cudart = _cudart()
        if self.options.runtime_platform != "same_as_build":
            raise EngineRuntimeError(f"the engine was built for runtime platform "
                                     f"{self.options.runtime_platform}; it cannot run here")
        try:
            data = Path(engine).read_bytes()
        except OSError as exc:
            raise EngineRuntimeError(f"cannot read engine {engine}: {exc.strerror or exc}") from exc
        errors: list[str] = self._logger.errors
        errors.clear()
        runtime = trt.Runtime(self._logger)
        if self.options.version_compatible:
            runtime.engine_host_code_allowed = True  # the embedded lean runtime is host code
        try:
            cuda_engine = runtime.deserialize_cuda_engine(data)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise EngineRuntimeError(f"TensorRT could not deserialize {engine}: {exc}") from exc
        if cuda_engine is None:
            try:
                built = f" (the plan was built by TensorRT {parse_plan_header(data).trt_version_text})"
            except PlanHeaderError as exc:
                built = f" ({exc})"
            raise EngineRuntimeError(f"TensorRT {trt.__version__} could not deserialize "
                                     f"{Path(engine).name}{built}{_last(errors)}")
        context = cuda_engine.create_execution_context()
        if context is None:
            raise EngineRuntimeError(f"TensorRT could not create an execution context for "
                                     f"{Path(engine).name}{_last(errors)}")
        return TensorRTRunner(trt, cudart, runtime, cuda_engine, context)


def _last(errors: Sequence[str]) -> str:
    return f": {errors[-1]}" if errors else ""
