"""Build the sample models, their validation sets and their release specs.

Run as ``python samples/build.py [--out DIR]`` (default: the folder holding this script), or
import :func:`build_all`. Nothing is downloaded; everything is derived from fixed seeds, so two
builds write byte-identical models and tensors.

Two samples, each written under ``<out>/<name>/``:

``convnet``
    x[N,3,32,32] -> 3 x (Conv3x3 pad 1 + BatchNormalization + Relu), MaxPool 2x2 after the
    first two blocks, channels 3->16->32->32 -> GlobalAveragePool -> Flatten -> Gemm -> logits[N,10].
``tblock``
    x[N,32,128] -> decomposed LayerNorm -> 4-head self-attention -> residual -> decomposed
    LayerNorm -> MatMul+Add (512) -> exact erf GELU (Div/Erf/Add/Mul/Mul) -> MatMul+Add ->
    residual -> y[N,32,128].

The reference outputs of each validation pair come from a float64 numpy reimplementation of the
same math on the same (float32) weights, cast to float32 at the end. ONNX Runtime is not used to
make them, so a check of the model against them is an independent one.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from numpy.lib.stride_tricks import sliding_window_view
from onnx import TensorProto, helper, numpy_helper
from scipy.special import erf

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from dossier.tensors import write_tensors  # noqa: E402

OPSET = 17
IR_VERSION = 8  # opset 17 belongs to IR version 8; loadable by onnxruntime >= 1.12
PAIR_BATCHES = (1, 4, 8)
PROVENANCE_METHOD = "float64 numpy reimplementation of the model (samples/build.py)"

CONVNET_SEED = 1701
TBLOCK_SEED = 1702

# ---------------------------------------------------------------------------------------------
# Release specs: literal text, resolved against the folder of the toml.
# ---------------------------------------------------------------------------------------------

CONVNET_TOML = """\
[release]
name = "convnet"
version = 1
description = "Small conv net (Conv+BN+Relu x3, pooling, Gemm), dynamic batch"

[model]
path = "model.onnx"

[validation]
path = "validation"

[tune]
backend = "onnxruntime"
strategy = "full"
selection = "-graph_optimization_level=[all|basic|disable_all] -optimizer:NchwcTransformer=[on|off] -optimizer:ConvBNFusion=[on|off]"
metric = "linf"
threshold = 1e-4

[[shapes]]
weight = 0.2
inputs = { x = [1, 3, 32, 32] }

[[shapes]]
weight = 0.5
inputs = { x = [4, 3, 32, 32] }

[[shapes]]
weight = 0.3
inputs = { x = [8, 3, 32, 32] }
"""

TBLOCK_TOML = """\
[release]
name = "tblock"
version = 1
description = "Transformer block (decomposed LayerNorm, 4-head self-attention, erf GELU MLP), dynamic batch"

[model]
path = "model.onnx"

[validation]
path = "validation"

[tune]
backend = "onnxruntime"
strategy = "fast"
selection = "-graph_optimization_level=[all|extended|basic] -gelu_approximation=[off|on] -optimizer:MatMulScaleFusion=[on|off] -optimizer:LayerNormFusionL1=[on|off] -optimizer:GeluFusionL2=[on|off] -intra_op_allow_spinning=[on|off]"
metric = "linf"
threshold = 1e-4

[[shapes]]
weight = 0.2
inputs = { x = [1, 32, 128] }

[[shapes]]
weight = 0.5
inputs = { x = [4, 32, 128] }

[[shapes]]
weight = 0.3
inputs = { x = [8, 32, 128] }
"""

TBLOCK_INT8_TOML = """\
[release]
name = "tblock-int8"
version = 1
description = "Transformer block with int8 routes: calibration, validation and hold-out sets kept apart"

[model]
path = "model.onnx"

[validation]
path = "validation"

[calibration]
path = "calibration"

[holdout]
path = "holdout"

[tune]
backend = "onnxruntime"
strategy = "full"
selection = "-quantization=[none|dynamic|static] -quant_per_channel=[off|on]"
metric = "cos"
threshold = 1e-3

[[shapes]]
weight = 0.2
inputs = { x = [1, 32, 128] }

[[shapes]]
weight = 0.5
inputs = { x = [4, 32, 128] }

[[shapes]]
weight = 0.3
inputs = { x = [8, 32, 128] }
"""
"""The tblock sample's precision release: int8 routes (dynamic, static QDQ) beside float32,
judged by cosine loss; its calibration and hold-out sets are drawn from a seed of their own, so
the validation set stays byte for byte what the float32 spec uses."""
HOLDOUT_BATCHES = (1, 4, 8)
CALIBRATION_BATCHES = (1, 2, 4, 1, 2, 4, 1, 2, 4, 1, 2, 4, 1, 2, 4, 8)
PRECISION_SEED_OFFSET = 1000


# ---------------------------------------------------------------------------------------------
# Small graph-building helper
# ---------------------------------------------------------------------------------------------


class _Graph:
    """Collects nodes and float32 initializers with unique, readable names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._count = 0

    def init(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def const(self, name: str, value: float) -> str:
        return self.init(name, np.array(value, dtype=np.float32))

    def op(self, op_type: str, inputs: list[str], name: str | None = None, **attrs) -> str:
        self._count += 1
        out = name or f"{op_type.lower()}_{self._count}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"n{self._count}_{op_type}",
                                           **attrs))
        return out

    def model(self, graph_name: str, inp: onnx.ValueInfoProto,
              out: onnx.ValueInfoProto) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, graph_name, [inp], [out], initializer=self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="dossier-samples", producer_version="1")
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model, full_check=True)
        return model


# ---------------------------------------------------------------------------------------------
# convnet
# ---------------------------------------------------------------------------------------------

CONV_CHANNELS = (3, 16, 32, 32)
CONV_POOL_AFTER = (True, True, False)
CONV_CLASSES = 10
CONV_HW = 32
BN_EPS = 1e-5


def convnet_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    w: dict[str, np.ndarray] = {}
    for i, (cin, cout) in enumerate(zip(CONV_CHANNELS[:-1], CONV_CHANNELS[1:], strict=True)):
        fan_in = cin * 9
        w[f"conv{i}.w"] = rng.normal(0.0, math.sqrt(2.0 / fan_in), (cout, cin, 3, 3))
        w[f"conv{i}.b"] = rng.normal(0.0, 0.1, cout)
        w[f"bn{i}.scale"] = rng.uniform(0.5, 1.5, cout)
        w[f"bn{i}.bias"] = rng.normal(0.0, 0.2, cout)
        w[f"bn{i}.mean"] = rng.normal(0.0, 0.3, cout)
        w[f"bn{i}.var"] = rng.uniform(0.5, 2.0, cout)
    w["fc.w"] = rng.normal(0.0, math.sqrt(1.0 / CONV_CHANNELS[-1]), (CONV_CLASSES, CONV_CHANNELS[-1]))
    w["fc.b"] = rng.normal(0.0, 0.1, CONV_CLASSES)
    return {k: v.astype(np.float32) for k, v in w.items()}


def convnet_model(w: dict[str, np.ndarray]) -> onnx.ModelProto:
    g = _Graph()
    for k, v in w.items():
        g.init(k, v)
    h = "x"
    for i, pool in enumerate(CONV_POOL_AFTER):
        h = g.op("Conv", [h, f"conv{i}.w", f"conv{i}.b"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                 strides=[1, 1])
        h = g.op("BatchNormalization",
                 [h, f"bn{i}.scale", f"bn{i}.bias", f"bn{i}.mean", f"bn{i}.var"], epsilon=BN_EPS)
        h = g.op("Relu", [h])
        if pool:
            h = g.op("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    h = g.op("GlobalAveragePool", [h])
    h = g.op("Flatten", [h], axis=1)
    g.op("Gemm", [h, "fc.w", "fc.b"], name="logits", transB=1)
    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", CONV_CHANNELS[0], CONV_HW, CONV_HW])
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CONV_CLASSES])
    return g.model("convnet", inp, out)


def _conv3x3(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = sliding_window_view(xp, (3, 3), axis=(2, 3))  # [N, C, H, W, 3, 3]
    return np.einsum("nchwij,ocij->nohw", win, w, optimize=True) + b[None, :, None, None]


def convnet_reference(w: dict[str, np.ndarray], x: np.ndarray) -> dict[str, np.ndarray]:
    p = {k: v.astype(np.float64) for k, v in w.items()}
    h = x.astype(np.float64)
    for i, pool in enumerate(CONV_POOL_AFTER):
        h = _conv3x3(h, p[f"conv{i}.w"], p[f"conv{i}.b"])
        c = (slice(None), None, None)
        h = (h - p[f"bn{i}.mean"][c]) / np.sqrt(p[f"bn{i}.var"][c] + BN_EPS)
        h = h * p[f"bn{i}.scale"][c] + p[f"bn{i}.bias"][c]
        h = np.maximum(h, 0.0)
        if pool:
            n, ch, hh, ww = h.shape
            h = h.reshape(n, ch, hh // 2, 2, ww // 2, 2).max(axis=(3, 5))
    h = h.mean(axis=(2, 3))
    logits = h @ p["fc.w"].T + p["fc.b"]
    return {"logits": logits.astype(np.float32)}


# ---------------------------------------------------------------------------------------------
# tblock
# ---------------------------------------------------------------------------------------------

TB_SEQ = 32
TB_DMODEL = 128
TB_HEADS = 4
TB_DHEAD = TB_DMODEL // TB_HEADS
TB_HIDDEN = 512
LN_EPS = 1e-5
TB_WEIGHT_STD = 0.05
# The first MLP matrix is drawn wider than the others, so the GELU sees inputs of order 1-3:
# there the tanh approximation differs from the exact erf GELU by ~1e-4..1e-3, which the
# sample's threshold (1e-4) must catch.
TB_MLP_IN_STD = 0.15


def tblock_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    d, hdn = TB_DMODEL, TB_HIDDEN
    s = TB_WEIGHT_STD
    w = {
        "ln1.gamma": 1.0 + rng.normal(0.0, 0.1, d),
        "ln1.beta": rng.normal(0.0, 0.05, d),
        "attn.wq": rng.normal(0.0, s, (d, d)),
        "attn.bq": rng.normal(0.0, s, d),
        "attn.wk": rng.normal(0.0, s, (d, d)),
        "attn.bk": rng.normal(0.0, s, d),
        "attn.wv": rng.normal(0.0, s, (d, d)),
        "attn.bv": rng.normal(0.0, s, d),
        "attn.wo": rng.normal(0.0, s, (d, d)),
        "attn.bo": rng.normal(0.0, s, d),
        "ln2.gamma": 1.0 + rng.normal(0.0, 0.1, d),
        "ln2.beta": rng.normal(0.0, 0.05, d),
        "mlp.w1": rng.normal(0.0, TB_MLP_IN_STD, (d, hdn)),
        "mlp.b1": rng.normal(0.0, s, hdn),
        "mlp.w2": rng.normal(0.0, s, (hdn, d)),
        "mlp.b2": rng.normal(0.0, s, d),
    }
    return {k: v.astype(np.float32) for k, v in w.items()}


def _layernorm_nodes(g: _Graph, x: str, prefix: str) -> str:
    mean = g.op("ReduceMean", [x], axes=[-1], keepdims=1)
    diff = g.op("Sub", [x, mean])
    sq = g.op("Pow", [diff, "c.two"])
    var = g.op("ReduceMean", [sq], axes=[-1], keepdims=1)
    var_eps = g.op("Add", [var, "c.ln_eps"])
    std = g.op("Sqrt", [var_eps])
    norm = g.op("Div", [diff, std])
    scaled = g.op("Mul", [norm, f"{prefix}.gamma"])
    return g.op("Add", [scaled, f"{prefix}.beta"])


def tblock_model(w: dict[str, np.ndarray]) -> onnx.ModelProto:
    g = _Graph()
    for k, v in w.items():
        g.init(k, v)
    g.const("c.two", 2.0)
    g.const("c.ln_eps", LN_EPS)
    g.const("c.attn_scale", math.sqrt(TB_DHEAD))
    g.const("c.sqrt2", math.sqrt(2.0))
    g.const("c.one", 1.0)
    g.const("c.half", 0.5)
    g.init("c.heads_shape", np.array([0, 0, TB_HEADS, TB_DHEAD], dtype=np.int64))
    g.init("c.model_shape", np.array([0, 0, TB_DMODEL], dtype=np.int64))

    x = "x"
    ln1 = _layernorm_nodes(g, x, "ln1")

    def heads(name: str, perm: list[int]) -> str:
        proj = g.op("MatMul", [ln1, f"attn.w{name}"])
        proj = g.op("Add", [proj, f"attn.b{name}"])
        split = g.op("Reshape", [proj, "c.heads_shape"])
        return g.op("Transpose", [split], perm=perm)

    q = heads("q", [0, 2, 1, 3])  # [N, H, S, Dh]
    k = heads("k", [0, 2, 3, 1])  # [N, H, Dh, S]
    v = heads("v", [0, 2, 1, 3])  # [N, H, S, Dh]
    scores = g.op("MatMul", [q, k])
    scores = g.op("Div", [scores, "c.attn_scale"])
    probs = g.op("Softmax", [scores], axis=-1)
    ctx = g.op("MatMul", [probs, v])
    ctx = g.op("Transpose", [ctx], perm=[0, 2, 1, 3])
    ctx = g.op("Reshape", [ctx, "c.model_shape"])
    attn = g.op("MatMul", [ctx, "attn.wo"])
    attn = g.op("Add", [attn, "attn.bo"])
    h1 = g.op("Add", [x, attn])

    ln2 = _layernorm_nodes(g, h1, "ln2")
    m = g.op("MatMul", [ln2, "mlp.w1"])
    m = g.op("Add", [m, "mlp.b1"])
    e = g.op("Div", [m, "c.sqrt2"])
    e = g.op("Erf", [e])
    e = g.op("Add", [e, "c.one"])
    gelu = g.op("Mul", [m, e])
    gelu = g.op("Mul", [gelu, "c.half"])
    m2 = g.op("MatMul", [gelu, "mlp.w2"])
    m2 = g.op("Add", [m2, "mlp.b2"])
    g.op("Add", [h1, m2], name="y")

    inp = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", TB_SEQ, TB_DMODEL])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", TB_SEQ, TB_DMODEL])
    return g.model("tblock", inp, out)


def _layernorm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + LN_EPS) * gamma + beta


def tblock_reference(w: dict[str, np.ndarray], x: np.ndarray) -> dict[str, np.ndarray]:
    p = {k: v.astype(np.float64) for k, v in w.items()}
    x = x.astype(np.float64)
    n = x.shape[0]
    ln1 = _layernorm(x, p["ln1.gamma"], p["ln1.beta"])

    def heads(name: str) -> np.ndarray:
        proj = ln1 @ p[f"attn.w{name}"] + p[f"attn.b{name}"]
        return proj.reshape(n, TB_SEQ, TB_HEADS, TB_DHEAD).transpose(0, 2, 1, 3)

    q, k, v = heads("q"), heads("k"), heads("v")
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(TB_DHEAD)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(n, TB_SEQ, TB_DMODEL)
    h1 = x + ctx @ p["attn.wo"] + p["attn.bo"]

    ln2 = _layernorm(h1, p["ln2.gamma"], p["ln2.beta"])
    m = ln2 @ p["mlp.w1"] + p["mlp.b1"]
    gelu = m * 0.5 * (1.0 + erf(m / math.sqrt(2.0)))
    y = h1 + gelu @ p["mlp.w2"] + p["mlp.b2"]
    return {"y": y.astype(np.float32)}


# ---------------------------------------------------------------------------------------------
# Writing a sample
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    name: str
    seed: int
    input_name: str
    input_shape: tuple[int, ...]  # without the batch dim
    weights: Callable[[np.random.Generator], dict[str, np.ndarray]]
    model: Callable[[dict[str, np.ndarray]], onnx.ModelProto]
    reference: Callable[[dict[str, np.ndarray], np.ndarray], dict[str, np.ndarray]]
    toml: str
    int8_toml: str = ""
    """A second spec with int8 routes (and the calibration and hold-out sets it names)."""


SAMPLES: tuple[Sample, ...] = (
    Sample("convnet", CONVNET_SEED, "x", (CONV_CHANNELS[0], CONV_HW, CONV_HW),
           convnet_weights, convnet_model, convnet_reference, CONVNET_TOML),
    Sample("tblock", TBLOCK_SEED, "x", (TB_SEQ, TB_DMODEL),
           tblock_weights, tblock_model, tblock_reference, TBLOCK_TOML, TBLOCK_INT8_TOML),
)


def build_sample(sample: Sample, out_dir: Path) -> Path:
    """Write ``model.onnx``, ``validation/`` and ``release.toml`` under ``out_dir/<name>/``;
    return the path of the ``release.toml``."""
    folder = out_dir / sample.name
    folder.mkdir(parents=True, exist_ok=True)
    # One generator per sample: weights first, then the pair inputs in order.
    rng = np.random.default_rng(sample.seed)
    weights = sample.weights(rng)
    model = sample.model(weights)
    model_path = folder / "model.onnx"
    model_path.write_bytes(model.SerializeToString(deterministic=True))
    onnx.checker.check_model(str(model_path), full_check=True)

    validation = folder / "validation"
    validation.mkdir(exist_ok=True)
    pairs = []
    for i, batch in enumerate(PAIR_BATCHES):
        pair_name = f"pair-{i:03d}"
        pair = validation / pair_name
        pair.mkdir(exist_ok=True)
        x = rng.standard_normal((batch, *sample.input_shape)).astype(np.float32)
        refs = sample.reference(weights, x)
        for name, ref in refs.items():
            if not np.all(np.isfinite(ref)):
                raise RuntimeError(f"{sample.name}/{pair_name}: reference {name!r} is not finite")
        write_tensors(pair / "inputs.arrow", {sample.input_name: x})
        write_tensors(pair / "references.arrow", refs)
        pairs.append({"name": pair_name, "batch": batch})

    provenance = {
        "method": PROVENANCE_METHOD,
        "numpy": np.__version__,
        "seed": sample.seed,
        "pairs": pairs,
    }
    (validation / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n",
                                                encoding="utf-8")
    spec = folder / "release.toml"
    spec.write_text(sample.toml, encoding="utf-8")
    if sample.int8_toml:
        _precision_sets(sample, weights, folder)
        (folder / "release-int8.toml").write_text(sample.int8_toml, encoding="utf-8")
    return spec


def _precision_sets(sample: Sample, weights: dict[str, np.ndarray], folder: Path) -> None:
    """``holdout/`` (pairs, references from the float64 reimplementation) and
    ``calibration/`` (inputs only), from a generator of their own: no input of theirs is a
    validation input."""
    rng = np.random.default_rng(sample.seed + PRECISION_SEED_OFFSET)
    for i, batch in enumerate(HOLDOUT_BATCHES):
        pair = folder / "holdout" / f"pair-{i:03d}"
        pair.mkdir(parents=True, exist_ok=True)
        x = rng.standard_normal((batch, *sample.input_shape)).astype(np.float32)
        write_tensors(pair / "inputs.arrow", {sample.input_name: x})
        write_tensors(pair / "references.arrow", sample.reference(weights, x))
    (folder / "holdout" / "provenance.json").write_text(json.dumps(
        {"method": PROVENANCE_METHOD, "numpy": np.__version__,
         "seed": sample.seed + PRECISION_SEED_OFFSET,
         "pairs": [{"name": f"pair-{i:03d}", "batch": b}
                   for i, b in enumerate(HOLDOUT_BATCHES)]}, indent=2) + "\n", encoding="utf-8")
    for i, batch in enumerate(CALIBRATION_BATCHES):
        folder_i = folder / "calibration" / f"sample-{i:03d}"
        folder_i.mkdir(parents=True, exist_ok=True)
        x = rng.standard_normal((batch, *sample.input_shape)).astype(np.float32)
        write_tensors(folder_i / "inputs.arrow", {sample.input_name: x})


def build_all(out_dir: Path) -> list[Path]:
    """Build every sample under ``out_dir``; return the paths of their ``release.toml``."""
    out_dir = Path(out_dir)
    return [build_sample(sample, out_dir) for sample in SAMPLES]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="folder to write the samples into (default: %(default)s)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    specs = build_all(args.out)
    elapsed = time.perf_counter() - start
    for spec in specs:
        print(spec)
    print(f"built {len(specs)} samples in {elapsed:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
