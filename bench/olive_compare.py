"""Against Olive: dossier's shipped engine beside Olive's best model that meets the same bar.

One procedure outside both tools, per model:

1. ``dossier release`` of the model's spec, in a child process (wall time recorded); then an
   Olive run (``olive-ai``, in a child process of its own interpreter, ``--olive-python``) with
   its ONNX Runtime quantization pass (``OnnxQuantization`` over the choices dossier's spec
   searches: dynamic / static QDQ, per-channel off / on; static calibrated on the spec's
   calibration set) followed by its session-parameter tuning pass (``OrtSessionParamsTuning``,
   CPU provider, intra-op threads searched), plus the flow without quantization (dossier's
   ``-quantization=none``), under an accuracy goal at dossier's bar (the largest ``1 - cosine``
   of every output of every validation pair against the float64 references, ``threshold
   1e-3``: this file is Olive's ``user_script``, reading dossier's validation set with
   ``dossier.tensors.read_tensors``) and a latency metric ranked first (wall time recorded).
2. In ONE fresh process: dossier's shipped engine as ``dossier.load`` serves it and Olive's best
   candidate (with the session options Olive chose), alternating in rounds on the same inputs
   (one validation input of each shape), each block after a 50 ms pause (the other session's
   threads spin on after its last call: without the pause, on 2 cores, whichever engine ran
   second in a round read about 2x slower) and 3 untimed calls; per round the ratio Olive /
   dossier of the summed per-input medians (> 1: dossier's engine is faster), the
   Hodges-Lehmann estimate over rounds of its logarithm with the exact 95% interval of the
   signed-rank test
   (``dossier.measure.timing.shift_interval``, as the workload suite's ratios). Olive's candidate is checked against the bar here
   too, on the validation and hold-out sets.

The load average is recorded beside each timing (the CPU is shared).

    python bench/olive_compare.py prepare            # the four models under bench/work/olive
    python bench/olive_compare.py compare tblock convnet resnet18 bert
    python bench/olive_compare.py compare resnet18 --threads   # dossier searches threads too
    python bench/olive_compare.py report             # bench/results/olive-compare.md
    python bench/olive_compare.py goal-check tblock --threshold 1e-5   # Olive's goal alone

Release time against Olive's run, repeated (pairs in alternating order, a ratio with its
interval): ``walls tblock --repeats 5 --threads`` (``bench/results/olive-walls.json``).

A model's stages can also run apart: ``olive-only MODEL`` (Olive's run), then ``finish MODEL
--bundle B`` (the side by side against a bundle released by ``dossier release``).

``compare`` writes ``bench/results/olive-compare.json`` after each model (``--out``), merging
with what is there, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dossier.fingerprint import matrix_units  # noqa: E402
from dossier.tensors import read_tensors  # noqa: E402
from dossier.validation import loss  # noqa: E402

RESULTS = ROOT / "bench" / "results"
WORK = ROOT / "bench" / "work" / "olive"
PRECISION_MODELS = Path("/work/main/bench/work/precision")
OLIVE_PYTHON = "/tmp/olive/bin/python"
BAR = 1e-3
MODELS = ("tblock", "convnet", "resnet18", "bert")

# Per model: the spec, Olive's latency repeats, the side-by-side's calls per input and rounds.
# BERT takes 0.1-0.4 s per inference here: few repeats (dossier's side: bench/precision.py's
# BENCH_TIMING, already in that spec).
SETTINGS: dict[str, dict[str, Any]] = {
    "tblock": {"spec": "release-int8.toml", "olive_warmup": 10, "olive_repeat": 20,
               "calls": 40, "rounds": 120},
    "convnet": {"spec": "release-int8.toml", "olive_warmup": 10, "olive_repeat": 20,
                "calls": 40, "rounds": 120},
    "resnet18": {"spec": "release.toml", "olive_warmup": 3, "olive_repeat": 10,
                 "calls": 8, "rounds": 60},
    "bert": {"spec": "release.toml", "olive_warmup": 2, "olive_repeat": 5,
             "calls": 5, "rounds": 40},
}


PAUSE_S = 0.05
"""Seconds of rest before each block of the side by side (see ``side_by_side``)."""
LEAD_IN = 3
"""Untimed calls per input before each block of the side by side."""


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _pair_dirs(folder: Path) -> list[Path]:
    return sorted(p for p in Path(folder).iterdir() if (p / "inputs.arrow").is_file())


# ------------------------------------------------------------------- Olive's user script
# Olive imports this file as its user_script (under its own interpreter): the data set, the
# data loader and the accuracy metric below are registered only there.
def dossier_inputs(path: str, first: int = 0) -> list[tuple[dict[str, np.ndarray], int]]:
    """The inputs of a dossier set (validation pairs or calibration samples), as Olive's
    (data, label) batches; ``first``: only that many (0: all)."""
    dirs = _pair_dirs(Path(path))
    dirs = dirs[:first] if first else dirs
    return [(read_tensors(d / "inputs.arrow"), 0) for d in dirs]


def dossier_loader(dataset: Any, **_: Any) -> Any:
    """The batches as they are: dossier's inputs already carry their batch dimension."""
    return dataset


def worst_cos_loss(model: Any, device: Any, execution_providers: Any,
                   validation: str = "") -> dict[str, float]:
    """Olive's custom metric: the largest ``1 - cosine`` over every output of every pair of
    dossier's validation set against its float64 references (dossier's ``cos`` metric)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model.model_path), providers=["CPUExecutionProvider"])
    return {"worst_cos_loss": _worst(session, Path(validation))}


def _worst(session: Any, folder: Path) -> float:
    worst = 0.0
    for d in _pair_dirs(folder):
        refs = read_tensors(d / "references.arrow")
        outs = session.run(list(refs), read_tensors(d / "inputs.arrow"))
        for o, r in zip(outs, refs.values()):
            v = loss("cos", o, r)
            worst = max(worst, float("inf") if v is None else v)
    return worst


try:  # under Olive's interpreter only
    from olive.data.registry import Registry as _Registry

    _Registry.register_dataset("dossier_inputs")(dossier_inputs)
    _Registry.register_dataloader("dossier_loader")(dossier_loader)
except ImportError:
    pass


# ------------------------------------------------------------------------------- prepare
def prepare(work: Path, precision_models: Path) -> None:
    """The samples (built), the conv net given calibration and hold-out sets as the tblock
    sample has them, and copies of the two bench models."""
    spec = importlib.util.spec_from_file_location("samples_build", ROOT / "samples" / "build.py")
    build = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["samples_build"] = build
    spec.loader.exec_module(build)  # type: ignore[union-attr]
    samples = work / "samples"
    if samples.exists():
        shutil.rmtree(samples)
    build.build_all(samples)
    conv = next(s for s in build.SAMPLES if s.name == "convnet")
    weights = conv.weights(np.random.default_rng(conv.seed))
    build._precision_sets(conv, weights, samples / "convnet")
    text = (samples / "tblock" / "release-int8.toml").read_text()
    head, _, _ = text.partition("[[shapes]]")
    head = head.replace('name = "tblock-int8"', 'name = "convnet-int8"').replace(
        "Transformer block", "Conv net")
    shapes = (samples / "convnet" / "release.toml").read_text().partition("[[shapes]]")[2]
    (samples / "convnet" / "release-int8.toml").write_text(head + "[[shapes]]" + shapes)
    for name in ("resnet18", "bert"):
        dst = work / name
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(precision_models / name, dst)


def _folder(work: Path, model: str) -> Path:
    return work / "samples" / model if model in ("tblock", "convnet") else work / model


# ------------------------------------------------------------------------------- dossier
def dossier_release(folder: Path, spec: str, out: Path) -> dict[str, Any]:
    """One ``dossier release`` in a child process (a fresh build cache); what its bundle says."""
    cmd = [sys.executable, "-m", "dossier_cli.main", "release", str(folder / spec), "--out",
           str(out / "bundle"), "--build-cache", str(out / "build-cache")]
    t0, load0 = time.perf_counter(), _load()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    row: dict[str, Any] = {
        "command": f"dossier release {folder.name}/{spec} --out OUT --build-cache FRESH",
        "rc": proc.returncode, "wall_s": round(time.perf_counter() - t0, 1),
        "load_before": load0, "load_after": _load()}
    if proc.returncode != 0:
        row["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return row
    row.update(bundle_summary(Path(proc.stdout.strip().splitlines()[-1])))
    return row


def bundle_summary(bundle: Path) -> dict[str, Any]:
    """What a release bundle says about its decision and routes."""
    from dossier.bundle import open_bundle

    with open_bundle(bundle) as b:
        rec = b.tuning_cache()
        d = rec.decision
        assert d is not None
        trials = [t for t in rec.trials if t.role != "confirm"]
        return dict(
            bundle=str(bundle), shipped=d.shipped_route, gain=d.gain, speedup=d.speedup,
            speedup_ci=[d.speedup_ci_low, d.speedup_ci_high], reason=d.reason,
            holdout_worst_loss=d.holdout.worst_loss if d.holdout else None,
            validation_worst_loss=next((t.worst_loss for t in trials
                                        if t.index == d.shipped_index), None),
            routes={t.route: {"outcome": t.outcome.value, "worst_loss": t.worst_loss,
                              "median_ms": t.timing.median_ms if t.timing else None,
                              "trial_s": t.trial_s, "raced": t.raced}
                    for t in trials},
            # where a release's time went: the confirmation's processes and why it stopped
            confirm_processes=d.processes, confirm_stopped=d.stopped,
            confirm_s=next((t.trial_s for t in rec.trials if t.role == "confirm"), None))


# --------------------------------------------------------------------------------- Olive
def olive_config(folder: Path, model: str, run_dir: Path, quantize: bool) -> dict[str, Any]:
    """Olive's workflow: quantization then session tuning (``quantize``), or session tuning
    alone, searched exhaustively, ranked by latency among the candidates that meet the
    accuracy goal."""
    s = SETTINGS[model]
    script = str(Path(__file__).resolve())

    def data(name: str, path: Path, first: int = 0) -> dict[str, Any]:
        return {"name": name, "user_script": script,
                "load_dataset_config": {"type": "dossier_inputs",
                                        "params": {"path": str(path), "first": first}},
                "dataloader_config": {"type": "dossier_loader"}}

    def choice(*values: Any) -> dict[str, Any]:
        return {"olive_parameter_type": "SearchParameter", "type": "Categorical",
                "support": list(values)}

    cores = os.cpu_count() or 1
    return {
        "input_model": {"type": "ONNXModel", "model_path": str(folder / "model.onnx")},
        "systems": {"local": {"type": "LocalSystem", "accelerators": [
            {"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]}},
        "data_configs": [data("calibration", folder / "calibration"),
                         data("latency", folder / "validation", first=1)],
        "evaluators": {"bar": {"type": "OnnxEvaluator", "metrics": [
            {"name": "latency", "type": "latency", "data_config": "latency",
             "sub_types": [{"name": "avg", "priority": 1, "metric_config": {
                 "warmup_num": s["olive_warmup"], "repeat_test_num": s["olive_repeat"]}}]},
            {"name": "accuracy", "type": "custom",
             "user_config": {"user_script": script, "evaluate_func": "worst_cos_loss",
                             "evaluate_func_kwargs": {"validation": str(folder / "validation")}},
             "sub_types": [{"name": "worst_cos_loss", "priority": 2, "higher_is_better": False,
                            "goal": {"type": "threshold", "value": BAR}}]}]}},
        "passes": {
            **({"quantization": {
                "type": "OnnxQuantization", "data_config": "calibration",
                "quant_mode": choice("dynamic", "static"), "per_channel": choice(False, True),
                # the other choices at dossier's defaults: s8 weights, u8 activations (U8S8),
                # QDQ, MinMax, quant_pre_process first, no reduced range
                "precision": "int8", "activation_type": "uint8", "quant_format": "QDQ",
                "calibrate_method": "MinMax", "quant_preprocess": True, "reduce_range": False},
            } if quantize else {}),
            "session": {
                "type": "OrtSessionParamsTuning", "data_config": "latency",
                "intra_thread_num_list": choice(*sorted({1, cores})),
                "providers_list": "CPUExecutionProvider"}},
        "search_strategy": {"execution_order": "joint", "sampler": "sequential"},
        "evaluator": "bar", "host": "local", "target": "local",
        "cache_dir": str(run_dir / ("cache-int8" if quantize else "cache-fp32")),
        "output_dir": str(run_dir / ("output-int8" if quantize else "output-fp32")),
        "clean_cache": True, "log_severity_level": 1,
    }


def _patch_custom_metric_serialization() -> None:
    """Olive 0.13 cannot serialize a custom metric: its ``backend`` and its sub-types'
    ``metric_config`` are None and their serializers call ``.model_dump()`` on them, and its
    ``user_config`` (declared as the base ``ConfigBase``) serializes to ``{}``, so the
    ``evaluate_func`` is lost when the engine re-reads the evaluator from JSON. Make those
    serializers None-safe, serialize ``user_config`` as what it is, and rebuild the models
    that embed them. And a search point whose first pass is found in Olive's cache (the same
    quantization under another thread count) fails: the footprint sets ``model_config``, the
    alias of its field ``model_config_data``, by attribute. Set the field. Nothing else
    changes."""
    import sys as _sys

    from olive.evaluator import metric as m
    from pydantic import BaseModel, SerializeAsAny

    def none_safe(f: Any) -> Any:
        def g(self: Any, v: Any) -> Any:
            return None if v is None else f(self, v)
        return g

    for cls in (m.SubMetric, m.Metric):
        for dec in cls.__pydantic_decorators__.field_serializers.values():
            dec.func = none_safe(dec.func)
        if cls is m.Metric:
            field = cls.model_fields["user_config"]
            field.annotation = SerializeAsAny[field.annotation]  # type: ignore[name-defined]
        cls.model_rebuild(force=True)
    import olive.workflows.run.config  # noqa: F401  (the run config's models, to rebuild)
    from olive.engine.footprint import FootprintNode

    def update(self: Any, **kwargs: Any) -> None:
        for k, v in kwargs.items():
            setattr(self, "model_config_data" if k == "model_config" else k, v)

    FootprintNode.update = update

    for _ in range(2):
        for name, module in list(_sys.modules.items()):
            if not name.startswith("olive."):
                continue
            for obj in list(vars(module).values()):
                if (isinstance(obj, type) and issubclass(obj, BaseModel)
                        and obj.__module__ == name and obj not in (m.SubMetric, m.Metric)):
                    try:
                        obj.model_rebuild(force=True)
                    except Exception:  # noqa: BLE001  (a generic or partial model: leave it)
                        pass


def olive_child(configs: list[Path], out: Path) -> int:
    """Under Olive's interpreter: run each workflow, write what came out as JSON."""
    import olive

    _patch_custom_metric_serialization()
    from olive.workflows import run

    def describe(m: Any, nodes: dict[str, Any]) -> dict[str, Any]:
        node = nodes.get(m.model_id) or {}
        cfg = (node.get("model_config") or {}).get("config") or {}
        return {"model_path": m.model_path, "model_id": m.model_id,
                "metrics": m.metrics_value, "inference_settings": cfg.get("inference_settings"),
                "from_pass": m.from_pass()}

    flows = []
    for path in configs:
        t0 = time.perf_counter()
        result = run(json.loads(path.read_text()))
        best = result.get_best_candidate() if result is not None else None
        nodes = {}
        if result is not None:
            for mid, node in result.footprint.nodes.items():
                nodes[mid] = {"from_pass": node.from_pass, "parent": node.parent_model_id,
                              "pass_config": node.pass_run_config,
                              "model_config": node.model_config_data,
                              "if_goals_met": node.metrics.if_goals_met if node.metrics else None,
                              "metrics": node.metrics.value.to_json() if node.metrics else None}
        flows.append({"config": str(path), "wall_s": round(time.perf_counter() - t0, 1),
                      "best": describe(best, nodes) if best is not None else None,
                      "outputs": [describe(m, nodes) for m in
                                  (result.get_output_models() if result is not None else [])],
                      "footprint": nodes})
    out.write_text(json.dumps({"olive": olive.__version__, "flows": flows}, indent=2,
                              default=str) + "\n")
    return 0


def olive_run(folder: Path, model: str, run_dir: Path, olive_python: str) -> dict[str, Any]:
    """Olive's two workflows (int8 routes, float32) in one child process; Olive's best is the
    lower of the two flows' best latencies by Olive's own metric, among those meeting the bar
    by Olive's own accuracy metric."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    configs = []
    for quantize in (True, False):
        config = olive_config(folder, model, run_dir, quantize)
        path = run_dir / f"config-{'int8' if quantize else 'fp32'}.json"
        path.write_text(json.dumps(config, indent=2) + "\n")
        configs.append((path, config))
    out = run_dir / "result.json"
    cmd = [olive_python, str(Path(__file__).resolve()), "olive-child", str(out),
           *(str(p) for p, _ in configs)]
    t0, load0 = time.perf_counter(), _load()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    config = configs[0][1]
    row: dict[str, Any] = {
        "command": "olive.workflows.run(CONFIG) for each flow, in one child process of Olive's "
                   "interpreter (python bench/olive_compare.py olive-child OUT CONFIG...)",
        "rc": proc.returncode, "wall_s": round(time.perf_counter() - t0, 1),
        "load_before": load0, "load_after": _load(),
        "search": {"passes": {k: {kk: vv for kk, vv in v.items() if kk != "data_config"}
                              for k, v in config["passes"].items()},
                   "flows": ["quantization -> session", "session"],
                   "search_strategy": config["search_strategy"],
                   "latency_metric": config["evaluators"]["bar"]["metrics"][0]["sub_types"][0],
                   "accuracy_goal": {"metric": "worst 1 - cosine over every output of every "
                                               "validation pair", "threshold": BAR}}}
    (run_dir / "olive.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not out.is_file():
        row["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return row
    result = json.loads(out.read_text())
    row["olive"] = result["olive"]
    row["flows"] = []
    measured = []
    for flow in result["flows"]:
        cands = []
        for mid, n in flow["footprint"].items():
            cfg = (n.get("model_config") or {}).get("config") or {}
            metrics = {k: v["value"] for k, v in (n["metrics"] or {}).items()}
            cands.append({"id": mid, "from": n["from_pass"], "parent": n["parent"],
                          "pass_config": _short_config(n["pass_config"]), "metrics": metrics,
                          "if_goals_met": n.get("if_goals_met")})
            if n["from_pass"] and "latency-avg" in metrics and cfg.get("model_path"):
                measured.append({"model_id": mid, "model_path": cfg["model_path"],
                                 "inference_settings": cfg.get("inference_settings"),
                                 "metrics": metrics})
        best = flow["best"]
        row["flows"].append({
            "wall_s": flow["wall_s"], "candidates": cands,
            "olive_best": best and {
                "model_id": best["model_id"],
                "metrics": {k: v["value"] for k, v in (best["metrics"] or {}).items()}}})
    # Olive's best that meets the bar: the lowest latency by Olive's own metric among the
    # candidates whose accuracy by Olive's own metric (this file's) is within the bar
    meeting = [m for m in measured if _olive_meets(m["metrics"])]
    row["candidates_measured"] = len(measured)
    row["candidates_meeting_bar"] = len(meeting)
    row["best"] = min(meeting, key=lambda m: m["metrics"]["latency-avg"], default=None)
    if row["best"] is not None:
        row["best"]["chain"] = _chain(row, row["best"]["model_id"])
    return row


def _olive_meets(metrics: dict[str, Any]) -> bool:
    v = metrics.get("accuracy-worst_cos_loss")
    return v is not None and v <= BAR


def _chain(row: dict[str, Any], model_id: str) -> list[Any]:
    """The pass configurations from the input model to ``model_id``."""
    nodes = {c["id"]: c for f in row["flows"] for c in f["candidates"]}
    chain = []
    while model_id in nodes and nodes[model_id]["from"]:
        chain.append({nodes[model_id]["from"]: nodes[model_id]["pass_config"]})
        model_id = nodes[model_id]["parent"]
    return chain[::-1]


def _short_config(cfg: Any) -> Any:
    if not isinstance(cfg, dict):
        return cfg
    keys = ("quant_mode", "per_channel", "intra_thread_num_list", "precision", "activation_type")
    return {k: cfg[k] for k in keys if k in cfg}


# ------------------------------------------------------------------------- side by side
def _weights(spec: Path, inputs: list[dict[str, np.ndarray]]) -> list[float]:
    """Each input's weight from the spec's ``[[shapes]]`` (1 each without)."""
    import tomllib

    shapes = tomllib.loads(spec.read_text()).get("shapes") or []
    table = {tuple((k, tuple(v)) for k, v in sorted(s["inputs"].items())): float(s["weight"])
             for s in shapes}
    return [table.get(tuple((k, v.shape) for k, v in sorted(x.items())), 1.0 if not table
                      else 0.0) for x in inputs]


def side_by_side(bundle: Path, olive_model: Path, settings: dict[str, Any], folder: Path,
                 spec: str, calls: int, rounds: int) -> dict[str, Any]:
    """In this (fresh) process: both engines, alternating in rounds on the same inputs (one
    validation input per shape); a round's time is the sum of each input's median over
    ``calls`` calls, weighted as the spec's ``[[shapes]]`` weigh them."""
    import onnxruntime as ort

    import dossier
    from dossier.measure.timing import shift_interval

    engine = dossier.load(bundle, on_suboptimal="ignore")
    so = ort.SessionOptions()
    opts = (settings or {}).get("session_options") or {}
    if opts.get("intra_op_num_threads"):
        so.intra_op_num_threads = int(opts["intra_op_num_threads"])
    if opts.get("inter_op_num_threads"):
        so.inter_op_num_threads = int(opts["inter_op_num_threads"])
    if opts.get("execution_mode") is not None:
        so.execution_mode = ort.ExecutionMode(int(opts["execution_mode"]))
    if opts.get("graph_optimization_level") is not None:
        so.graph_optimization_level = ort.GraphOptimizationLevel(
            int(opts["graph_optimization_level"]))
    for k, v in (opts.get("extra_session_config") or {}).items():
        so.add_session_config_entry(k, str(v))
    session = ort.InferenceSession(str(olive_model), so, providers=["CPUExecutionProvider"])

    def olive(feed: dict[str, np.ndarray]) -> Any:
        return session.run(None, feed)

    feeds: dict[tuple[Any, ...], dict[str, np.ndarray]] = {}
    for d in _pair_dirs(folder / "validation"):
        x = read_tensors(d / "inputs.arrow")
        feeds.setdefault(tuple(v.shape for v in x.values()), x)
    inputs = list(feeds.values())
    weights = _weights(folder / spec, inputs)
    runners = {"dossier": engine, "olive": olive}
    for f in runners.values():  # warm-up
        for x in inputs:
            for _ in range(3):
                f(x)

    def one_round(f: Any) -> float:
        # a pause first: the other engine's intra-op threads spin on after its last call, and
        # on 2 cores a block started at once ran about 2x slower (each engine alone in its
        # process, as it serves, never sees that); then a short untimed lead-in
        time.sleep(PAUSE_S)
        for x in inputs:
            for _ in range(LEAD_IN):
                f(x)
        total = 0.0
        for x, w in zip(inputs, weights):
            t = []
            for _ in range(calls):
                t0 = time.perf_counter()
                f(x)
                t.append(time.perf_counter() - t0)
            total += w * float(np.median(t))
        return total * 1e3

    load0 = _load()
    ms: dict[str, list[float]] = {"dossier": [], "olive": []}
    for r in range(rounds):
        order = ("dossier", "olive") if r % 2 == 0 else ("olive", "dossier")
        for name in order:
            ms[name].append(one_round(runners[name]))
    ratios = np.array(ms["olive"]) / np.array(ms["dossier"])
    est, lo, hi = shift_interval(np.log(ratios), 0.95)
    return {"ratio_olive_over_dossier": {"estimate": round(float(np.exp(est)), 4),
                                         "ci95": [round(float(np.exp(lo)), 4),
                                                  round(float(np.exp(hi)), 4)],
                                         "median": round(float(np.median(ratios)), 4),
                                         "method": "Hodges-Lehmann over rounds of the log "
                                                   "round ratio, exact signed-rank interval"},
            "n_rounds": rounds, "calls_per_input": calls, "pause_s": PAUSE_S,
            "lead_in_calls": LEAD_IN,
            "round_ms": {k: [round(x, 4) for x in v] for k, v in ms.items()},
            "dossier_first": [r % 2 == 0 for r in range(rounds)],
            "ratio_by_order": {
                first: round(float(np.median(ratios[[(r % 2 == 0) == (first == "dossier")
                                                     for r in range(rounds)]])), 4)
                for first in ("dossier", "olive")},
            "inputs": [{k: list(v.shape) for k, v in x.items()} for x in inputs],
            "weights": weights,
            "dossier_median_ms": round(float(np.median(ms["dossier"])), 4),
            "olive_median_ms": round(float(np.median(ms["olive"])), 4),
            "dossier_route": engine.route, "olive_session_options": opts,
            "load_before": load0, "load_after": _load(),
            "olive_validation_worst_loss": _worst(session, folder / "validation"),
            "olive_holdout_worst_loss": _worst(session, folder / "holdout")}


def side_by_side_child(args: argparse.Namespace) -> int:
    settings = json.loads(args.settings) if args.settings else {}
    row = side_by_side(Path(args.bundle), Path(args.olive_model), settings, Path(args.folder),
                       args.spec, args.calls, args.rounds)
    Path(args.out).write_text(json.dumps(row, indent=2) + "\n")
    return 0


# ------------------------------------------------------------------------------- compare
def _commit() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip() or "unknown"


def _save(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def with_threads(folder: Path, spec: str) -> str:
    """A copy of ``spec`` beside it whose selection also searches ``-intra_op_num_threads=[0|1]``
    (0: ONNX Runtime's default, every core), as Olive's session tuning searches the thread count;
    the copy's file name."""
    text = (folder / spec).read_text()
    tuned, n = re.subn(r'(selection = "[^"]*)"', r'\1 -intra_op_num_threads=[0|1]"', text, count=1)
    if n != 1:
        raise SystemExit(f"{folder / spec}: no selection to add the thread count to")
    name = spec.replace(".toml", "-threads.toml")
    (folder / name).write_text(tuned)
    return name


def compare(models: list[str], work: Path, out: Path, olive_python: str,
            threads: bool = False) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    doc.update(commit=_commit(), cores=os.cpu_count(), host_cpu=matrix_units(), bar={"metric": "cos", "threshold": BAR},
               procedure=__doc__.split("\n\n")[1] if __doc__ else "")
    doc.setdefault("models", {})
    for model in models:
        folder = _folder(work, model)
        s = SETTINGS[model]
        spec = with_threads(folder, s["spec"]) if threads else s["spec"]
        row: dict[str, Any] = {
            "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": f"python bench/olive_compare.py compare {model}"
                       + (" --threads" if threads else ""), "dossier_spec": spec,
            "commit": _commit()}
        with tempfile.TemporaryDirectory(prefix=f"olive-compare-{model}-") as tmp:
            doc["models"][model] = row  # saved after each stage: a run cut short keeps it
            row["dossier"] = dossier_release(folder, spec, Path(tmp) / "dossier")
            _save(out, doc)
            print(model, "dossier", {k: row["dossier"].get(k) for k in
                                     ("rc", "wall_s", "shipped", "speedup", "error")},
                  flush=True)
            row["olive"] = olive_run(folder, model, work / "olive-runs" / model, olive_python)
            _save(out, doc)
            best = row["olive"].get("best")
            print(model, "olive", row["olive"].get("wall_s"), row["olive"].get("error"),
                  best and best.get("metrics"), flush=True)
            if row["dossier"].get("bundle") and best and best.get("model_path"):
                side = Path(tmp) / "side.json"
                cmd = [sys.executable, str(Path(__file__).resolve()), "side-by-side",
                       "--bundle", row["dossier"]["bundle"], "--olive-model",
                       best["model_path"], "--settings",
                       json.dumps(best.get("inference_settings") or {}),
                       "--folder", str(folder), "--spec", spec, "--calls", str(s["calls"]),
                       "--rounds", str(s["rounds"]), "--out", str(side)]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode == 0:
                    row["side_by_side"] = json.loads(side.read_text())
                    row["side_by_side"]["command"] = (
                        "python bench/olive_compare.py side-by-side --bundle B --olive-model M "
                        f"--calls {s['calls']} --rounds {s['rounds']} (one fresh process)")
                else:
                    row["side_by_side"] = {"error": proc.stderr.strip().splitlines()[-3:]}
                print(model, "side", row["side_by_side"].get("ratio_olive_over_dossier"),
                      flush=True)
        doc["models"][model] = row
        _save(out, doc)
    return doc


def walls(models: list[str], work: Path, out: Path, olive_python: str, repeats: int,
          threads: bool = False) -> dict[str, Any]:
    """Release time against Olive's run, repeated: ``repeats`` pairs of one ``dossier release``
    (a fresh build cache) and one Olive run, the order alternating from pair to pair (dossier
    first in the first); per pair the ratio dossier / Olive of the wall times (< 1: the release
    was shorter), the Hodges-Lehmann estimate over pairs of its logarithm with the exact 95%
    signed-rank interval, and each tool's median wall time. One run each (what ``compare``
    records) says little where a release's time depends on which of two speeds the host's
    2-thread engines run at."""
    from dossier.measure.timing import shift_interval

    doc: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    doc.setdefault("models", {})
    for model in models:
        folder = _folder(work, model)
        spec = with_threads(folder, SETTINGS[model]["spec"]) if threads else \
            SETTINGS[model]["spec"]
        row: dict[str, Any] = {
            "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": f"python bench/olive_compare.py walls {model} --repeats {repeats}"
                       + (" --threads" if threads else ""),
            "commit": _commit(), "host_cpu": matrix_units(), "dossier_spec": spec, "pairs": []}
        doc["models"][model] = row
        for i in range(repeats):
            pair: dict[str, Any] = {"dossier_first": i % 2 == 0}
            with tempfile.TemporaryDirectory(prefix=f"olive-walls-{model}-") as tmp:
                for tool in (("dossier", "olive") if i % 2 == 0 else ("olive", "dossier")):
                    got = (dossier_release(folder, spec, Path(tmp) / "dossier")
                           if tool == "dossier" else
                           olive_run(folder, model, work / "olive-runs" / model, olive_python))
                    pair[tool] = {k: got.get(k) for k in (
                        "rc", "wall_s", "load_before", "shipped", "speedup", "error",
                        "confirm_processes", "confirm_stopped", "confirm_s") if k in got}
            row["pairs"].append(pair)
            ok = [p for p in row["pairs"] if p["dossier"]["rc"] == 0 and p["olive"]["rc"] == 0]
            logs = np.log([p["dossier"]["wall_s"] / p["olive"]["wall_s"] for p in ok])
            row["n"] = len(ok)
            row["dossier_median_s"] = float(np.median([p["dossier"]["wall_s"] for p in ok]))
            row["olive_median_s"] = float(np.median([p["olive"]["wall_s"] for p in ok]))
            if len(ok) >= 2:
                est, lo, hi = shift_interval(logs, 0.95)
                row["ratio_dossier_over_olive"] = {
                    "estimate": round(float(np.exp(est)), 4),
                    "ci95": [round(float(np.exp(lo)), 4), round(float(np.exp(hi)), 4)],
                    "method": "Hodges-Lehmann over pairs of the log ratio, exact signed-rank "
                              "interval (with six pairs or fewer, the range of the pairs)"}
            _save(out, doc)
            print(model, i, pair["dossier"]["wall_s"], pair["olive"]["wall_s"],
                  row.get("ratio_dossier_over_olive"), flush=True)
    return doc


def _describe_chain(chain: list[Any] | None) -> str:
    parts = []
    for step in chain or []:
        for name, cfg in step.items():
            cfg = cfg or {}
            if name == "onnxquantization":
                parts.append(f"{cfg.get('quant_mode')} int8"
                             + (", per-channel" if cfg.get("per_channel") else ""))
            elif name == "ortsessionparamstuning":
                parts.append(f"{cfg.get('intra_thread_num_list')} intra-op thread(s)")
    return "; ".join(parts) or "-"


def _merge(out: Path, model: str, key: str, value: Any) -> None:
    doc: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    doc.setdefault("models", {}).setdefault(model, {})[key] = value
    _save(out, doc)


def olive_only(model: str, work: Path, out: Path, olive_python: str) -> None:
    """Olive's run alone (a ``compare`` whose stages were run apart)."""
    row = olive_run(_folder(work, model), model, work / "olive-runs" / f"{model}-apart",
                    olive_python)
    row["command"] = f"python bench/olive_compare.py olive-only {model}: " + row["command"]
    _merge(out, model, "olive", row)


def finish(model: str, bundle: Path, work: Path, out: Path, calls: int, rounds: int) -> None:
    """The side by side of a model whose release and Olive run are in ``out`` already (their
    stages run apart): the bundle's summary, then the timing in one fresh process."""
    doc = json.loads(out.read_text())
    row = doc["models"][model]
    row.setdefault("dossier", {}).update(bundle_summary(bundle))
    best = row["olive"]["best"]
    folder = _folder(work, model)
    with tempfile.TemporaryDirectory(prefix="olive-compare-side-") as tmp:
        side = Path(tmp) / "side.json"
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "side-by-side", "--bundle",
             str(bundle), "--olive-model", best["model_path"], "--settings",
             json.dumps(best.get("inference_settings") or {}), "--folder", str(folder),
             "--spec", SETTINGS[model]["spec"], "--calls", str(calls), "--rounds",
             str(rounds), "--out", str(side)], capture_output=True, text=True)
        row["side_by_side"] = (json.loads(side.read_text()) if proc.returncode == 0
                               else {"error": proc.stderr.strip().splitlines()[-3:]})
    row["side_by_side"]["command"] = (
        f"python bench/olive_compare.py finish {model} --bundle B --calls {calls} "
        f"--rounds {rounds} (one fresh process)")
    doc["models"][model] = row
    _save(out, doc)


def goal_check(model: str, threshold: float, work: Path, out: Path,
               olive_python: str) -> dict[str, Any]:
    """Olive's int8 flow with an accuracy goal tighter than int8's loss: does Olive's best
    meet it, and which candidates does Olive mark as meeting the goals?"""
    folder = _folder(work, model)
    run_dir = work / "olive-goal-check" / model
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    config = olive_config(folder, model, run_dir, True)
    config["evaluators"]["bar"]["metrics"][1]["sub_types"][0]["goal"]["value"] = threshold
    path = run_dir / "config-int8.json"
    path.write_text(json.dumps(config, indent=2) + "\n")
    load0 = _load()
    proc = subprocess.run([olive_python, str(Path(__file__).resolve()), "olive-child",
                           str(run_dir / "result.json"), str(path)],
                          capture_output=True, text=True)
    doc: dict[str, Any] = {
        "command": f"python bench/olive_compare.py goal-check {model} --threshold {threshold}",
        "commit": _commit(), "rc": proc.returncode, "load_before": load0,
        "goal": {"metric": "accuracy-worst_cos_loss", "type": "threshold",
                 "value": threshold}}
    if proc.returncode == 0:
        flow = json.loads((run_dir / "result.json").read_text())["flows"][0]
        best = flow["best"] or {}
        doc["olive_best"] = {"model_id": best.get("model_id"),
                             "metrics": {k: v["value"] for k, v in
                                         (best.get("metrics") or {}).items()}}
        doc["candidates"] = [
            {"id": mid, "from": n["from_pass"], "if_goals_met": n["if_goals_met"],
             "worst_cos_loss": (n["metrics"] or {}).get("accuracy-worst_cos_loss",
                                                         {}).get("value")}
            for mid, n in flow["footprint"].items() if n["metrics"]]
        doc["marked_meeting_goal_above_threshold"] = sum(
            bool(c["if_goals_met"]) and (c["worst_cos_loss"] or 0) > threshold
            for c in doc["candidates"])
    else:
        doc["error"] = (proc.stderr.strip().splitlines() or ["?"])[-1]
    _save(out, doc)
    return doc


def _g(v: Any) -> str:
    return "-" if v is None else f"{v:.2g}"


def report(src: Path, dst: Path) -> None:
    """The Markdown summary of ``src`` (what ``compare`` wrote)."""
    doc = json.loads(src.read_text())
    lines = [
        "# Against Olive", "",
        f"Bar for both tools: the worst `1 - cosine` of every output over the validation set "
        f"<= {BAR:g}, against float64 references. Ratio = Olive's best that meets the bar / "
        "dossier's shipped engine (time per round; > 1: dossier's engine is faster): the "
        "Hodges-Lehmann estimate over n alternating rounds in one fresh process, with the "
        "exact 95% signed-rank interval (rows timed before this procedure: the median over "
        "rounds, 95% bootstrap interval; the JSON says which). "
        f"dossier at commit {doc.get('commit')} (this script as committed with this file), "
        f"{doc.get('cores')} cores, shared (load average "
        "1/5/15 min at the start of each timing). Every figure: `python bench/olive_compare.py "
        "compare MODEL` (data and settings: `olive-compare.json`).", "",
        "| model | dossier ships (loss val / hold-out) | dossier release | Olive's best that "
        "meets the bar (loss val / hold-out) | Olive run | ratio (95% CI), n | ms per round "
        "dossier / Olive | load avg |",
        "|---|---|---|---|---|---|---|---|"]
    for model in MODELS:
        row = doc.get("models", {}).get(model)
        if not row:
            continue
        d, o = row.get("dossier") or {}, row.get("olive") or {"error": "not run"}
        s = row.get("side_by_side") or {}
        best = o.get("best")
        olive_desc = (_describe_chain(best.get("chain")) if best
                      else f"none ({o.get('error', 'no candidate meets the bar')})")
        r = s.get("ratio_olive_over_dossier")
        ratio = (f"{r.get('estimate', r['median']):.3f} ({r['ci95'][0]:.3f}-"
                 f"{r['ci95'][1]:.3f}), {s['n_rounds']}" if r else str(s.get("error", "-")))
        shipped = (f"`{d['shipped']}` ({_g(d.get('validation_worst_loss'))} / "
                   f"{_g(d.get('holdout_worst_loss'))})" if d.get("shipped")
                   else str(d.get("error", "not run")))
        if best and s:
            olive_desc += (f" ({_g(s.get('olive_validation_worst_loss'))} / "
                           f"{_g(s.get('olive_holdout_worst_loss'))})")
        lines.append(
            f"| {model} | {shipped} | {d.get('wall_s')} s | {olive_desc} | "
            f"{o.get('wall_s')} s | {ratio} | {s.get('dossier_median_ms', '-')} / "
            f"{s.get('olive_median_ms', '-')} | {s.get('load_before', '-')} |")
    missing = [m for m in MODELS if m not in doc.get("models", {})]
    if missing:
        lines += ["", f"Not run: {', '.join(missing)}."]
    for model, row in doc.get("models", {}).items():
        if "--threads" in row.get("command", ""):
            lines += ["", f"{model}: dossier's spec also searched `-intra_op_num_threads=[0|1]` "
                      f"(`{row['command']}`, commit {row.get('commit')}, started "
                      f"{row.get('started')}), as Olive's session tuning searches the thread "
                      "count."]
        if "stopped" in (row.get("dossier") or {}).get("command", ""):
            lines += ["", f"{model}: {row['dossier']['command']}."]
    lines += [
        "", "Settings. dossier: each spec's `-quantization=[none|dynamic|static] "
        "-quant_per_channel=[off|on]` (`full`), the other knobs at their defaults, its own "
        "`[timing]`; the engine as `dossier.load` serves it. Olive "
        f"{next((r['olive'].get('olive') for r in doc.get('models', {}).values() if r.get('olive', {}).get('olive')), '?')}: "
        "`OnnxQuantization` (quant_mode dynamic|static x per_channel off|on; int8 weights, "
        "uint8 activations, QDQ, MinMax, `quant_preprocess`, as dossier's defaults; its "
        "dynamic mode quantizes every op type, Conv included) then `OrtSessionParamsTuning` "
        "(CPU provider, intra-op threads 1|2), exhaustive joint search; and a second workflow "
        "with the session tuning alone (Olive 0.13 has no pass flows: the float32 route); "
        "latency metric (avg, ranked first) on the first validation input, accuracy metric "
        "this script's `worst_cos_loss` with a `threshold` goal. Olive's best = the lowest "
        "Olive latency among the candidates of both workflows whose Olive accuracy is within "
        "the bar; the side-by-side re-checks it on the validation and hold-out sets."]
    goal = src.with_name("olive-goal-check.json")
    if goal.is_file():
        g = json.loads(goal.read_text())
        lines += ["", f"Olive's `threshold` goal is not enforced (`{g['command']}`): with the "
                  f"goal at {g['goal']['value']:g}, Olive marked "
                  f"{g.get('marked_meeting_goal_above_threshold')} of "
                  f"{len(g.get('candidates', []))} evaluated models as meeting its goals "
                  "although their loss is above it, and returned one of them "
                  f"({g.get('olive_best')}): with only `threshold` goals, "
                  "`Engine.resolve_goals` returns no goals at all (no baseline is computed)."]
    dst.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--work", type=Path, default=WORK)
    p.add_argument("--precision-models", type=Path, default=PRECISION_MODELS)
    c = sub.add_parser("compare")
    c.add_argument("models", nargs="+", choices=MODELS)
    c.add_argument("--work", type=Path, default=WORK)
    c.add_argument("--out", type=Path, default=RESULTS / "olive-compare.json")
    c.add_argument("--olive-python", default=OLIVE_PYTHON)
    c.add_argument("--threads", action="store_true", help="dossier's spec also searches "
                   "-intra_op_num_threads=[0|1], as Olive's session tuning searches threads")
    oo = sub.add_parser("olive-only")
    oo.add_argument("model", choices=MODELS)
    oo.add_argument("--work", type=Path, default=WORK)
    oo.add_argument("--out", type=Path, default=RESULTS / "olive-compare.json")
    oo.add_argument("--olive-python", default=OLIVE_PYTHON)
    fi = sub.add_parser("finish")
    fi.add_argument("model", choices=MODELS)
    fi.add_argument("--bundle", type=Path, required=True)
    fi.add_argument("--work", type=Path, default=WORK)
    fi.add_argument("--out", type=Path, default=RESULTS / "olive-compare.json")
    fi.add_argument("--calls", type=int, default=3)
    fi.add_argument("--rounds", type=int, default=12)
    g = sub.add_parser("goal-check")
    g.add_argument("model", choices=MODELS)
    g.add_argument("--threshold", type=float, default=1e-5)
    g.add_argument("--work", type=Path, default=WORK)
    g.add_argument("--out", type=Path, default=RESULTS / "olive-goal-check.json")
    g.add_argument("--olive-python", default=OLIVE_PYTHON)
    w = sub.add_parser("walls")
    w.add_argument("models", nargs="+", choices=MODELS)
    w.add_argument("--repeats", type=int, default=5)
    w.add_argument("--work", type=Path, default=WORK)
    w.add_argument("--out", type=Path, default=RESULTS / "olive-walls.json")
    w.add_argument("--olive-python", default=OLIVE_PYTHON)
    w.add_argument("--threads", action="store_true")
    r = sub.add_parser("report")
    r.add_argument("--src", type=Path, default=RESULTS / "olive-compare.json")
    r.add_argument("--out", type=Path, default=RESULTS / "olive-compare.md")
    o = sub.add_parser("olive-child")
    o.add_argument("out", type=Path)
    o.add_argument("configs", type=Path, nargs="+")
    s = sub.add_parser("side-by-side")
    for k in ("--bundle", "--olive-model", "--folder", "--spec", "--out"):
        s.add_argument(k, required=True)
    s.add_argument("--settings", default="")
    s.add_argument("--calls", type=int, default=20)
    s.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)
    if args.cmd == "prepare":
        prepare(args.work, args.precision_models)
    elif args.cmd == "compare":
        compare(args.models, args.work, args.out, args.olive_python, args.threads)
    elif args.cmd == "walls":
        walls(args.models, args.work, args.out, args.olive_python, args.repeats, args.threads)
    elif args.cmd == "olive-only":
        olive_only(args.model, args.work, args.out, args.olive_python)
    elif args.cmd == "finish":
        finish(args.model, args.bundle, args.work, args.out, args.calls, args.rounds)
    elif args.cmd == "goal-check":
        goal_check(args.model, args.threshold, args.work, args.out, args.olive_python)
    elif args.cmd == "report":
        report(args.src, args.out)
    elif args.cmd == "olive-child":
        return olive_child(args.configs, args.out)
    else:
        return side_by_side_child(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
