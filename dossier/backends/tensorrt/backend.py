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
import os
import re
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from dossier.backends.interface import Backend, BuildInfo, SearchTraits
from dossier.backends.onnx_model import onnx_signature
from dossier.backends.runner import BuildError, EngineRuntimeError, Runner
from dossier.backends.signature import ModelSignature
from dossier.backends.tensorrt import runner as _runner
from dossier.backends.tensorrt.knobs import parse_knob_json
from dossier.backends.tensorrt.options import BuilderOptions, ShapePoint, optimization_profile
from dossier.backends.tensorrt.plan import PlanHeaderError, parse_plan_header
from dossier.errors import BackendUnavailableError, InputError, SelectionError
from dossier.knobs import KnobDatabase
from dossier.load_config import LoadConfig
from dossier.routes import Route

if TYPE_CHECKING:
    from dossier.fingerprint import Fingerprint
    from dossier.host.policy import Finding, Rule

MIN_VERSION = (11, 1)
"""First TensorRT release with build routes (``IBuilderConfig.build_route``)."""
BINDINGS_CHECKED = ("11.1.0.106", "11.4.0.106")
"""TensorRT Python bindings whose API listing every TensorRT name used here is checked against
(the oldest and the newest 11.x wheel with build routes on PyPI)."""
INTERNAL_OPTIONS_ENV = "TRT_INTERNAL_OPTIONS"
"""TensorRT's internal switches; its ``bypass_build_route_whitelist`` lets TensorRT accept knobs
that ``all_build_routes`` does not list. Recorded with every engine built."""


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



def _make_logger(trt: Any) -> Any:
    """A TensorRT logger that keeps the errors it sees (for messages: the Python API reports
    most failures as a None result or a discarded bool)."""

    class _Logger(trt.ILogger):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity in (trt.ILogger.Severity.ERROR, trt.ILogger.Severity.INTERNAL_ERROR):
                self.errors.append(str(msg))

    return _Logger()


# --------------------------------------------------------------------------------------------
# The backend


class TensorRTBackend(Backend):
    """Enterprise TensorRT >= 11.1: build routes from the global performance tuner."""

    name = "tensorrt"
    engine_suffix = ".plan"
    # tactic selection times kernels on the GPU: concurrent builds disturb it (build_cores 0)
    traits = SearchTraits(prestart_measuring=True, build_cores=0)
    runtime_modules = ("tensorrt",)
    requirement = ("pip install tensorrt cuda-python (enterprise TensorRT >= 11.1 on Linux with "
                   "an NVIDIA GPU; build routes are not in TensorRT-RTX nor on Windows)")
    native_errors = (RuntimeError, TypeError, ValueError)  # what pybind raises for TensorRT

    def __init__(self, options: BuilderOptions | None = None,
                 shapes: Sequence[ShapePoint | Any] | None = None) -> None:
        """``options`` apply to every build (default: trtexec's settings). ``shapes`` is the
        shape distribution the engine is tuned for; a model with dynamic inputs needs it."""
        self.options = options or BuilderOptions()
        self.shapes = list(shapes) if shapes else None
        self._logger: Any = None


    def configure(self, options: Mapping[str, Any], shapes: list[Any]) -> None:
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

    def knob_database_impl(self) -> KnobDatabase:
        """The knobs of ``IBuilderConfig.all_build_routes`` (read once per backend instance)."""
        trt = self._trt()
        builder = trt.Builder(self._logger)
        config = builder.create_builder_config()
        return parse_knob_json(config.all_build_routes)

    def signature_impl(self, model: Path) -> ModelSignature:
        return onnx_signature(model)

    def native_message(self, exc: Exception, doing: str) -> str:
        return f"TensorRT failed while {doing}: {exc}"

    def policy_rules(self) -> tuple[Rule, ...]:
        from dossier.backends.tensorrt.policy import RULES

        return tuple(RULES)

    def requirement_findings(self, host: Fingerprint) -> list[Finding]:
        from dossier.backends.tensorrt.policy import requirement_findings

        return requirement_findings(host)

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

    def build_impl(self, model: Path, route: Route, engine: Path) -> BuildInfo:
        trt = self._trt()
        errors: list[str] = self._logger.errors
        errors.clear()
        # pybind-raised TensorRT failures (native_errors) become a BuildError in build()
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

    def timing_defaults(self, route: Route, db: KnobDatabase) -> dict[str, object]:
        return dict(self.GPU_TIMING)

    def production_load(self, route: Route, db: KnobDatabase) -> LoadConfig:
        """``engine_host_code_allowed`` for a version-compatible engine (its embedded lean
        runtime is host code), and the runtime platform of a cross-built one (it loads only
        there): what :meth:`load_shipped` takes from a bundle's manifest."""
        vc, platform = self.options.version_compatible, self.options.runtime_platform
        opts = {"engine_host_code_allowed": "True"} if vc else {}
        note = "then engine.create_execution_context()"
        if platform != "same_as_build":
            opts["runtime_platform"] = platform
            note += f"; built for runtime platform {platform}: it loads only there"
        return LoadConfig(call="tensorrt.Runtime(logger).deserialize_cuda_engine(ENGINE bytes)",
                          options=opts, note=note,
                          snippet="import tensorrt as trt\n\nruntime = trt.Runtime("
                                  "trt.Logger(trt.Logger.WARNING))\n"
                                  + ("runtime.engine_host_code_allowed = True\n" if vc else "")
                                  + "engine = runtime.deserialize_cuda_engine(open(ENGINE, "
                                    "'rb').read())\ncontext = engine.create_execution_context()")

    def load_shipped(self, engine: Path, route: Route, load: LoadConfig | None,
                     facts: Mapping[str, str]) -> Runner:
        """Deserialize a shipped plan as its manifest entry records: host code allowed when
        the recorded load allows it or the engine was built version compatible, refused when
        it was built for another runtime platform; not from this instance's builder options.
        Without a recorded load (a bundle older than format 1.1): :meth:`load`, with the
        options the caller configured from the tuning header."""
        if load is None:
            return self.load(engine, route)
        host_code = (load.options.get("engine_host_code_allowed") == "True"
                     or facts.get("version_compatible") == "true")
        platform = (load.options.get("runtime_platform") or facts.get("runtime_platform")
                    or "same_as_build")
        return self._loaded(Path(engine), lambda e: self._deserialize(e, host_code, platform))

    def load_impl(self, engine: Path, route: Route) -> Runner:
        """Deserialize a plan (build routes act at build time only; ``route`` is not used)
        under this instance's builder options."""
        return self._deserialize(engine, self.options.version_compatible,
                                 self.options.runtime_platform)

    def _deserialize(self, engine: Path, host_code: bool, platform: str) -> Runner:
        """The plan ``engine`` deserialized (host code allowed when ``host_code``: a
        version-compatible plan's embedded lean runtime) and one execution context created;
        EngineRuntimeError for a plan built for another runtime ``platform``."""
        trt = self._trt()
        cudart = _runner.cudart()
        if platform != "same_as_build":
            raise EngineRuntimeError(f"the engine was built for runtime platform "
                                     f"{platform}; it cannot run here")
        try:
            data = Path(engine).read_bytes()
        except OSError as exc:
            raise EngineRuntimeError(f"cannot read engine {engine}: {exc.strerror or exc}") from exc
        errors: list[str] = self._logger.errors
        errors.clear()
        runtime = trt.Runtime(self._logger)
        if host_code:
            runtime.engine_host_code_allowed = True  # the embedded lean runtime is host code
        cuda_engine = runtime.deserialize_cuda_engine(data)  # raises: see native_errors
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
        return _runner.TensorRTRunner(trt, cudart, runtime, cuda_engine, context)


def _last(errors: Sequence[str]) -> str:
    return f": {errors[-1]}" if errors else ""
