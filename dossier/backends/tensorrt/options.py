"""TensorRT builder options (fixed for a whole search, recorded with every engine) and the
optimization profile a shape distribution asks for. Pure: no TensorRT needed."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from dossier.errors import InputError

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

    model_config = ConfigDict(frozen=True, extra="forbid")

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
    for i, entry in enumerate(shapes, start=1):  # numbered from 1, as the tuner's messages
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
    for i, (dims, _) in enumerate(points[1:], start=2):
        if set(dims) != set(first):
            raise InputError(f"shape entry {i} names inputs {sorted(dims)}, entry 1 names "
                             f"{sorted(first)}; every entry gives every input")
        for name, shape in dims.items():
            if len(shape) != len(first[name]):
                raise InputError(f"input {name!r} has rank {len(shape)} in shape entry {i} and "
                                 f"rank {len(first[name])} in entry 1")
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


