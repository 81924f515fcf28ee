"""Parity of ``dossier.load``: an engine served through it runs at the latency the tuner
measures for the same engine (ONNX Runtime samples on CPU; any bundle with ``--bundle``, such as
an AOTInductor CUDA-graph bundle on the H200).

1. Builds the samples (samples/build.py), tunes each ONNX Runtime sample with a small
   selection and writes its bundle (the shipped engine is whatever the rule ships); or takes
   the bundles given with ``--bundle``.
2. Times two engines in the tuner's own procedure (:func:`dossier.measure.timing.sample_rounds`: rounds
   of one block per engine, which goes first alternating; each engine loaded afresh for its
   block where the backend asks for it, as ONNX Runtime does, else loaded once and kept, as
   the tuner's worker does):
   - ``served``: ``dossier.load(bundle)`` (verification, then the backend's production load),
     a sample being one pass of ``engine(inputs)`` over every validation pair, timed around the
     call (its input checks and lock included): on CPU by ``perf_counter_ns``; on a GPU by CUDA
     events around the call with torch tensors on the device in and out, as the tuner's runner
     times (a serving process on a GPU keeps its tensors there);
   - ``tuner``: the shipped engine loaded by the backend as the tuner's worker loads it, timed
     by the worker's own timer (:func:`dossier.jobs.worker._timers` over ``timing_groups("pairs")``: one pass over every pair).
3. Compares them with :func:`dossier.measure.timing.compare` (tuner as the baseline): the ratio
   served / tuner is 1 / speedup, with the exact signed-rank interval over rounds. The target:
   the ratio within [0.97, 1.03]. Also the bundle's recorded latency of the shipped route, for
   reference (a different process and time).

Writes bench/results/load-parity.json (``--out``). ``--smoke`` runs a few rounds only (a CI
smoke run; its numbers mean nothing).

    python bench/load_parity.py [--rounds 30] [--samples 600] [--bundle B ...] [--smoke]
                                [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SELECTIONS = {
    "convnet": "-graph_optimization_level=[all|disable_all]",
    "tblock": "-graph_optimization_level=[all|basic]",
}
"""A small search per sample: the bundle, not the search, is what is measured."""
TARGET = (0.97, 1.03)


def _samples(out: Path) -> Path:
    spec_file = ROOT / "samples" / "build.py"
    module_spec = importlib.util.spec_from_file_location("samples_build", spec_file)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules["samples_build"] = module
    module_spec.loader.exec_module(module)
    module.build_all(out)
    return out


def _bundle(samples: Path, name: str, work: Path, tiny: bool) -> Path:
    from dossier.bundle import write_bundle
    from dossier.measure.timing import TimingSettings
    from dossier.spec import load_spec
    from dossier.tuner import tune

    spec = load_spec(samples / name / "release.toml",
                     {"strategy": "full", "selection": SELECTIONS[name]})
    if tiny:
        spec = spec.model_copy(update={"timing": TimingSettings(
            samples=12, rounds=6, block_warmup=1, warmup_window=2, warmup_min_runs=1,
            warmup_max_s=0.2, confirm_top=1, confirm_rounds=3,
            confirm_warmup=2, confirm_runs=5, confirm_block_s=0.05, confirm_processes=2,
            confirm_max_processes=2)})
    tune(spec, work / f"run-{name}")
    return write_bundle(work / f"run-{name}", work / "out").path


def _parity(bundle: Path, rounds: int, samples: int) -> dict[str, Any]:
    import numpy as np

    import dossier
    from dossier.backends import get_backend
    from dossier.bundle import read_bundle
    from dossier.jobs.worker import _timers
    from dossier.measure.timing import TimingSettings, compare, flatten, sample_rounds, summarize
    from dossier.routes import Route
    from dossier.validation import load_validation_set

    b = read_bundle(bundle)
    m = b.manifest
    shipped = m.engines.shipped
    vset = load_validation_set(bundle / "validation")
    backend = get_backend(m.backend)
    settings = TimingSettings(rounds=rounds, samples=samples, block_warmup=20)
    loads: list[float] = []

    runner_device = ""
    feeds: list[Any] = [p.inputs for p in vset.pairs]
    first = backend.load(bundle / shipped.path, Route.parse(shipped.route))  # the tuner's
    device = str(getattr(first, "device", "cpu"))
    cuda = device.startswith("cuda") and first.takes_tensors
    if cuda:  # the serving process keeps its tensors on the device, as the tuner's runner does
        import torch

        feeds = [{n: torch.from_numpy(np.ascontiguousarray(v)).to(device)
                  for n, v in p.inputs.items()} for p in vset.pairs]
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        runner_device = device

    def served_timer(engine: Any) -> Any:
        def one(_i: int) -> float:
            total = 0.0
            for feed in feeds:
                if cuda:
                    start.record()
                    engine(feed)
                    end.record()
                    end.synchronize()
                    total += float(start.elapsed_time(end))
                else:
                    t = time.perf_counter_ns()
                    engine(feed)
                    total += (time.perf_counter_ns() - t) / 1e6
            return total

        return one

    def load_served() -> Any:
        t0 = time.perf_counter()
        engine = dossier.load(bundle)
        loads.append(time.perf_counter() - t0)
        return engine

    def load_tuner() -> Any:
        return backend.load(bundle / shipped.path, Route.parse(shipped.route))

    if backend.traits.reload_per_block:  # loaded afresh for every block, as the tuner does
        first.close()

        def served() -> Any:
            return served_timer(load_served())

        def tuner() -> Any:
            return _timers(load_tuner(), vset.timing_groups("pairs"))
    else:  # loaded once and kept, as the tuner's worker does
        kept_served, kept_tuner = served_timer(load_served()), _timers(first, vset.timing_groups("pairs"))

        def served() -> Any:
            return kept_served

        def tuner() -> Any:
            return kept_tuner

    for fn in (served(), tuner()):  # warm both once (imports, first sessions), untimed
        for i in range(20):
            fn(i)
    t0 = time.perf_counter()
    base_rounds, served_rounds = sample_rounds([tuner, served], settings, 1)
    wall = time.perf_counter() - t0
    comp = compare(base_rounds, served_rounds, settings)
    s_served = summarize(flatten(served_rounds)[0], settings.confidence)
    s_tuner = summarize(flatten(base_rounds)[0], settings.confidence)
    recorded = next((t.timing for t in reversed(b.tuning_cache().trials)
                     if t.route == shipped.route and t.timing), None)
    ratio, lo, hi = 1 / comp.speedup, 1 / comp.speedup_ci_high, 1 / comp.speedup_ci_low
    return {
        "bundle": m.name, "backend": m.backend, "device": runner_device or "cpu",
        "route": shipped.route, "pairs": len(vset.pairs),
        "loaded": "per block" if backend.traits.reload_per_block else "once, kept",
        "ratio_served_to_tuner": round(ratio, 4), "ratio_ci95": [round(lo, 4), round(hi, 4)],
        "within_target": TARGET[0] <= lo and hi <= TARGET[1],
        "median_within_target": TARGET[0] <= ratio <= TARGET[1],
        "p_value": comp.p_value, "rounds": comp.rounds,
        "samples_per_engine": len(flatten(served_rounds)[0]),
        "round_ratios_served_to_tuner": [round(1 / r, 4) for r in comp.round_ratios or []],
        "served_ms": {"median": s_served.median_ms, "ci95": [s_served.ci_low_ms,
                                                             s_served.ci_high_ms],
                      "n": s_served.n},
        "tuner_ms": {"median": s_tuner.median_ms, "ci95": [s_tuner.ci_low_ms, s_tuner.ci_high_ms],
                     "n": s_tuner.n},
        "recorded_ms": None if recorded is None else {
            "median": recorded.median_ms, "ci95": [recorded.ci_low_ms, recorded.ci_high_ms],
            "n": recorded.n},
        "ratio_served_to_recorded": None if recorded is None else round(
            s_served.median_ms / recorded.median_ms, 4),
        "load_s_median": round(float(np.median(loads)), 4), "loads": len(loads),
        "wall_s": round(wall, 1)}


def _line(name: str, r: dict[str, Any]) -> str:
    return (f"{name}: served/tuner {r['ratio_served_to_tuner']:.4f} "
            f"[{r['ratio_ci95'][0]:.4f}, {r['ratio_ci95'][1]:.4f}] over {r['rounds']} "
            f"rounds, {r['samples_per_engine']} samples each; served "
            f"{r['served_ms']['median']:.3f} ms, tuner {r['tuner_ms']['median']:.3f} ms"
            + (f", recorded {r['recorded_ms']['median']:.3f} ms" if r["recorded_ms"] else ""))


def main() -> None:
    from bench.provenance import provenance

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--samples", type=int, default=600, help="timed samples per engine")
    ap.add_argument("--smoke", "--tiny", action="store_true", dest="smoke",
                    help="a smoke run (CI): few rounds, numbers meaningless")
    ap.add_argument("--sample", action="append", choices=sorted(SELECTIONS),
                    help="only these samples (default: every ONNX Runtime sample)")
    ap.add_argument("--bundle", action="append", type=Path, default=[],
                    help="measure this bundle instead of tuning the samples (repeatable)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    made = provenance()
    rounds, samples = (4, 40) if args.smoke else (args.rounds, args.samples)
    out = args.out or (ROOT / "bench" / "results" / ("load-parity-smoke.json" if args.smoke
                                                     else "load-parity.json"))
    results = []
    with tempfile.TemporaryDirectory(prefix="dossier-load-parity-") as tmp:
        if args.bundle:
            for bundle in args.bundle:
                results.append(_parity(bundle, rounds, samples))
                print(_line(bundle.name, results[-1]))
        else:
            built = _samples(Path(tmp) / "samples")
            for name in args.sample or sorted(SELECTIONS):
                results.append(_parity(_bundle(built, name, Path(tmp), args.smoke), rounds,
                                       samples))
                print(_line(name, results[-1]))
    result = {
        "benchmark": "dossier.load parity: an engine served through dossier.load against the "
                     "same engine in the tuner's timing procedure",
        "procedure": "dossier.measure.timing.sample_rounds over [tuner, served], each loaded afresh "
                     "per block where the backend reloads per block, else once and kept; "
                     "dossier.measure.timing.compare with the tuner as the baseline; "
                     "ratio = served / tuner latency = 1 / speedup",
        "provenance": made, "target": list(TARGET), "smoke": args.smoke, "rounds": rounds,
        "samples_per_engine": samples,
        "host": {"machine": platform.machine(), "python": platform.python_version(),
                 "cpus": os.cpu_count()},
        "results": results}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
