"""ONNX Runtime backend (CPU execution provider).

build = create a session with the route's build-time knobs and save the optimized model in ORT
format (the engine); load = a session over the saved engine with graph optimizations off and
the route's load-time knobs (threads, execution mode, memory options, spinning) applied, ORT's
defaults otherwise: the production load configuration (:meth:`production_load`) an engine is
timed in and a deployment should use.

ORT silently ignores unknown optimizer names, unknown config keys and invalid values. So this
backend offers only graph transformers that this ORT build reports as registered (read from its
verbose log), plus rewrite rules known to exist, and :meth:`check_route` refuses a disabled
optimizer that does not change the optimized graph of the model being tuned.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

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
from dossier.errors import SelectionError
from dossier.knobs import Knob, KnobDatabase, KnobPhase
from dossier.routes import Route

LEVELS = {"disable_all": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
          "extended": "ORT_ENABLE_EXTENDED", "layout": "ORT_ENABLE_LAYOUT", "all": "ORT_ENABLE_ALL"}
"""Optimization levels, low to high; ``layout`` exists from ORT 1.22 on."""

REWRITE_RULES = ("ConvBNFusion", "ConvAddFusion", "ConvMulFusion", "DivMulFusion", "FuseReluClip",
                 "GemmSumFusion", "GemmTransposeFusion", "NotWhereFusion", "MatmulBNFusion",
                 "PadFusion", "EliminateIdentity", "EliminateSlice", "EliminateDropout",
                 "UnsqueezeElimination", "ExpandElimination", "CastElimination",
                 "PreShapeNodeElimination", "NoopElimination")
"""Rewrite rules run inside Level1/Level2_RuleBasedTransformer; disabled by the same name list.
ORT does not log them by name, so they are offered from this list and checked per model."""

# (name, values, default, phase, config key or SessionOptions attribute, help, changes numerics)
_ON_OFF = ("on", "off")
_STATIC: tuple[tuple[str, tuple[str, ...], str, KnobPhase, str, str, bool], ...] = (
    ("graph_optimization_level", tuple(LEVELS), "all", KnobPhase.BUILD, "graph_optimization_level",
     "graph optimization level; layout and all produce CPU-specific (NCHWc) kernels", False),
    ("gelu_approximation", ("off", "on"), "off", KnobPhase.BUILD,
     "optimization.enable_gelu_approximation", "replace exact Gelu with the tanh approximation", True),
    ("intra_op_num_threads", ("0", "1", "2", "4", "8"), "0", KnobPhase.LOAD, "intra_op_num_threads",
     "threads inside one operator (0 = one per physical core)", False),
    ("inter_op_num_threads", ("0", "1", "2", "4"), "0", KnobPhase.LOAD, "inter_op_num_threads",
     "threads across operators (parallel execution mode only)", False),
    ("execution_mode", ("sequential", "parallel"), "sequential", KnobPhase.LOAD, "execution_mode",
     "run independent operators concurrently", False),
    ("intra_op_allow_spinning", _ON_OFF, "on", KnobPhase.LOAD, "session.intra_op.allow_spinning",
     "intra-op worker threads spin while waiting for work", False),
    ("inter_op_allow_spinning", _ON_OFF, "on", KnobPhase.LOAD, "session.inter_op.allow_spinning",
     "inter-op worker threads spin while waiting for work", False),
    ("enable_mem_pattern", _ON_OFF, "on", KnobPhase.LOAD, "enable_mem_pattern",
     "pre-plan activation memory from the first run's shapes", False),
    ("enable_mem_reuse", _ON_OFF, "on", KnobPhase.LOAD, "enable_mem_reuse",
     "reuse activation buffers", False),
    ("enable_cpu_mem_arena", _ON_OFF, "on", KnobPhase.LOAD, "enable_cpu_mem_arena",
     "allocate from a memory arena", False),
    ("prepacking", _ON_OFF, "on", KnobPhase.LOAD, "session.disable_prepacking",
     "pre-pack constant weights for the GEMM kernels", True),
    ("denormal_as_zero", ("off", "on"), "off", KnobPhase.LOAD, "session.set_denormal_as_zero",
     "flush denormal floats to zero", True),
    ("deterministic_compute", ("off", "on"), "off", KnobPhase.LOAD, "use_deterministic_compute",
     "use deterministic kernels where ORT has them", False),
)
_SPEC = {s[0]: s for s in _STATIC}
OPTIMIZER_PREFIX = "optimizer:"


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Capture what native code writes to file descriptor 2, through a pipe: a temporary file
    on a full disk (or under ``ulimit -f``) would cut the log short without a word, and the
    knob database read from it would silently lose knobs."""
    import threading

    out: list[str] = []
    chunks: list[bytes] = []
    read_end, write_end = os.pipe()

    def drain() -> None:
        while data := os.read(read_end, 1 << 16):
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    saved = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield out
    finally:
        os.dup2(saved, 2)  # the last writer of the pipe is gone: the reader sees its end
        os.close(saved)
        reader.join()
        os.close(read_end)
        out.append(b"".join(chunks).decode("utf-8", "replace"))


@functools.lru_cache(maxsize=1)
def registered_transformers() -> tuple[str, ...]:
    """Graph transformer names this ORT build registers at ORT_ENABLE_ALL, from its verbose log."""
    import onnx
    import onnx.helper as oh
    import onnxruntime as ort

    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])
    graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    so = ort.SessionOptions()
    so.log_severity_level = 0
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with _captured_stderr() as log:
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return tuple(sorted(set(re.findall(r"GraphTransformer (\w+) modified", log[0]))))


class OnnxRuntimeRunner(Runner):
    """An ORT session over a saved engine."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._outputs = [o.name for o in session.get_outputs()]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            values = self._session.run(self._outputs, dict(inputs))
        except Exception as exc:  # ORT raises its own Fail/InvalidArgument/RuntimeException types
            raise EngineRuntimeError(str(exc).strip().splitlines()[0]) from exc
        return dict(zip(self._outputs, values))


class OnnxRuntimeBackend(Backend):
    """ONNX Runtime, CPU execution provider."""

    name = "onnxruntime"
    engine_suffix = ".ort"
    requirement = "pip install onnxruntime"

    def available(self) -> bool:
        return importlib.util.find_spec("onnxruntime") is not None

    @functools.cache  # noqa: B019 - one database per backend instance and process
    def knob_database(self) -> KnobDatabase:
        self.require()
        import onnxruntime as ort

        knobs = [Knob(name=n, values=v, default=d, phase=p, help=h, changes_numerics=c)
                 for n, v, d, p, _key, h, c in _STATIC]
        if not hasattr(ort.GraphOptimizationLevel, "ORT_ENABLE_LAYOUT"):
            knobs[0] = knobs[0].model_copy(update={"values": tuple(v for v in LEVELS if v != "layout")})
        for name in registered_transformers():
            knobs.append(Knob(name=OPTIMIZER_PREFIX + name, values=_ON_OFF, default="on",
                              help=f"graph transformer {name} (off disables it)"))
        for name in REWRITE_RULES:
            knobs.append(Knob(name=OPTIMIZER_PREFIX + name, values=_ON_OFF, default="on",
                              help=f"rewrite rule {name} (off disables it)"))
        return KnobDatabase(backend=self.name, tuner_version=f"onnxruntime {ort.__version__}",
                            knobs=tuple(knobs))

    def stack(self) -> dict[str, str]:
        return {pkg: metadata.version(pkg) for pkg in ("onnxruntime", "onnx", "numpy")
                if importlib.util.find_spec(pkg) is not None}

    def signature(self, model: Path) -> ModelSignature:
        return onnx_signature(model)

    def _options(self, route: Route, phase: KnobPhase | None) -> tuple[Any, list[str]]:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        disabled: list[str] = []
        for name, value in route.effective(self.knob_database()).items():
            if name.startswith(OPTIMIZER_PREFIX):
                if value == "off" and phase is not KnobPhase.LOAD:
                    disabled.append(name[len(OPTIMIZER_PREFIX):])
                continue
            if name not in _SPEC:  # a knob a subclass adds and handles itself
                continue
            _, _, _, knob_phase, key, _, _ = _SPEC[name]
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

    def _session(self, model: Path | bytes, so: Any, disabled: list[str]) -> Any:
        import onnxruntime as ort

        source = model if isinstance(model, bytes) else str(model)
        return ort.InferenceSession(source, so, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=disabled or None)

    def build(self, model: Path, route: Route, engine: Path) -> BuildInfo:
        so, disabled = self._options(route, None)
        so.optimized_model_filepath = str(engine)
        so.add_session_config_entry("session.save_model_format", "ORT")
        try:
            self._session(model, so, disabled)
        except Exception as exc:  # any ORT failure while optimizing is a failed build
            raise BuildError(str(exc).strip().splitlines()[0]) from exc
        if not Path(engine).is_file():
            raise BuildError("ONNX Runtime did not write the optimized model")
        return BuildInfo({"format": "ort", "optimization_level":
                          route.effective(self.knob_database())["graph_optimization_level"]})

    def live(self, model: Path, route: Route) -> Runner:
        """A session over the original model with the whole route applied (no saved engine)."""
        so, disabled = self._options(route, None)
        return OnnxRuntimeRunner(self._session(model, so, disabled))

    def load(self, engine: Path, route: Route) -> Runner:
        so = self._load_options(route)
        try:
            return OnnxRuntimeRunner(self._session(engine, so, []))
        except Exception as exc:  # a corrupt engine or a kernel missing on this CPU
            raise EngineRuntimeError(str(exc).strip().splitlines()[0]) from exc

    def _load_options(self, route: Route) -> Any:
        """Production session options: ORT's defaults, graph optimizations off (the engine is
        optimized already) and the route's load-time knobs. Nothing timing-only (no
        force_spinning_stop): an engine is timed as production loads it."""
        import onnxruntime as ort

        so, _ = self._options(route, KnobPhase.LOAD)
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        return so

    reload_per_block = True

    def production_load(self, route: Route, db: KnobDatabase) -> LoadConfig:
        eff = route.effective(db)
        options = {"graph_optimization_level": "ORT_DISABLE_ALL"}
        lines = ["import onnxruntime as ort", "", "so = ort.SessionOptions()",
                 "so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL"]
        for name, value in eff.items():
            spec = _SPEC.get(name)
            if spec is None or spec[3] is not KnobPhase.LOAD or value == db.get(name).default:
                continue
            key = spec[4]
            if name == "execution_mode":
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
        lines.append('session = ort.InferenceSession(ENGINE, so, '
                     'providers=["CPUExecutionProvider"])')
        return LoadConfig(
            call='onnxruntime.InferenceSession(ENGINE, so, providers=["CPUExecutionProvider"])',
            options=options,
            note="ONNX Runtime's defaults apart from these options; one session per process, as "
                 "timed (session.force_spinning_stop is not set)",
            snippet="\n".join(lines))

    def _optimized_graph(self, model: Path, route: Route) -> bytes:
        with tempfile.TemporaryDirectory(prefix="dossier-probe-") as tmp:
            path = Path(tmp) / "probe.onnx"
            so, disabled = self._options(route, KnobPhase.BUILD)
            so.optimized_model_filepath = str(path)
            self._session(model, so, disabled)
            import onnx

            graph = onnx.load(str(path)).graph
            return b"".join(f"{n.domain}:{n.op_type}:{list(n.input)}".encode() for n in graph.node)

    def check_route(self, model: Path, route: Route, db: KnobDatabase) -> None:
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
        level = route.effective(db)["graph_optimization_level"]
        return {"layout_optimized": level in ("layout", "all")}
