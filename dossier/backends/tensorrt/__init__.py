"""The TensorRT backend (enterprise TensorRT >= 11.1): :mod:`.backend` (build, load, the build
route), :mod:`.knobs` (the ``all_build_routes`` JSON), :mod:`.options` (builder options,
optimization profiles), :mod:`.plan` (plan headers), :mod:`.runner` (the engine on the GPU),
:mod:`.policy` (verify rules, host requirements), :mod:`.trtexec` (trtexec tuning caches),
:mod:`.importer` (a trtexec search as a bundle, a search as a trtexec cache: it builds on
:mod:`dossier.bundle`, so nothing here imports it). Importing it imports neither tensorrt nor
cuda-python."""

from dossier.backends.tensorrt.backend import (
    BINDINGS_CHECKED,
    INTERNAL_OPTIONS_ENV,
    MIN_VERSION,
    TensorRTBackend,
    check_route,
    internal_options,
    set_build_route,
)
from dossier.backends.tensorrt.knobs import KnobJsonError, parse_knob_json
from dossier.backends.tensorrt.options import (
    BuilderOptions,
    InputProfile,
    ShapePoint,
    optimization_profile,
)
from dossier.backends.tensorrt.plan import (
    KNOWN_SERIALIZATION_VERSIONS,
    PLAN_TAG,
    PlanHeader,
    PlanHeaderError,
    parse_plan_header,
    read_plan_header,
)
from dossier.backends.tensorrt.runner import TensorRTRunner

__all__ = ["BINDINGS_CHECKED", "INTERNAL_OPTIONS_ENV", "KNOWN_SERIALIZATION_VERSIONS",
           "MIN_VERSION", "PLAN_TAG", "BuilderOptions", "InputProfile", "KnobJsonError",
           "PlanHeader", "PlanHeaderError", "ShapePoint", "TensorRTBackend", "TensorRTRunner",
           "check_route", "internal_options", "optimization_profile", "parse_knob_json",
           "parse_plan_header", "read_plan_header", "set_build_route"]
