"""ONNX Runtime backend (CPU execution provider).

build = create a session with the route's build-time knobs and save the optimized model in ORT
format (the engine); load = a session over the saved engine with graph optimizations off and
the route's load-time knobs (threads, execution mode, memory options, spinning) applied, ORT's
defaults otherwise: the production load configuration (:meth:`production_load`) an engine is
timed in and a deployment should use. The knobs are in :mod:`.knobs`, the loaded engine in
:mod:`.runner`, the verify rules in :mod:`.policy`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from dossier.backends.interface import Backend, BuildInfo, SearchTraits
from dossier.backends.onnx_model import onnx_signature
from dossier.backends.onnxruntime import knobs, precision, scratch
from dossier.backends.onnxruntime.knobs import LEVELS, OPTIMIZER_PREFIX, SPEC, STATIC
from dossier.backends.onnxruntime.runner import OnnxRuntimeRunner
from dossier.backends.runner import BuildError, EngineRuntimeError, Runner
from dossier.backends.signature import ModelSignature
from dossier.errors import SelectionError
from dossier.host.policy import Rule
from dossier.knobs import Knob, KnobDatabase, KnobPhase
from dossier.load_config import LoadConfig
from dossier.routes import Route
from dossier.scenario import BATCH_KNOB, SESSIONS_KNOB, sessions_lines

SERVING_KNOBS = frozenset({SESSIONS_KNOB, BATCH_KNOB})
"""Knobs of how sessions serve (:mod:`dossier.scenarios`), not session options."""


class OnnxRuntimeBackend(Backend):
    """ONNX Runtime, CPU execution provider."""

    name = "onnxruntime"
    engine_suffix = ".ort"
    runtime_modules = ("onnxruntime",)
    requirement = "pip install onnxruntime"

    def available(self) -> bool:
        return importlib.util.find_spec("onnxruntime") is not None

    def knob_database_impl(self) -> KnobDatabase:
        db = knobs.knob_database(self.name)
        extra = precision.knobs()
        if not precision.openvino()[1]:
            extra.append(Knob(name=precision.EP_KNOB, values=(precision.CPU, precision.OPENVINO),
                              default=precision.CPU, changes_numerics=True,
                              help="execution provider: ONNX Runtime's CPU provider, or "
                                   "OpenVINO's CPU device"))
            if not precision.bf16_units():
                extra.append(Knob(
                    name=precision.OV_PRECISION_KNOB, values=(precision.F32, precision.BF16),
                    default=precision.F32, phase=KnobPhase.LOAD, changes_numerics=True,
                    help="precision OpenVINO runs the floating-point operators in "
                         "(-execution_provider=openvino): f32, or bf16 on the CPU's bfloat16 "
                         "units (AMX, AVX-512 BF16)"))
        return db.model_copy(update={"knobs": (*db.knobs, *extra)})

    def check_recorded_route(self, text: str, cores: int | None = None) -> Route:
        """Checked against the knobs known without importing onnxruntime (a verify that loads
        nothing imports no runtime): the static ones, the quantization and execution-provider
        knobs, and graph optimizers by name (``optimizer:NAME``, on or off: build-time knobs,
        baked into the engine, never applied by a load)."""
        static = knobs.knob_database_static(self.name)
        named = {name for name, _ in Route.parse(text).values if name.startswith(
            OPTIMIZER_PREFIX) and name[len(OPTIMIZER_PREFIX):].isidentifier()}
        optimizers = [Knob(name=n, values=knobs.ON_OFF, default="on") for n in sorted(named)]
        extra = [Knob(name=precision.EP_KNOB, values=(precision.CPU, precision.OPENVINO),
                      default=precision.CPU),
                 Knob(name=precision.OV_PRECISION_KNOB, values=(precision.F32, precision.BF16),
                      default=precision.F32)]
        db = static.model_copy(update={"knobs": (*static.knobs, *precision.knobs(), *extra,
                                                 *optimizers)})
        return self._checked_route(text, db, cores)

    def knobs_not_offered(self) -> dict[str, str]:
        why = precision.openvino()[1]
        if why:
            return {precision.EP_KNOB: f"-{precision.EP_KNOB}=openvino: {why}",
                    precision.OV_PRECISION_KNOB: f"-{precision.OV_PRECISION_KNOB}: no OpenVINO "
                                                 "here"}
        why = precision.bf16_units()
        return {precision.OV_PRECISION_KNOB: f"-{precision.OV_PRECISION_KNOB}=bf16: {why}"} \
            if why else {}

    def engine_documents(self, engine: Path) -> dict[str, bytes]:
        import json

        import onnxruntime as ort

        try:
            so = ort.SessionOptions()
            so.log_severity_level = 3
            if engine.suffix != ".ort":
                so.add_session_config_entry("session.load_model_format", "ONNX")
            session = ort.InferenceSession(str(engine), so, providers=["CPUExecutionProvider"])
        except Exception:  # an engine only another provider loads: nothing to read here
            return {}
        record = precision.engine_record(session)
        if record is None:
            return {}
        return {"quantization.json": (json.dumps(record, indent=2, sort_keys=True) + "\n")
                .encode()}

    def inert_knobs(self, route: Route, db: KnobDatabase) -> frozenset[str]:
        return precision.inert(route.effective(db)) & set(db.names())

    def needs_calibration(self, route: Route, db: KnobDatabase) -> bool:
        return route.effective(db).get("quantization") == precision.STATIC

    def stack(self) -> dict[str, str]:
        """The runtime's version as its module says (the distribution may be onnxruntime,
        onnxruntime-gpu or onnxruntime-openvino: each installs the module ``onnxruntime``), the
        other distributions of it and the OpenVINO plug-in where installed, onnx and numpy."""
        import onnxruntime

        out = {"onnxruntime": onnxruntime.__version__}
        for dist in ("onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-ep-openvino"):
            with contextlib.suppress(metadata.PackageNotFoundError):
                out[dist] = metadata.version(dist)
        return {**out, **{pkg: metadata.version(pkg) for pkg in ("onnx", "numpy")
                          if importlib.util.find_spec(pkg) is not None}}

    def signature_impl(self, model: Path) -> ModelSignature:
        return onnx_signature(model)

    def policy_rules(self) -> tuple[Rule, ...]:
        from dossier.backends.onnxruntime.policy import RULES

        return tuple(RULES)

    def _options(self, route: Route, phase: KnobPhase | None) -> tuple[Any, list[str]]:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        disabled: list[str] = []
        if phase is KnobPhase.LOAD:
            # only the static load-time knobs act when loading: the same values as the whole
            # database gives them, without probing this build's optimizers (onnx, a session)
            named = route.as_dict()
            values = {s[0]: named.get(s[0], s[2]) for s in STATIC}
        else:
            values = route.effective(self.knob_database())
        for name, value in values.items():
            if name.startswith(OPTIMIZER_PREFIX):
                if value == "off" and phase is not KnobPhase.LOAD:
                    disabled.append(name[len(OPTIMIZER_PREFIX):])
                continue
            if name not in SPEC or name in SERVING_KNOBS:  # a subclass's own; serving knobs:
                continue  # how sessions serve (dossier.scenarios), not session options
            _, _, _, knob_phase, key, _, _ = SPEC[name]
            if phase is not None and knob_phase is not phase:
                continue
            if name == "graph_optimization_level":
                so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[value])
            elif name == "execution_mode":
                so.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if value == "parallel"
                                     else ort.ExecutionMode.ORT_SEQUENTIAL)
            elif name in ("intra_op_num_threads", "inter_op_num_threads"):
                setattr(so, key, int(value))
            elif key in ("enable_mem_pattern", "enable_mem_reuse", "enable_cpu_mem_arena"):
                setattr(so, key, value == "on")
            elif key == "use_deterministic_compute":
                so.use_deterministic_compute = value == "on"
            elif key == "session.disable_prepacking":
                so.add_session_config_entry(key, "1" if value == "off" else "0")
            else:
                so.add_session_config_entry(key, "1" if value == "on" else "0")
        return so, disabled

    def _session(self, model: Path | bytes, so: Any, disabled: list[str],
                 provider: str = precision.CPU, ov_precision: str = precision.F32) -> Any:
        import onnxruntime as ort

        source = model if isinstance(model, bytes) else str(model)
        if provider == precision.OPENVINO:
            ov, why = precision.openvino()
            if ov is None:
                raise EngineRuntimeError(f"-{precision.EP_KNOB}=openvino: {why}")
            options = precision.openvino_options(ov, ov_precision)
            if ov.devices:  # the plug-in's
                so.add_provider_for_devices(list(ov.devices), options)
                session = ort.InferenceSession(source, so, disabled_optimizers=disabled or None)
            else:  # built in
                session = ort.InferenceSession(
                    source, so, providers=[precision.OPENVINO_EP], provider_options=[options],
                    disabled_optimizers=disabled or None)
            problem = precision.provider_problem(session, precision.OPENVINO_EP)
            if problem:
                raise EngineRuntimeError(problem)
            return session
        return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=disabled or None)

    def build_impl(self, model: Path, route: Route, engine: Path) -> BuildInfo:
        values = route.effective(self.knob_database())
        facts = {"optimization_level": values["graph_optimization_level"]}
        # in the search's scratch folder when there is one: inside its run folder, removed with
        # the work folder even when a build is killed (a temporary folder in TMPDIR would stay),
        # and on the file system of the files the builds share, so those are linked, not copied
        with tempfile.TemporaryDirectory(prefix="dossier-build-",
                                         dir=scratch.folder(self.build_scratch)) as tmp:
            if precision.transforms(values):
                quantized = Path(tmp) / "quantized.onnx"
                facts.update(precision.quantize(model, values, self.calibration, quantized,
                                                shared=self.build_scratch))
                model = quantized
            if values.get(precision.EP_KNOB, precision.CPU) == precision.OPENVINO:
                # OpenVINO compiles the ONNX model when a session is made: the engine is the
                # (transformed) model itself, checked to load on the provider it names
                shutil.copyfile(model, engine)
                try:
                    nodes = self._openvino_nodes(engine.read_bytes(), route)
                except EngineRuntimeError as exc:  # no OpenVINO, or a session that fell back
                    raise BuildError(str(exc)) from exc
                ov = precision.openvino()[0]
                return BuildInfo({**facts, "format": "onnx",
                                  "execution_provider": precision.OPENVINO_EP,
                                  "openvino": ov.source if ov else "unknown",
                                  "openvino_nodes": nodes})
            so, disabled = self._options(route, None)
            so.optimized_model_filepath = str(engine)
            so.add_session_config_entry("session.save_model_format", "ORT")
            self._session(model, so, disabled)  # any ORT failure while optimizing: failed build
        if not engine.is_file():
            raise BuildError("ONNX Runtime did not write the optimized model")
        return BuildInfo({**facts, "format": "ort"})

    def _openvino_nodes(self, model: bytes, route: Route) -> str:
        """Check that ``model`` loads on OpenVINO under ``route``, and say where its nodes run:
        ``all`` on OpenVINO (a session with ONNX Runtime's CPU fallback turned off loads), else
        ``some on the CPU provider`` (operators OpenVINO does not run stay on ONNX Runtime's
        CPU provider, as they will when the engine is served: the route is measured so)."""
        so, disabled = self._options(route, None)
        so.add_session_config_entry(precision.NO_CPU_FALLBACK, "1")
        try:
            self._session(model, so, disabled, precision.OPENVINO, _ov_precision(route))
            return "all"
        except EngineRuntimeError:
            raise
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime's own error type
            if "fallback to CPU EP has been explicitly disabled" not in str(exc):
                raise
        so, disabled = self._options(route, None)
        self._session(model, so, disabled, precision.OPENVINO, _ov_precision(route))
        return "some on the CPU provider"

    def live(self, model: Path, route: Route) -> Runner:
        """A session over the original model with the whole route applied (no saved engine)."""
        so, disabled = self._options(route, None)
        return OnnxRuntimeRunner(self._session(model, so, disabled))

    def load_impl(self, engine: Path, route: Route) -> Runner:
        # any ORT failure (a corrupt engine, a kernel missing on this CPU): EngineRuntimeError
        provider = route.as_dict().get(precision.EP_KNOB, precision.CPU)
        so = self._load_options(route)
        if provider == precision.OPENVINO:
            so.add_session_config_entry("session.load_model_format", "ONNX")
        return OnnxRuntimeRunner(self._session(engine, so, [], provider, _ov_precision(route)))

    def _load_options(self, route: Route) -> Any:
        """Production session options: ORT's defaults, graph optimizations off (the engine is
        optimized already) and the route's load-time knobs. Nothing timing-only (no
        force_spinning_stop): an engine is timed as production loads it."""
        import onnxruntime as ort

        so, _ = self._options(route, KnobPhase.LOAD)
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        return so

    traits = SearchTraits(reload_per_block=True, switch_pause_s=0.05, fork_workers=True,
                          build_cores=1)
    """The switch pause: ONNX Runtime's intra-op threads spin for a while after a call (2^20
    pause instructions); a block that started within 30 ms of another session's last call ran
    up to 1.4x slower on this 2-core host, one after a 50 ms pause did not
    (``bench/results/ort-spin.json``). A BERT-base float32 session takes 0.6 s to load, the
    tblock sample's 1 ms. One build job per core by default: a quantizing build
    (quant_pre_process, the quantizer, a calibration session) keeps about one core busy for
    seconds (BERT-base: 8-19 s), so on two cores two quantizations run at once while nothing
    is timed (a BERT release: 191 s with one build at a time, 168 s with two)."""
    thread_knobs = frozenset({"intra_op_num_threads", "inter_op_num_threads"})
    route_check_imports = False
    contention_knobs = frozenset({"intra_op_num_threads", "inter_op_num_threads",
                                  "execution_mode", "intra_op_allow_spinning",
                                  "inter_op_allow_spinning"})

    def production_load(self, route: Route, db: KnobDatabase) -> LoadConfig:
        eff = route.effective(db)
        options = {"graph_optimization_level": "ORT_DISABLE_ALL"}
        lines = ["import onnxruntime as ort", "", "so = ort.SessionOptions()",
                 "so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL"]
        for name, value in eff.items():
            spec = SPEC.get(name)
            if spec is None or spec[3] is not KnobPhase.LOAD or value == db.get(name).default:
                continue
            key = spec[4]
            if name == SESSIONS_KNOB:  # not a session option: how many sessions serve
                options[key] = value
                lines += sessions_lines(int(value), "sessions")
            elif name == BATCH_KNOB:  # not a session option: how many queries a call answers
                options[key] = value
                lines.append(f"# answer up to {int(value)} waiting queries with one call, their "
                             "inputs concatenated along the first axis")
            elif name == "execution_mode":
                mode = "ORT_PARALLEL" if value == "parallel" else "ORT_SEQUENTIAL"
                options[key] = mode
                lines.append(f"so.execution_mode = ort.ExecutionMode.{mode}")
            elif name in ("intra_op_num_threads", "inter_op_num_threads"):
                options[key] = value
                lines.append(f"so.{key} = {int(value)}")
            elif key in ("enable_mem_pattern", "enable_mem_reuse", "enable_cpu_mem_arena",
                         "use_deterministic_compute"):
                options[key] = str(value == "on")
                lines.append(f"so.{key} = {value == 'on'}")
            else:
                entry = ("1" if value == "off" else "0") if key == "session.disable_prepacking" \
                    else ("1" if value == "on" else "0")
                options[key] = entry
                lines.append(f"so.add_session_config_entry({key!r}, {entry!r})")
        if eff.get(precision.EP_KNOB) == precision.OPENVINO:
            call = self._openvino_load(eff, options, lines)
        else:
            call = 'onnxruntime.InferenceSession(ENGINE, so, providers=["CPUExecutionProvider"])'
            lines.append('session = ort.InferenceSession(ENGINE, so, '
                         'providers=["CPUExecutionProvider"])')
        return LoadConfig(
            call=call,
            options=options,
            note="ONNX Runtime's defaults apart from these options; one session per process, as "
                 "timed (session.force_spinning_stop is not set)" if SESSIONS_KNOB not in options
            else f"ONNX Runtime's defaults apart from these options; {options[SESSIONS_KNOB]} "
                 "sessions in parallel, as the scenario measured them "
                 "(session.force_spinning_stop is not set)",
            snippet="\n".join(lines))

    @staticmethod
    def _openvino_load(values: dict[str, str], options: dict[str, str], lines: list[str]) -> str:
        """How production makes an OpenVINO route's session, as this host reaches OpenVINO
        (the plug-in or the provider built in): added to ``options`` and ``lines``; the call."""
        ov = precision.openvino()[0]
        provider = precision.openvino_options(ov or precision.OpenVino("unknown"),
                                              _ov_precision(Route.of(values)))
        options.update({"session.load_model_format": "ONNX", **provider})
        lines.append('so.add_session_config_entry("session.load_model_format", "ONNX")')
        if ov is not None and ov.devices:
            lines.insert(1, "import onnxruntime_ep_openvino as ov_ep")
            lines += ["def openvino_cpu():",
                      f"    return [d for d in ort.get_ep_devices() if d.ep_name == "
                      f"{precision.OPENVINO_EP!r} and d.ep_metadata.get('ov_device') == 'CPU']",
                      "if not openvino_cpu():  # once per process",
                      f"    ort.register_execution_provider_library({precision.OPENVINO_EP!r}, "
                      "ov_ep.get_library_path())",
                      "cpu = openvino_cpu()",
                      f"so.add_provider_for_devices(cpu, {provider!r})",
                      "session = ort.InferenceSession(ENGINE, so)"]
            return ("onnxruntime.InferenceSession(ENGINE, so), so.add_provider_for_devices(the "
                    f"CPU device of the OpenVINO plug-in's {precision.OPENVINO_EP}, ...)")
        lines.append(f"session = ort.InferenceSession(ENGINE, so, providers="
                     f"[{precision.OPENVINO_EP!r}], provider_options=[{provider!r}])")
        return (f"onnxruntime.InferenceSession(ENGINE, so, providers=[{precision.OPENVINO_EP!r}],"
                " provider_options=[...])")

    def _optimized_graph(self, model: Path, route: Route) -> bytes:
        with tempfile.TemporaryDirectory(prefix="dossier-probe-") as tmp:
            path = Path(tmp) / "probe.onnx"
            so, disabled = self._options(route, KnobPhase.BUILD)
            so.optimized_model_filepath = str(path)
            self._session(model, so, disabled)
            import onnx

            graph = onnx.load(str(path), load_external_data=False).graph
            return b"".join(f"{n.domain}:{n.op_type}:{list(n.input)}".encode() for n in graph.node)

    def check_route_impl(self, model: Path, route: Route, db: KnobDatabase) -> None:
        off = [k for k, v in route.as_dict().items() if k.startswith(OPTIMIZER_PREFIX) and v == "off"]
        if not off:
            return
        on = Route.of({**route.as_dict(), **dict.fromkeys(off, "on")})
        reference = self._optimized_graph(model, on)
        for knob in off:
            probe = Route.of({**on.as_dict(), knob: "off"})
            if self._optimized_graph(model, probe) == reference:
                raise SelectionError(
                    f"-{knob}=off does not change the optimized graph of {Path(model).name}",
                    hint="ONNX Runtime ignores optimizers that do not apply; drop this knob")

    def engine_facts(self, route: Route, db: KnobDatabase) -> dict[str, bool]:
        values = route.effective(db)
        openvino = values.get(precision.EP_KNOB) == precision.OPENVINO
        # an OpenVINO route's engine is the ONNX model itself, compiled where it is loaded: no
        # ONNX Runtime layout baked in, whatever the optimization level says
        return {"layout_optimized": not openvino
                and values["graph_optimization_level"] in ("layout", "all"),
                "openvino": openvino}


def _ov_precision(route: Route) -> str:
    """The precision an OpenVINO route's session runs its floating-point operators in (a route
    read back from a bundle is not checked against a knob database: its value is, here)."""
    value = route.as_dict().get(precision.OV_PRECISION_KNOB, precision.F32)
    if value not in (precision.F32, precision.BF16):
        raise EngineRuntimeError(f"-{precision.OV_PRECISION_KNOB}={value}: not "
                                 f"{precision.F32} or {precision.BF16}")
    return value
