"""The server scenario on a release's engine: the highest rate (QPS) meeting a latency bound,
measured by MLPerf LoadGen, for the single-stream winner as single-stream timing serves it (one
session, ONNX Runtime's default threads) and for serving configurations of the same engine
(``serving_sessions`` x ``intra_op_num_threads`` within the cores), side by side in one run,
decided by :func:`dossier.scenarios.decide.decide` (repetitions as the unit, order rotated, the
A/A copy of the baseline, the minimum effect, Holm)::

    python bench/scenario.py samples/tblock/release-int8.toml --route=-quantization=dynamic \\
        --bound-ms 5 --percentile 99 --out bench/results/scenario-tblock-int8.json
    python bench/scenario.py samples/tblock/release-int8.toml --route=-quantization=dynamic \\
        --bound-ms 5 --aa 10 --out bench/results/scenario-aa-tblock-int8.json
    python bench/scenario.py bench/work/encoder --make-encoder      # needs torch
    python bench/scenario.py bench/work/encoder/release.toml --route=-quantization=dynamic \\
        --bound-ms 500 --out bench/results/scenario-encoder-int8.json
    python bench/scenario.py samples/tblock/release-int8.toml --route=-quantization=dynamic \\
        --kind offline --configs 1x0x4,1x0x8 --repetitions 6 \\
        --out bench/results/scenario-offline-batch-tblock-int8.json

``--kind offline`` measures throughput (samples per second, LoadGen's Offline scenario) instead
of the highest rate meeting a bound; a configuration ``SxTxB`` is S sessions of T threads each
(0: ONNX Runtime's default) answering up to B waiting queries per call (``serving_batch``).

The bound is an argument so that it is chosen, and written in the results file, before the
first LoadGen run. Each LoadGen run lasts ``--duration-s`` (MLPerf's official runs: 600 s;
these are short runs with the same scenario semantics). ``--smoke`` runs a tiny version.
The engine is built here from the spec's model with the given route (the route a single-stream
release shipped), and served from the spec's validation inputs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = ((2, 1), (1, 1), (2, 2))
"""Serving configurations tried beside the single-stream winner: (sessions, threads each)."""


def _commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _probe(q: Any, percentile: float) -> dict[str, Any]:
    """One LoadGen run of a search, in a few numbers."""
    run = q.run
    return {"qps": round(q.qps, 2), "met": q.met, "outcome": q.outcome,
            "completed_qps": run.completed_qps if run else None,
            f"p{percentile:g}_ms": run.latency_ms(f"{percentile:.2f}") if run else None,
            "late_share": round(run.overlatency_count / run.query_count, 4)
            if run and run.overlatency_count is not None and run.query_count else None,
            "queries": run.query_count if run else None,
            "loadgen_result": run.loadgen_result if run else None}


ENCODER_SPEC = """[release]
name = "encoder-int8"
description = "A BERT-base-sized encoder (12 layers, hidden 768, 12 heads, feed-forward 3072)"
[model]
path = "model.onnx"
[validation]
path = "validation"
[tune]
selection = "-quantization=[none|dynamic]"
metric = "cos"
threshold = 1e-2
"""


def make_encoder(folder: Path, pairs: int = 4, seq: int = 128) -> Path:
    """A BERT-base-sized encoder without its embedding layer (torch's TransformerEncoder: 12
    post-norm layers, hidden 768, 12 heads, feed-forward 3072, GELU; random init, seed 0) as
    ``folder/model.onnx`` taking ``x[1, seq, 768]``, with a validation set whose references are
    the torch model's in float64, and a release spec. Needs torch."""
    import numpy as np
    import torch

    from dossier.tensors import write_tensors

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(768, 12, 3072, dropout=0.0, activation="gelu",
                                             batch_first=True)
    net = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).eval()
    for param in net.parameters():  # the 12 layers are copies of one: each its own weights
        if param.dim() > 1:
            torch.nn.init.xavier_uniform_(param)
        else:
            torch.nn.init.normal_(param, std=0.02)
    folder.mkdir(parents=True, exist_ok=True)
    x = torch.randn(1, seq, 768)
    torch.onnx.export(net, (x,), str(folder / "model.onnx"), input_names=["x"],
                      output_names=["y"], opset_version=17, dynamo=False)
    double = torch.nn.TransformerEncoder(layer, 12, enable_nested_tensor=False).eval()
    double.load_state_dict(net.state_dict())
    double = double.double()
    rng = np.random.default_rng(0)
    for i in range(pairs):
        feed = rng.standard_normal((1, seq, 768)).astype(np.float32)
        with torch.no_grad():
            ref = double(torch.from_numpy(feed).double()).float().numpy()
        pair = folder / "validation" / f"pair-{i:03d}"
        pair.mkdir(parents=True, exist_ok=True)
        write_tensors(pair / "inputs.arrow", {"x": feed})
        write_tensors(pair / "references.arrow", {"y": ref})
    (folder / "release.toml").write_text(ENCODER_SPEC)
    return folder / "release.toml"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("spec", type=Path, help="a release spec, or with --make-encoder the folder "
                   "to write the encoder's model, validation set and spec into")
    p.add_argument("--make-encoder", action="store_true",
                   help="write a BERT-base-sized encoder to SPEC (a folder) and stop")
    p.add_argument("--route", default="", help="the single-stream winner's route")
    p.add_argument("--bound-ms", type=float)
    p.add_argument("--percentile", type=float, default=99.0)
    p.add_argument("--kind", choices=("server", "offline"), default="server")
    p.add_argument("--duration-s", type=float, default=3.0)
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--min-queries", type=int, default=300,
                   help="each LoadGen run's minimum query count (a p99 over fewer than 100 is "
                        "the maximum)")
    p.add_argument("--min-effect", type=float, default=0.05)
    p.add_argument("--configs", default="", metavar="SxT[xB],...",
                   help="serving configurations to try (sessions x threads each [x the most "
                        "queries per call]), e.g. 2x1 or 1x0x8; default 2x1,1x1,2x2")
    p.add_argument("--aa", type=int, default=0, metavar="N",
                   help="instead: N decisions of the single-stream winner against an identical "
                        "copy of itself (how often an A/A ships a difference)")
    p.add_argument("--out", type=Path)
    p.add_argument("--smoke", action="store_true", help="tiny settings (seconds)")
    args = p.parse_args(argv)
    if args.make_encoder:
        print(make_encoder(args.spec))
        return 0
    if args.out is None or (args.kind == "server" and args.bound_ms is None):
        p.error("--out is required, and --bound-ms for the server scenario (the bound before "
                "any run)")

    from dossier.backends import get_backend
    from dossier.fingerprint import matrix_units
    from dossier.routes import Route
    from dossier.scenario import BATCH_KNOB, SESSIONS_KNOB, ScenarioSection
    from dossier.scenarios.child import ScenarioRequest
    from dossier.scenarios.decide import decide
    from dossier.scenarios.models import AA, RunSettings
    from dossier.scenarios.search import start_rate
    from dossier.spec import load_spec
    from dossier.validation import load_validation_set

    if args.smoke:
        args.duration_s, args.repetitions, args.steps, args.min_queries = 0.3, 2, 2, 20
    spec = load_spec(args.spec)
    bound = {"latency_ms": args.bound_ms, "percentile": args.percentile} \
        if args.kind == "server" else {}
    scenario = ScenarioSection(kind=args.kind, **bound, duration_s=args.duration_s,
                               min_queries=args.min_queries, search_steps=args.steps,
                               processes=args.repetitions, run_timeout_s=120)
    command = "python bench/scenario.py " + " ".join(
        a if " " not in a and a else repr(a) for a in (argv if argv is not None else sys.argv[1:]))
    doc: dict[str, Any] = {
        "command": command, "commit": _commit(), "host_cpu": matrix_units(),
        "cores": os.cpu_count(), "started": dt.datetime.now(dt.timezone.utc).isoformat(),
        "host_note": "a shared 2-core CPU host, busy at times: the load averages before and "
                     "after are recorded",
        "bound_chosen_before_measuring": bound or None,
        "scenario": scenario.model_dump(mode="json"), "load_before": _load()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")  # the bound, before any run

    backend = get_backend(spec.tune.backend)
    winner = Route.parse(args.route)
    with tempfile.TemporaryDirectory(prefix="dossier-scenario-") as tmp:
        engine = Path(tmp) / f"engine{backend.engine_suffix}"
        started = time.monotonic()
        backend.build(spec.model_path(), winner, engine)
        doc["build_s"] = round(time.monotonic() - started, 2)

        def request(route: Route, sessions: int) -> ScenarioRequest:
            return ScenarioRequest(
                source="engine", path=str(engine), backend=backend.name, route=route.text(),
                validation=str(spec.resolve(spec.validation.path)), sessions=sessions,
                settings=RunSettings(kind="server", qps=1, duration_s=1, max_duration_s=1))

        base_name = "single-stream winner (1 session, default threads)"
        candidates = []
        configs = [tuple(int(n) for n in c.split("x")) for c in args.configs.split(",")] \
            if args.configs else CONFIGS
        for sessions, threads, *batch in configs:
            knobs = {**winner.as_dict(), SESSIONS_KNOB: str(sessions),
                     "intra_op_num_threads": str(threads)}
            name = f"{sessions} sessions x {threads} threads"
            if batch and batch[0] > 1:
                knobs[BATCH_KNOB] = str(batch[0])
                name += f", batches of up to {batch[0]}"
            candidates.append((name, request(Route.of(knobs), sessions)))
        runner = backend.load(engine, winner)  # a first rate: from one inference's time
        feeds = [p.inputs for p in load_validation_set(spec.resolve(spec.validation.path)).pairs]
        times = []
        for i in range(60):
            t0 = time.perf_counter()
            runner.run(feeds[i % len(feeds)])
            times.append((time.perf_counter() - t0) * 1e3)
        runner.close()
        single = statistics.median(times[10:])
        doc["single_ms_before"] = round(single, 4)
        started = time.monotonic()
        if args.aa:  # A/A: the candidate is the baseline itself, N decisions
            decisions = []
            for n in range(args.aa):
                one = decide(scenario, (base_name, request(winner, 1)),
                             [("identical copy", request(winner, 1))],
                             Path(tmp) / f"aa-{n:02d}", min_effect=args.min_effect, alpha=0.05,
                             confidence=0.95, start_qps=start_rate(single, 1, os.cpu_count() or 1),
                             progress=lambda line: print(line, file=sys.stderr, flush=True))
                decisions.append({"shipped": one.shipped, "readings": {
                    r.name: r.metric_qps for r in one.readings},
                    "verdicts": [v.model_dump(mode="json") for v in one.verdicts]})
                print(f"A/A {n + 1}/{args.aa}: {one.shipped}", file=sys.stderr, flush=True)
            doc["measure_s"] = round(time.monotonic() - started, 1)
            doc["aa"] = decisions
            doc["aa_shipped_a_difference"] = sum(d["shipped"] != base_name for d in decisions)
            doc["load_after"] = _load()
            args.out.write_text(json.dumps(doc, indent=2) + "\n")
            return 0
        out = decide(scenario, (base_name, request(winner, 1)), candidates, Path(tmp) / "runs",
                     min_effect=args.min_effect, alpha=0.05, confidence=0.95,
                     start_qps=start_rate(single, 1, os.cpu_count() or 1),
                     progress=lambda line: print(line, file=sys.stderr, flush=True))
        doc["measure_s"] = round(time.monotonic() - started, 1)
    doc["load_after"] = _load()
    doc["shipped"] = out.shipped
    doc["decision"] = out.model_dump(mode="json", exclude={"readings": {"__all__": {"results"}}})
    doc["side_by_side"] = {
        name: {"qps_per_repetition": out.reading(name).metric_qps,
               "p99_ms_at_metric": [
                   (r.at_metric().run.latency_ms("99.00") if r.at_metric() and
                    r.at_metric().run else None) for r in out.reading(name).results],
               "loadgen_result_at_metric": [
                   (r.at_metric().run.loadgen_result if r.at_metric() and r.at_metric().run
                    else None) for r in out.reading(name).results],
               "single_ms": [next((q.single_ms for q in r.probes if q.single_ms), None)
                             for r in out.reading(name).results],
               "probes": [[_probe(q, args.percentile) for q in r.probes]
                          for r in out.reading(name).results]}
        for name in (base_name, AA, *(n for n, _ in candidates))}
    print(json.dumps({"shipped": out.shipped, **{n: v["qps_per_repetition"]
                                                 for n, v in doc["side_by_side"].items()}},
                     indent=1), file=sys.stderr)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
