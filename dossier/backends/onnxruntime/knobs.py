"""ONNX Runtime's knobs: session options, optimization levels and the graph optimizers this ORT
build registers (read from its verbose log), plus rewrite rules known to exist.

ORT silently ignores unknown optimizer names, unknown config keys and invalid values, so only
registered transformers are offered; :meth:`OnnxRuntimeBackend.check_route` refuses a disabled
optimizer that does not change the optimized graph of the model being tuned.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Iterator

from dossier.knobs import Knob, KnobDatabase, KnobPhase
from dossier.scenario import BATCH_KNOB, BATCH_VALUES, SESSIONS_KNOB, SESSIONS_VALUES

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
ON_OFF = ("on", "off")
STATIC: tuple[tuple[str, tuple[str, ...], str, KnobPhase, str, str, bool], ...] = (
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
    ("intra_op_allow_spinning", ON_OFF, "on", KnobPhase.LOAD, "session.intra_op.allow_spinning",
     "intra-op worker threads spin while waiting for work", False),
    ("inter_op_allow_spinning", ON_OFF, "on", KnobPhase.LOAD, "session.inter_op.allow_spinning",
     "inter-op worker threads spin while waiting for work", False),
    ("enable_mem_pattern", ON_OFF, "on", KnobPhase.LOAD, "enable_mem_pattern",
     "pre-plan activation memory from the first run's shapes", False),
    ("enable_mem_reuse", ON_OFF, "on", KnobPhase.LOAD, "enable_mem_reuse",
     "reuse activation buffers", False),
    ("enable_cpu_mem_arena", ON_OFF, "on", KnobPhase.LOAD, "enable_cpu_mem_arena",
     "allocate from a memory arena", False),
    ("prepacking", ON_OFF, "on", KnobPhase.LOAD, "session.disable_prepacking",
     "pre-pack constant weights for the GEMM kernels", True),
    ("denormal_as_zero", ("off", "on"), "off", KnobPhase.LOAD, "session.set_denormal_as_zero",
     "flush denormal floats to zero", True),
    ("deterministic_compute", ("off", "on"), "off", KnobPhase.LOAD, "use_deterministic_compute",
     "use deterministic kernels where ORT has them", False),
    (SESSIONS_KNOB, SESSIONS_VALUES, "1", KnobPhase.LOAD, SESSIONS_KNOB,
     "sessions serving queries in parallel, one per worker thread, each with "
     "intra_op_num_threads threads (server and offline scenarios; one session is timed "
     "otherwise)", False),
    (BATCH_KNOB, BATCH_VALUES, "1", KnobPhase.LOAD, BATCH_KNOB,
     "the most waiting queries one call answers, their inputs concatenated along the first axis "
     "(dynamic batching; server and offline scenarios; the model's first axis must be dynamic)",
     False),
)
SPEC = {s[0]: s for s in STATIC}
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


PROBE_MODEL = bytes.fromhex(
    "08083a3f0a0c0a0178120179220452656c75120570726f62655a130a0178120e0a0c080112080a0208010a"
    "02080462130a0179120e0a0c080112080a0208010a02080442040a001011")
"""The probe: the ONNX model y = Relu(x), x and y float [1, 4], opset 17, IR version 8, as
``onnx.helper`` serializes it (tests/jobs/test_worker_imports.py builds it that way and compares).
Kept as bytes so that reading the knob database, which every process that loads an engine
without the search's database does (``verify --recheck``), needs no ``onnx`` import: about
0.5 s, far longer than the probe session itself."""


@functools.lru_cache(maxsize=1)
def registered_transformers() -> tuple[str, ...]:
    """Graph transformer names this ORT build registers at ORT_ENABLE_ALL, from its verbose log."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 0
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    with _captured_stderr() as log:
        ort.InferenceSession(PROBE_MODEL, so, providers=["CPUExecutionProvider"])
    return tuple(sorted(set(re.findall(r"GraphTransformer (\w+) modified", log[0]))))


def knob_database_static(backend: str) -> KnobDatabase:
    """The knobs every ORT build has (:data:`STATIC`; imports nothing)."""
    return KnobDatabase(backend=backend, tuner_version="static", knobs=tuple(
        Knob(name=n, values=v, default=d, phase=p, help=h, changes_numerics=c)
        for n, v, d, p, _key, h, c in STATIC))


def knob_database(backend: str) -> KnobDatabase:
    """Every knob of this ORT build (imports onnxruntime)."""
    import onnxruntime as ort

    knobs = [Knob(name=n, values=v, default=d, phase=p, help=h, changes_numerics=c)
             for n, v, d, p, _key, h, c in STATIC]
    if not hasattr(ort.GraphOptimizationLevel, "ORT_ENABLE_LAYOUT"):
        knobs[0] = knobs[0].model_copy(update={"values": tuple(v for v in LEVELS if v != "layout")})
    for name in registered_transformers():
        knobs.append(Knob(name=OPTIMIZER_PREFIX + name, values=ON_OFF, default="on",
                          help=f"graph transformer {name} (off disables it)"))
    for name in REWRITE_RULES:
        knobs.append(Knob(name=OPTIMIZER_PREFIX + name, values=ON_OFF, default="on",
                          help=f"rewrite rule {name} (off disables it)"))
    return KnobDatabase(backend=backend, tuner_version=f"onnxruntime {ort.__version__}",
                        knobs=tuple(knobs))
