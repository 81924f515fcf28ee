"""Steps of the H200 benchmark; ``run.sh`` calls them. Each writes one JSON record and records
a failure instead of raising, so the next step still runs.

::

    steps.py env    --json FILE
    steps.py eager  --work W --configs a,b --json FILE [--device cuda] [--no-compile]
    steps.py tune   --work W --config C --strategy S --json FILE [--aa] [--timeout S] [--no-fresh]
    steps.py aa     --work W --config C --reps N --json FILE [--timeout S]
    steps.py calib  --work W --config C --reps N --json FILE [--timeout S]
    steps.py fresh  --run RUN_DIR --json FILE
    steps.py bundle --run RUN_DIR --out DIR --json FILE [--timeout S]
    steps.py serve  --run RUN_DIR --out DIR --json FILE [--timeout S]
    steps.py first  --bundle BUNDLE --json FILE
    steps.py merge  --dir DIR --out FILE [--tag TAG]

``eager`` times the model in PyTorch eager and under ``torch.compile`` (default mode) with
dossier's timing procedure (warm-up until stable, then samples; CUDA events). ``tune`` runs
``dossier tune`` (the CLI, in a child process with a timeout) and then, in another fresh
process, re-measures the shipped route (or the best admissible one when nothing shipped)
against the baseline. ``aa`` repeats the A/A spec (two values that build the same kernels)
with one inductor cache shared by the repetitions and dossier's build cache (the first
repetition builds, the others take its engines: the measurement and the decision are what is
tested). ``calib`` repeats the calibration spec the same way and re-measures every shipped gain
independently (coverage of the recorded interval).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from dossier.run_folder import CACHE_NAME  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _failure(exc: BaseException) -> dict:
    return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
            "traceback": traceback.format_exc(limit=6)}


def _spec_folder(work: Path, config: str) -> Path:
    """The config's spec folder, written by make_specs (here and now when it is missing)."""
    folder = work / "specs" / config
    if not (folder / "meta.json").is_file():
        sys.path.insert(0, str(BENCH_DIR))
        import make_specs

        table = {**make_specs.CONFIGS, **make_specs.TINY_CONFIGS}
        factory, batch = table[config]
        tiny = config in make_specs.TINY_CONFIGS
        import torch

        device = os.environ.get("BENCH_DEVICE", "cuda" if torch.cuda.is_available() else "cpu")
        ref = "cuda" if torch.cuda.is_available() else "cpu"
        make_specs.write_config(work, config, factory, batch, device=device, ref_device=ref,
                                dtype=os.environ.get("BENCH_DTYPE", "bfloat16"), pairs=2,
                                tiny=tiny, force=False)
    return folder


# ------------------------------------------------------------------------------------ env
def step_env() -> dict:
    """What the benchmark ran on."""
    rec: dict[str, Any] = {"step": "env", "python": platform.python_version(),
                           "machine": platform.machine(), "cpus": os.cpu_count()}
    try:
        import torch

        rec["torch"] = torch.__version__
        rec["torch_cuda"] = torch.version.cuda
        rec["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            rec["gpu"] = torch.cuda.get_device_name(0)
            rec["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
            rec["cudnn"] = torch.backends.cudnn.version()
    except Exception as exc:  # noqa: BLE001
        rec["torch_error"] = str(exc)
    from importlib import metadata

    installed = {d.metadata["Name"].lower(): d.version for d in metadata.distributions()}
    for pkg in ("pydantic", "pyarrow", "xxhash", "typer", "rich", "scipy", "triton",
                "torchvision", "transformers"):
        rec[pkg] = installed.get(pkg)
    smi = shutil.which("nvidia-smi")
    if smi:
        out = subprocess.run([smi, "--query-gpu=name,driver_version,clocks.max.sm,"  # noqa: S603
                              "power.limit", "--format=csv,noheader"], capture_output=True,
                             text=True, check=False, timeout=30)
        rec["nvidia_smi"] = out.stdout.strip()
    out = subprocess.run(["g++", "--version"], capture_output=True, text=True,  # noqa: S607
                         check=False)
    rec["gxx"] = (out.stdout.splitlines() or [""])[0]
    rec["ok"] = True
    return rec


# ------------------------------------------------------------------------------------ eager
def _event_timer(torch: Any, device: str) -> Callable[[Callable[[], Any]], float]:
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def timed(fn: Callable[[], Any]) -> float:
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))
    else:
        def timed(fn: Callable[[], Any]) -> float:
            t0 = time.perf_counter_ns()
            fn()
            return (time.perf_counter_ns() - t0) / 1e6
    return timed


def _eager_one(work: Path, config: str, device: str, with_compile: bool) -> dict:
    import torch

    from dossier.backends.torch_inductor.model import signature_from_dict, wrap_module
    from dossier.measure.timing import flatten, sample_rounds, summarize, warm_up
    from dossier.spec import load_spec
    from dossier.validation import judge, load_validation_set
    from samples import torch_models

    folder = _spec_folder(work, config)
    meta = json.loads((folder / "meta.json").read_text())
    spec = load_spec(folder / "release.toml")
    timing = spec.timing
    factory = torch_models.FACTORIES[meta["factory"]]
    sig_dict = torch_models.fixed_signature(factory.signature, meta["batch"])  # type: ignore[attr-defined]
    sig = signature_from_dict(sig_dict, config)
    vset = load_validation_set(folder / "validation")
    names = [t.name for t in sig.inputs]
    args = [tuple(torch.from_numpy(p.inputs[n]).to(device) for n in names) for p in vset.pairs]
    module = wrap_module(factory().eval().to(device), meta["dtype"], sig)
    timer = _event_timer(torch, device)
    rec: dict[str, Any] = {"config": config, "batch": meta["batch"], "dtype": meta["dtype"],
                           "device": device, "metric": spec.tune.metric}

    def measure(fn: Callable[..., Any], label: str) -> None:
        with torch.no_grad():
            outs = {}
            for p, a in zip(vset.pairs, args):
                flat = fn(*a)
                outs[p.name] = {t.name: o.detach().float().cpu().numpy()
                                for t, o in zip(sig.outputs, flat)}
            acc = judge(outs, vset, spec.tune.metric, spec.tune.threshold)

            def one(_i: int) -> float:
                return sum(timer(functools.partial(fn, *a)) for a in args)

            warm = warm_up(one, timing, 1)
            samples = flatten(sample_rounds([lambda: one], timing, 1)[0])[0]
        s = summarize(samples, timing.confidence, warm)
        rec[label] = {"timing": s.model_dump(), "worst_loss": acc.worst,
                      "admissible": bool(acc), "samples_ms": [round(x, 5) for x in samples]}

    measure(module, "eager")
    if with_compile:
        _compiled(torch, module, args, device, measure, rec, "compile", {})
        _compiled(torch, module, args, device, measure, rec, "reduce_overhead",
                  {"mode": "reduce-overhead"})
    del module
    if device == "cuda":
        torch.cuda.empty_cache()
    rec["ok"] = True
    return rec


def _compiled(torch: Any, module: Any, args: list, device: str, measure: Callable,
              rec: dict, label: str, options: dict) -> None:
    """torch.compile(module, **options) from a cold inductor cache, timed like the engines."""
    from dossier.backends.torch_inductor import build_cache

    with build_cache():  # a cold inductor cache, as each dossier build gets
        compiled = torch.compile(module, **options)
        t0 = time.perf_counter()
        with torch.no_grad():
            compiled(*args[0])
        if device == "cuda":
            torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
        measure(compiled, label)
    rec[label]["compile_s"] = round(compile_s, 2)
    rec[label]["options"] = options
    torch._dynamo.reset()


def step_eager(work: Path, configs: list[str], device: str, with_compile: bool,
               timeout: float, json_path: Path) -> dict:
    """Eager and torch.compile timings per config (the record is rewritten after each)."""
    records: list[dict] = []
    t_start = time.perf_counter()
    out: dict[str, Any] = {"step": "eager", "records": records, "ok": False}
    for config in configs:
        if timeout - (time.perf_counter() - t_start) < 45:
            records.append({"config": config, "ok": False, "skipped": "time budget"})
            continue
        t0 = time.perf_counter()
        try:
            rec = _eager_one(work, config, device, with_compile)
        except Exception as exc:  # noqa: BLE001 - record and go on
            rec = {"config": config, **_failure(exc)}
        rec["wall_s"] = round(time.perf_counter() - t0, 2)
        records.append(rec)
        out["ok"] = all(r.get("ok") for r in records)
        _write(json_path, out)
        print(f"eager {config}: {'ok' if rec.get('ok') else rec.get('error')}", file=sys.stderr)
    return out


# ------------------------------------------------------------------------------------ tune
def run_summary(run_dir: Path) -> dict:
    """What a run folder's tuning cache says: trials, decision, wall time (no raw samples)."""
    from dossier.cache import TuningCache

    cache = TuningCache.open(run_dir / CACHE_NAME, repair=True)
    h = cache.header
    trials = []
    for t in cache.trials:
        c, s = t.comparison, t.timing
        trials.append({
            "index": t.index, "route": t.route, "role": t.role, "outcome": t.outcome.value,
            "reason": (t.reason or "")[:300] or None, "build_s": t.build_s,
            "trial_s": round(t.trial_s, 2), "worst_loss": t.worst_loss,
            "admissible": t.admissible, "faster": t.faster,
            "timing": s.model_dump() if s else None,
            "baseline_timing": c.baseline.model_dump() if c else None,
            "speedup": c.speedup if c else None,
            "speedup_ci": [c.speedup_ci_low, c.speedup_ci_high] if c else None,
            "p_value": c.p_value if c else None, "significant": c.significant if c else None,
            "slower": c.slower if c else None,
            "normalized_digest": t.extra.get("normalized_digest"),
            "build_cache": t.extra.get("build_cache"),
            "phases_s": {k: round(v, 2) for k, v in t.phases_s.items()},
        })
    knobs = None
    if (run_dir / "knobs.json").is_file():
        knobs = json.loads((run_dir / "knobs.json").read_text())
    d = cache.decision
    return {"selection": h.selection, "strategy": h.strategy, "baseline_route": h.baseline_route,
            "timing_settings": h.timing.model_dump(), "metric": h.metric,
            "threshold": h.threshold, "host": h.host,
            "routes_measured": sum(1 for t in cache.trials if t.role != "confirm"),
            "builds": sum(1 for t in cache.trials if t.role != "confirm" and t.build_s),
            "build_s_sum": round(sum(t.build_s or 0.0 for t in cache.trials), 2),
            "search_wall_s": round(sum(s.wall_s for s in cache.sessions), 2),
            "interrupted": any(s.interrupted for s in cache.sessions) or d is None,
            "decision": d.model_dump() if d else None, "trials": trials, "knob_database": knobs}


def _tune_once(spec: Path, strategy: str, run_dir: Path, timeout: float,
               env: dict[str, str] | None = None, build_cache: Path | None = None) -> dict:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cmd = [sys.executable, "-m", "dossier_cli.main", "tune", str(spec), "--strategy", strategy,
           "--out", str(run_dir), "--json", "--quiet"]
    if build_cache is not None:
        cmd += ["--build-cache", str(build_cache)]
    if os.environ.get("BENCH_BUILD_JOBS"):
        cmd += ["--build-jobs", os.environ["BENCH_BUILD_JOBS"]]
    rec: dict[str, Any] = {"run_dir": str(run_dir), "command": " ".join(cmd)}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True,  # noqa: S603
                              timeout=timeout, env={**os.environ, **(env or {})}, check=False)
        rec["rc"] = proc.returncode
        rec["stderr_tail"] = proc.stderr[-3000:]
        rec["stdout_tail"] = proc.stdout[-2000:]
    except subprocess.TimeoutExpired as exc:
        rec["rc"] = None
        rec["timeout"] = f"killed after {timeout:.0f} s"
        rec["stderr_tail"] = (exc.stderr or b"")[-3000:].decode("utf-8", "replace") \
            if isinstance(exc.stderr, bytes) else str(exc.stderr or "")[-3000:]
    rec["wall_s"] = round(time.perf_counter() - t0, 2)
    if (run_dir / CACHE_NAME).is_file():
        try:
            rec.update(run_summary(run_dir))
        except Exception as exc:  # noqa: BLE001
            rec["summary_error"] = f"{type(exc).__name__}: {exc}"
    rec["ok"] = rec.get("rc") == 0 and rec.get("decision") is not None
    return rec


def _fresh_subprocess(run_dir: Path, timeout: float) -> dict:
    out = run_dir / "fresh.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "fresh", "--run", str(run_dir),
           "--json", str(out)]
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True,  # noqa: S603
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"fresh re-measurement killed after {timeout:.0f} s"}
    if out.is_file():
        return json.loads(out.read_text())
    return {"ok": False, "error": f"exit {proc.returncode}: {proc.stderr[-1500:]}"}


def step_tune(work: Path, config: str, strategy: str, aa: bool, timeout: float,
              fresh: bool, tag: str) -> dict:
    """One ``dossier tune`` of a config, then the fresh-process re-measurement."""
    rec: dict[str, Any] = {"step": "tune", "config": config, "strategy": strategy, "aa": aa}
    t_start = time.perf_counter()
    try:
        folder = _spec_folder(work, config)
        spec = folder / ("release-aa.toml" if aa else "release.toml")
        if strategy == "full" and not aa and (folder / "release-full.toml").is_file():
            spec = folder / "release-full.toml"
        rec["spec"] = spec.name
        run_dir = work / "runs" / tag / f"{config}-{strategy}{'-aa' if aa else ''}"
        rec.update(_tune_once(spec, strategy, run_dir, timeout * 0.85 if fresh else timeout))
        left = timeout - (time.perf_counter() - t_start)
        if fresh and rec.get("decision") and left > 20:
            rec["fresh"] = _fresh_subprocess(run_dir, left)
    except Exception as exc:  # noqa: BLE001 - record and go on
        rec.update(_failure(exc))
    return rec


def _best_target(cache: Any) -> tuple[Any, str] | tuple[None, str]:
    d = cache.decision
    search = {t.route: t for t in cache.trials if t.role == "search" and t.admissible}
    if d is not None and d.gain and d.shipped_route in search:
        return search[d.shipped_route], "shipped"
    if d is not None and d.runner_up_route in search:
        return search[d.runner_up_route], "best_admissible"
    ok = [t for t in search.values() if t.comparison is not None]
    if ok:
        return max(ok, key=lambda t: t.comparison.speedup), "best_admissible"
    return None, "none"


def step_fresh(run_dir: Path) -> dict:
    """Re-measure the shipped (or best admissible) route against the baseline in new measuring
    processes: the procedure of the confirmation and of ``verify --rebench``
    (:mod:`dossier.measure.confirmation`, ``confirm_processes`` processes, each with the baseline, its
    A/A load and the route), and say whether the reading falls inside the prediction interval
    the search recorded for a new process (``inside_prediction``) and inside its confidence
    interval (``speedup_inside_ci``)."""
    import numpy as np

    from dossier.backends import get_backend
    from dossier.cache import TuningCache
    from dossier.jobs import measuring
    from dossier.measure import confirmation
    from dossier.measure.timing import flatten, summarize

    cache = TuningCache.open(run_dir / CACHE_NAME, repair=True)
    h = cache.header
    timing = h.timing
    base = next(t for t in cache.trials if t.role == "baseline")
    target, kind = _best_target(cache)
    rec: dict[str, Any] = {"step": "fresh", "run_dir": str(run_dir), "target": kind,
                           "procedure": "independent"}
    if target is None or not base.engine or not target.engine:
        return {**rec, "ok": True, "note": "no admissible route besides the baseline"}
    confirm = next((t for t in cache.trials if t.role == "confirm" and t.route == target.route),
                   None)
    ref = confirm or target
    backend = get_backend(h.backend)
    b_path, t_path = run_dir / base.engine, run_dir / target.engine
    env: dict[str, str] = {**backend.loader_env(b_path), **backend.loader_env(t_path)}
    t0 = time.perf_counter()
    measure = measuring.local_processes(h.backend, Path(h.validation_path), timing,
                                        builder=dict(h.builder), shapes=h.shapes,
                                        work=run_dir / ".work" / "fresh", env=env)
    result = confirmation.confirm((b_path, h.baseline_route), [(t_path, target.route)], timing,
                                  measure, fixed=max(timing.confirm_processes, 2))
    track = result.candidates[0]
    comp = track.comparison
    assert comp is not None
    fresh_base = summarize(flatten(result.aa.baseline)[0], timing.confidence)
    fresh_target = summarize(flatten(track.samples)[0], timing.confidence)
    rc, rt = ref.comparison, ref.timing
    pred = [rc.prediction_low, rc.prediction_high] if rc else [None, None]
    rec.update({
        "route": target.route, "reference": "confirm" if confirm else "screening",
        "fresh_speedup": comp.speedup, "fresh_speedup_ci": [comp.speedup_ci_low,
                                                              comp.speedup_ci_high],
        "fresh_p_value": comp.p_value, "fresh_faster": comp.faster,
        "fresh_processes": comp.processes, "fresh_process_speedups": comp.process_speedups,
        "fresh_wall_s": round(time.perf_counter() - t0, 2),
        "fresh_block_medians_ms": [float(np.median(b)) for b in track.samples],
        "fresh_median_ms": fresh_target.median_ms, "fresh_baseline_median_ms": fresh_base.median_ms,
        "tuned_speedup": rc.speedup if rc else None,
        "tuned_speedup_ci": [rc.speedup_ci_low, rc.speedup_ci_high] if rc else None,
        "tuned_prediction": pred,
        "tuned_median_ci_ms": [rt.ci_low_ms, rt.ci_high_ms] if rt else None,
        "tuned_baseline_median_ci_ms": [rc.baseline.ci_low_ms, rc.baseline.ci_high_ms] if rc else None,
        "inside_prediction": bool(pred[0] is not None and pred[1] is not None
                                  and pred[0] <= comp.speedup <= pred[1]),
        "speedup_inside_ci": bool(rc and rc.speedup_ci_low <= comp.speedup <= rc.speedup_ci_high),
        "median_inside_ci": bool(rt and rt.ci_low_ms <= fresh_target.median_ms <= rt.ci_high_ms),
        "baseline_median_inside_ci": bool(
            rc and rc.baseline.ci_low_ms <= fresh_base.median_ms <= rc.baseline.ci_high_ms),
        "ok": True,
    })
    return rec


# ------------------------------------------------------------------------------------ A/A
def build_cache_dir(work: Path, config: str) -> Path:
    """The dossier build cache shared by this machine's searches of ``config`` (``dossier tune
    --build-cache``): repeated searches build each route once and spend their time measuring."""
    folder = work / "build-cache" / config
    folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder


def _repeat(prefix: str, work: Path, tag: str, reps: int, timeout: float, rec: dict,
            once: Callable[[int, float], None]) -> None:
    """Run ``once(i, seconds_left)`` for ``reps`` repetitions numbered on after the earlier
    steps' runs of this tag (``prefix-NN``), while the time left allows one more (judged by the
    slowest repetition after the first, which builds)."""
    t0 = time.perf_counter()
    per_rep = 0.0
    first = len(list((work / "runs" / tag).glob(f"{prefix}-[0-9][0-9]")))
    for i in range(first, first + reps):
        left = timeout - (time.perf_counter() - t0)
        if left < max(30.0, 1.2 * per_rep):
            rec["stopped"] = f"time budget: {i - first} of {reps} repetitions ran"
            break
        r0 = time.perf_counter()
        once(i, left)
        if i > first:
            per_rep = max(per_rep, time.perf_counter() - r0)


def _rep_row(i: int, run: dict) -> dict[str, Any]:
    """What every repeated search records: its outcome, decision, error and build-cache hits."""
    d = run.get("decision") or {}
    return {"rep": i, "ok": run.get("ok"), "wall_s": run.get("wall_s"), "gain": d.get("gain"),
            "speedup": d.get("speedup"),
            "speedup_ci": [d.get("speedup_ci_low"), d.get("speedup_ci_high")],
            "confirm_processes": (run.get("timing_settings") or {}).get("confirm_processes"),
            "error": None if run.get("ok") else (run.get("timeout")
                                                 or run.get("stderr_tail", "")[-500:]),
            "build_cache_hits": sum(1 for t in run.get("trials", [])
                                    if t.get("build_cache") == "hit")}


def step_aa(work: Path, config: str, reps: int, timeout: float, tag: str) -> dict:
    """Repeat the A/A spec ``reps`` times (fast strategy, shared warm inductor cache, and the
    dossier build cache: the first repetition builds, the others take its engines and measure)."""
    from dossier.backends.torch_inductor import CACHE_ENV

    rec: dict[str, Any] = {"step": "aa", "config": config, "reps_planned": reps, "runs": []}
    t0 = time.perf_counter()
    try:
        folder = _spec_folder(work, config)
        cache_dir = work / "inductor-cache" / f"aa-{config}"
        env = {CACHE_ENV: str(cache_dir)}

        def once(i: int, left: float) -> None:
            run = _tune_once(folder / "release-aa.toml", "fast",
                             work / "runs" / tag / f"{config}-aa-{i:02d}", left, env,
                             build_cache_dir(work, config))
            search = [t for t in run.get("trials", []) if t["role"] == "search"]
            rec["runs"].append({
                **_rep_row(i, run),
                "screened_faster": bool(search and search[0]["faster"]),
                "screened_slower": bool(search and search[0]["slower"]),
                "screened_speedup": search[0]["speedup"] if search else None,
                "screened_p": search[0]["p_value"] if search else None,
            })

        _repeat(f"{config}-aa", work, tag, reps, timeout, rec, once)
        done = [r for r in rec["runs"] if r["ok"]]
        rec["reps_done"] = len(done)
        rec["no_gain"] = sum(1 for r in done if r["gain"] is False)
        rec["screened_faster"] = sum(1 for r in done if r["screened_faster"])
        rec["ok"] = bool(done)
    except Exception as exc:  # noqa: BLE001 - record and go on
        rec.update(_failure(exc))
    rec["wall_s"] = round(time.perf_counter() - t0, 2)
    return rec


# ---------------------------------------------------------------------------- calibration
FRESH_REPS = int(os.environ.get("BENCH_FRESH_REPS", "2"))
"""How many of a calibration step's shipped gains are re-measured by :func:`step_fresh` (each
costs a confirmation's worth of processes). Every repetition's confirmation is itself a
re-measurement in new processes of the same engines, so the next repetition's reading is
checked against this one's prediction interval too (``_confirm_reading``)."""


def _confirm_reading(run_dir: Path) -> dict | None:
    """The candidate's confirmation reading of a calibration search: speedup, interval,
    prediction interval, processes, p and level, the A/A's reading, the wall time."""
    from dossier.cache import TuningCache

    if not (run_dir / CACHE_NAME).is_file():  # the search failed before it wrote one
        return None
    cache = TuningCache.open(run_dir / CACHE_NAME, repair=True)
    d = cache.decision
    rows = [t for t in cache.trials if t.role == "confirm" and t.comparison is not None]
    cand = [t for t in rows if d is None or t.route != d.baseline_route]
    aa = [t for t in rows if d is not None and t.route == d.baseline_route]
    if not cand:
        return None
    # the last reading of each route (a confirmation re-run whole after a kill), the shipped
    # one or else the fastest
    last = list({t.route: t for t in cand}.values())
    shipped = [t for t in last if d is not None and d.gain and t.route == d.shipped_route]
    pick = shipped[0] if shipped else max(
        last, key=lambda t: t.comparison.speedup if t.comparison else 0.0)
    c = pick.comparison
    a = aa[-1].comparison if aa else None
    assert c is not None
    return {"route": pick.route, "candidates": len(last), "speedup": c.speedup,
            "ci": [c.speedup_ci_low, c.speedup_ci_high],
            "prediction": [c.prediction_low, c.prediction_high], "p_value": c.p_value,
            "level": c.level, "processes": c.processes, "process_speedups": c.process_speedups,
            "status": pick.extra.get("confirmation"), "wall_s": pick.trial_s,
            "phases_s": {k: round(v, 3) for k, v in pick.phases_s.items()},
            "aa": None if a is None else {"speedup": a.speedup,
                                          "ci": [a.speedup_ci_low, a.speedup_ci_high],
                                          "p_value": a.p_value}}


REPEATED = {"calib": "release-calib.toml", "release": "release.toml"}
"""The repeated searches' specs: the calibration spec (``-cuda_graph=[off|on]``) and the
search spec ``fast`` runs (five knobs for ResNet-50, four for BERT)."""


def step_calib(work: Path, config: str, reps: int, timeout: float, tag: str,
               step: str = "calib") -> dict:
    """Repeat a spec (``step``: ``calib``, the calibration spec, one knob that makes a real
    difference; ``release``, the ``fast`` search over every knob) ``reps`` times with the build
    cache, each a fresh ``dossier tune``; after each search that ships a gain (up to
    ``BENCH_FRESH_REPS``), re-measure the shipped route against the baseline with the
    independent procedure (:func:`step_fresh`) and say whether that reading falls inside the
    95% interval the search recorded."""
    from dossier.backends.torch_inductor import CACHE_ENV

    rec: dict[str, Any] = {"step": step, "config": config, "reps_planned": reps, "runs": []}
    t0 = time.perf_counter()
    try:
        folder = _spec_folder(work, config)
        env = {CACHE_ENV: str(work / "inductor-cache" / f"aa-{config}")}

        def once(i: int, left: float) -> None:
            run_dir = work / "runs" / tag / f"{config}-{step}-{i:02d}"
            run = _tune_once(folder / REPEATED[step], "fast", run_dir, left * 0.8, env,
                             build_cache_dir(work, config))
            d = run.get("decision") or {}
            row: dict[str, Any] = {**_rep_row(i, run), "shipped_route": d.get("shipped_route"),
                                   "cuda_graph": "-cuda_graph=on" in (d.get("shipped_route")
                                                                      or "").split()
                                   if d.get("gain") else False,
                                   "reason": d.get("reason")}
            row["confirmation"] = _confirm_reading(run_dir)
            if d.get("gain") and sum(1 for r in rec["runs"] if r.get("fresh")) < FRESH_REPS:
                try:
                    f = step_fresh(run_dir)
                    row["fresh"] = {k: f.get(k) for k in (
                        "route", "reference", "fresh_speedup", "fresh_speedup_ci",
                        "fresh_p_value", "tuned_speedup", "tuned_speedup_ci",
                        "tuned_prediction", "inside_prediction", "fresh_processes",
                        "fresh_process_speedups", "fresh_wall_s", "speedup_inside_ci")}
                except Exception as exc:  # noqa: BLE001 - record and go on
                    row["fresh"] = _failure(exc)
            rec["runs"].append(row)

        _repeat(f"{config}-{step}", work, tag, reps, timeout, rec, once)
        done = [r for r in rec["runs"] if r["ok"]]
        shipped = [r for r in done if r["gain"]]
        checked = [r for r in shipped if (r.get("fresh") or {}).get("fresh_speedup") is not None]
        rec.update(reps_done=len(done), shipped=len(shipped), remeasured=len(checked),
                   inside=sum(1 for r in checked if r["fresh"]["speedup_inside_ci"]),
                   remeasure_excludes_one=sum(1 for r in checked
                                              if r["fresh"]["fresh_speedup_ci"][0] > 1.0),
                   ok=bool(done))
    except Exception as exc:  # noqa: BLE001 - record and go on
        rec.update(_failure(exc))
    rec["wall_s"] = round(time.perf_counter() - t0, 2)
    return rec


# ------------------------------------------------------------------------- process variance
def _cli(args: list[str], timeout: float, keep: int = 6000) -> dict:
    cmd = [sys.executable, "-m", "dossier_cli.main", *args]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True,  # noqa: S603
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"command": " ".join(args), "rc": None, "error": f"killed after {timeout:.0f} s"}
    return {"command": " ".join(args), "rc": proc.returncode, "stdout": proc.stdout[-keep:],
            "stderr": proc.stderr[-2000:], "wall_s": round(time.perf_counter() - t0, 2)}


def _shipped_run(run_dir: Path) -> Path:
    """``run_dir`` itself when it exists; else, of the repeated searches ``<run_dir>-NN`` of this
    tag (e.g. ``resnet50_b1-calib``), the last that shipped a gain, or the last that finished."""
    if run_dir.exists():
        return run_dir
    from dossier.cache import TuningCache

    finished = []
    for folder in sorted(run_dir.parent.glob(f"{run_dir.name}-[0-9][0-9]")):
        try:
            d = TuningCache.open(folder / CACHE_NAME, repair=True).decision
        except Exception:  # noqa: BLE001 - an unfinished or broken run is not a candidate
            continue
        if d is not None:
            finished.append((bool(d.gain), folder))
    if not finished:
        raise FileNotFoundError(f"no finished search at {run_dir} or {run_dir.name}-NN")
    shipped = [f for gain, f in finished if gain]
    return (shipped or [f for _, f in finished])[-1]


def _bundled(run_dir: Path, suffix: str, timeout: float) -> tuple[dict, Path | None]:
    """``dossier bundle`` of ``run_dir`` into a fresh ``<run_dir>-<suffix>`` folder: the
    command's record and the bundle made (None when it made none)."""
    folder = run_dir.parent / f"{run_dir.name}-{suffix}"
    if folder.exists():
        shutil.rmtree(folder)
    made = _cli(["bundle", str(run_dir), "--out", str(folder), "--json"], timeout)
    found = sorted(folder.glob("*.dossier"))
    return made, (found[0] if made["rc"] == 0 and found else None)


def step_bundle(run_dir: Path, out: Path, timeout: float) -> dict:
    """Bundle a finished search (:func:`_shipped_run` picks one of a repeated step's runs),
    verify the bundle here (integrity, environment, the shipped engine's accuracy re-checked,
    and ``--rebench``: the independent re-measurement), explain it as HTML into ``out``."""
    t0 = time.perf_counter()
    run_dir = _shipped_run(run_dir)
    rec: dict[str, Any] = {"step": "bundle", "run_dir": str(run_dir)}
    rec["bundle"], bundle = _bundled(run_dir, "bundle", timeout)
    if bundle is None:
        rec["ok"] = False
        return rec
    rec["bundle_path"] = bundle.name
    rec["bundle_mb"] = round(sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
                             / 2**20, 1)
    rec["inspect"] = _cli(["inspect", str(bundle)], timeout)
    left = timeout - (time.perf_counter() - t0)
    rec["verify"] = _cli(["verify", str(bundle), "--recheck", "--rebench", "--json"], left,
                         keep=10**7)
    try:
        rec["verify_report"] = json.loads(rec["verify"].pop("stdout"))
    except (KeyError, json.JSONDecodeError):
        rec["verify_report"] = None
    html = out / f"{run_dir.name}.report.html"
    rec["explain"] = _cli(["explain", str(bundle), "--html", str(html)],
                          max(timeout - (time.perf_counter() - t0), 30))
    rec["html"] = html.name if html.is_file() else None
    rec["ok"] = rec["verify"].get("rc") == 0 and rec["html"] is not None
    rec["wall_s"] = round(time.perf_counter() - t0, 2)
    return rec


# ---------------------------------------------------------------------------------- serving
def step_first(bundle: Path) -> dict:
    """In this (fresh) process: ``bench/first_inference.py``'s ``first`` (import dossier, torch
    apart with ``BENCH_IMPORT_TORCH=1``, ``dossier.load``, the first call, a second); the
    figure of ``aoti_load_package`` this is compared with timed the call alone."""
    sys.path.insert(0, str(REPO_ROOT / "bench"))
    from first_inference import first

    return {"step": "first", **first(bundle, import_torch=os.environ.get("BENCH_IMPORT_TORCH")
                                     == "1"), "ok": True}


def step_serve(run_dir: Path, out: Path, timeout: float, firsts: int = 3,
               rounds: int = 20) -> dict:
    """Serve what was measured, on this machine (issue 26): bundle a finished search
    (:func:`_shipped_run`), then ``firsts`` fresh processes of :func:`step_first` (time to
    first inference after ``dossier.load``) and bench/load_parity.py on the bundle (the served
    engine against the tuner's procedure, torch tensors on the GPU)."""
    t0 = time.perf_counter()
    run_dir = _shipped_run(run_dir)
    rec: dict[str, Any] = {"step": "serve", "run_dir": str(run_dir), "firsts": []}
    made, bundle = _bundled(run_dir, "served", timeout)
    if bundle is None:
        return {**rec, "bundle": made, "ok": False}
    rec["bundle_path"] = bundle.name
    for i in range(2 * firsts):  # torch imported by dossier.load, then imported before it
        file = out / f"first-{run_dir.name}-{i}.json"
        p0 = time.perf_counter()
        proc = subprocess.run([sys.executable, str(Path(__file__)), "first", "--bundle",  # noqa: S603
                               str(bundle), "--json", str(file)], capture_output=True,
                              text=True, timeout=max(timeout - (time.perf_counter() - t0), 30),
                              check=False,
                              env={**os.environ, "BENCH_IMPORT_TORCH": str(int(i >= firsts))})
        row = _read_record(file) if file.is_file() else {"ok": False,
                                                          "stderr": proc.stderr[-2000:]}
        row["process_wall_s"] = round(time.perf_counter() - p0, 3)
        rec["firsts"].append(row)
    parity = out / f"load-parity-{run_dir.name}.json"
    left = timeout - (time.perf_counter() - t0)
    try:
        proc = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "load_parity.py"),  # noqa: S603
                               "--bundle", str(bundle), "--rounds", str(rounds), "--samples",
                               str(rounds * 20), "--out", str(parity)], capture_output=True,
                              text=True, timeout=max(left, 30), check=False)
        rec["parity"] = (_read_record(parity) if parity.is_file()
                         else {"ok": False, "stderr": proc.stderr[-3000:]})
    except subprocess.TimeoutExpired:
        rec["parity"] = {"ok": False, "error": "timed out"}
    ttfi = [r.get("time_to_first_inference_s") for r in rec["firsts"]
            if r.get("ok") and r.get("import_torch_s") is None]
    rec["time_to_first_inference_s"] = sorted(ttfi)
    rec["ok"] = bool(ttfi) and "results" in rec["parity"]
    rec["wall_s"] = round(time.perf_counter() - t0, 2)
    return rec


# ------------------------------------------------------------------------------------ merge
def _read_record(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return {"step": path.stem, "ok": False, "error": f"unreadable: {exc}"}


def step_merge(folder: Path, out: Path, tag: str) -> dict:
    """Every step record of one run.sh invocation, in order, as one file."""
    records = []
    for path in sorted(folder.glob("*.json")):
        records.append(_read_record(path))
    data = {"format": "dossier-bench-h200/1", "tag": tag, "steps": records}
    _write(out, data)
    return data


# ------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    default_work = REPO_ROOT / "bench" / "work" / "h200"
    for name in ("env", "eager", "tune", "aa", "calib", "release", "fresh", "bundle", "serve",
                 "first", "merge"):
        p = sub.add_parser(name)
        if name != "merge":
            p.add_argument("--json", type=Path, required=True)
        if name in ("eager", "tune", "aa", "calib", "release"):
            p.add_argument("--work", type=Path, default=default_work)
            p.add_argument("--timeout", type=float, default=540.0)
            p.add_argument("--tag", default="manual")
        if name == "eager":
            p.add_argument("--configs", required=True)
            p.add_argument("--device", default=os.environ.get("BENCH_DEVICE", "cuda"))
            p.add_argument("--no-compile", action="store_true")
        if name in ("tune", "aa", "calib", "release"):
            p.add_argument("--config", required=True)
        if name == "tune":
            p.add_argument("--strategy", required=True, choices=("fast", "mixed", "full"))
            p.add_argument("--aa", action="store_true")
            p.add_argument("--no-fresh", action="store_true")
        if name in ("aa", "calib", "release"):
            p.add_argument("--reps", type=int, default=10)
        if name in ("fresh", "bundle", "serve"):
            p.add_argument("--run", type=Path, required=True)
        if name == "first":
            p.add_argument("--bundle", type=Path, required=True)
        if name in ("bundle", "serve"):
            p.add_argument("--out", type=Path, required=True)
            p.add_argument("--timeout", type=float, default=300.0)
        if name == "merge":
            p.add_argument("--dir", type=Path, required=True)
            p.add_argument("--out", type=Path, required=True)
            p.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    try:
        if args.cmd == "env":
            rec = step_env()
        elif args.cmd == "eager":
            rec = step_eager(args.work, [c for c in args.configs.split(",") if c], args.device,
                             not args.no_compile, args.timeout, args.json)
        elif args.cmd == "tune":
            rec = step_tune(args.work, args.config, args.strategy, args.aa, args.timeout,
                            not args.no_fresh, args.tag)
        elif args.cmd == "aa":
            rec = step_aa(args.work, args.config, args.reps, args.timeout, args.tag)
        elif args.cmd in REPEATED:
            rec = step_calib(args.work, args.config, args.reps, args.timeout, args.tag, args.cmd)
        elif args.cmd == "fresh":
            try:
                rec = step_fresh(args.run)
            except Exception as exc:  # noqa: BLE001
                rec = {"step": "fresh", **_failure(exc)}
        elif args.cmd == "bundle":
            rec = step_bundle(args.run, args.out, args.timeout)
        elif args.cmd == "serve":
            rec = step_serve(args.run, args.out, args.timeout)
        elif args.cmd == "first":
            rec = step_first(args.bundle)
        else:
            step_merge(args.dir, args.out, args.tag)
            return 0
    except Exception as exc:  # noqa: BLE001 - a step never takes the benchmark down
        rec = {"step": args.cmd, **_failure(exc)}
    rec.setdefault("step_wall_s", round(time.perf_counter() - t0, 2))
    _write(args.json, rec)
    return 0 if rec.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
