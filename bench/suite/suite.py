"""The workload suite: per configuration (architecture x batch), a fresh ``dossier release`` of a
fast spec, then the served engine (``dossier.load``) against eager PyTorch and ``torch.compile``
in its modes, timed side by side in one process.

::

    suite.py specs   --work W --config C --json FILE [--device cuda] [--tiny]
    suite.py release --work W --config C --json FILE [--spec release.toml] [--timeout S]
    suite.py compare --work W --config C --json FILE [--spec release.toml]
                     [--modes eager,default,reduce-overhead,max-autotune] [--timeout S]
                     [--ma-min-s 150]
    suite.py run     --work W --configs C1,C2 --out DIR --tag T --deadline S
                     [--mat C3,C4] [--pin C5,C6] [--only-pin C7] [--only-base C8]
                     [--together] [--modes ...] [--ma-min-s 150] [--device cuda] [--tiny]

A configuration is ``<arch>_b<batch>`` (``models.ARCHS``; ``vit_b16_b32``). ``specs`` writes
``W/specs/C/``: ``model.pt2`` (bf16 inside a float32 interface), ``validation/`` (two pairs,
float64 eager references), ``release.toml`` (the fast spec: ``freezing`` and ``cuda_graph``,
two builds), ``release-mat.toml`` (``max_autotune`` and ``cuda_graph``: the knob that
matters at large batch, builds of minutes), ``release-base.toml`` (``cuda_graph`` pinned
``off``: one route, the AOTInductor default route, whatever it measures) and, on a GPU,
``release-cg.toml`` (``cuda_graph`` pinned ``on``: one route, the CUDA-graph route, whatever
it measures; its build is the fast release's default build, from the build cache when the fast
release ran first). ``release`` runs ``dossier release`` (the CLI, a
child process) into a fresh folder with the configuration's build cache and records the shipped
route, its speedup over the AOTInductor default route with the interval, the builds and the
wall time. ``compare`` loads the bundle with ``dossier.load`` and times it beside eager and
each ``torch.compile`` mode (:func:`timed_side_by_side`): the one plain procedure, wall clock
per call (the call, then ``torch.cuda.synchronize()``), rounds in which every contender runs
one block in rotating order; each ratio is the Hodges-Lehmann estimate over rounds of the
block-median ratio with its exact 95% interval (``dossier.measure.timing.shift_interval``). A profile
of each contender (kernels per call, kernel time per call, against the wall time; each timed
call's wall time split on the host's and the GPU's timeline, :func:`split_calls`) says where a
slower one loses. ``run`` does the three steps per configuration within a deadline and writes
``OUT/suite-TAG.json`` (every record), ``OUT/suite-TAG.log`` and ``OUT/caches-suite-TAG.tar.gz``
(the releases' tuning caches). ``--mat`` and ``--pin`` name the configurations that also release
``release-mat.toml`` and ``release-cg.toml``; their engines are served beside the fast
release's as ``dossier-mat`` and ``dossier-cg``. ``--only-pin`` and ``--only-base`` name
configurations released with one of the one-route specs alone (no fast release: one build, one
route), its engine served as ``dossier-cg`` or ``dossier-base``; with ``--together`` (every
configuration so named) the specs are written first, the one-route releases run at once (their
builds share the machine and its GPU, which one engine's build paid for with a slower Triton
kernel in the suite's sixth round; a one-route release decides nothing, but its own reading is
taken beside the others' builds) and each comparison then runs alone.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
for p in (REPO_ROOT, HERE, REPO_ROOT / "bench" / "h200"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import models  # noqa: E402

BATCHES = (1, 32)
FAST_KNOBS = "-inductor:freezing=[false|true] -cuda_graph=[off|on]"
"""The fast spec's varied knobs: two builds (cuda_graph is a load-time knob, its route reuses
the baseline's engine), three routes under ``fast``."""
MAT_KNOBS = "-inductor:max_autotune=[false|true] -cuda_graph=[off|on]"
"""The max_autotune spec: the baseline's build (from the build cache after the fast release)
and one max_autotune build."""
CG_KNOBS = "-cuda_graph=on"
"""The CUDA-graph spec: ``cuda_graph`` pinned, nothing varied, so the baseline (the only route)
is the CUDA-graph route and ships whatever it measures; a GPU only (a CPU's ``cuda_graph``
allows ``off`` alone)."""
BASE_KNOBS = "-cuda_graph=off"
"""The default-route spec: ``cuda_graph`` pinned ``off``, nothing varied, so its one route is
the AOTInductor default route (the fast spec's baseline) and ships whatever it measures."""
NO_CG = ("no release-cg.toml: a CPU package has no CUDA graph (the backend's cuda_graph knob "
         "allows only off on a CPU)")
MODES = ("eager", "default", "reduce-overhead", "max-autotune")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
SERVED = "dossier"
SERVED_MAT = "dossier-mat"
SERVED_CG = "dossier-cg"
SERVED_BASE = "dossier-base"
SPECS = {"release.toml": "", "release-mat.toml": "-mat", "release-cg.toml": "-cg",
         "release-base.toml": "-base"}
"""Spec file -> the suffix of its release folder and step name."""
EXTRA_SERVED = {SERVED_MAT: ("release-mat.toml", "served_mat"),
                SERVED_CG: ("release-cg.toml", "served_cg"),
                SERVED_BASE: ("release-base.toml", "served_base")}
"""The engines of the other releases, served beside the fast release's: label -> (spec, the
record's key prefix)."""
ONE_ROUTE = {"release-cg.toml": SERVED_CG, "release-base.toml": SERVED_BASE}
"""The one-route specs a configuration can be released with alone (``run --only-pin``,
``--only-base``): spec -> the label its engine is served under."""
CALL_MARK = "suite::call"
CONTAINER_MARK = "suite::container_run"
"""``torch.profiler`` ranges of the profile pass: one timed call (the call, then the
synchronize), and inside a served call the AOTInductor package's own run."""
LAUNCH_APIS = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC",
               "cudaGraphLaunch", "cudaMemcpyAsync", "cudaMemsetAsync")
SYNC_APIS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")
CACHE_FILE = "tuning-cache.jsonl"


def parse_config(config: str) -> tuple[str, int]:
    """``vit_b16_b32`` -> ("vit_b16", 32); ValueError for anything else."""
    arch, _, batch = config.rpartition("_b")
    if arch not in models.ARCHS or not batch.isdigit() or int(batch) < 1:
        raise ValueError(f"unknown configuration {config!r}: <arch>_b<batch>, arch one of "
                         f"{', '.join(models.ARCHS)}")
    return arch, int(batch)


def all_configs() -> list[str]:
    return [f"{a}_b{b}" for b in BATCHES for a in models.ARCHS]


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _failure(exc: BaseException) -> dict:
    return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:3000],
            "traceback": traceback.format_exc(limit=8)[-4000:]}


# ------------------------------------------------------------------------------------ specs
def step_specs(work: Path, config: str, device: str, tiny: bool, force: bool = False) -> dict:
    """Write the configuration's folder (model, validation set, the specs)."""
    import torch

    from samples import torch_models

    arch, batch = parse_config(config)
    folder = work / "specs" / config
    meta_path = folder / "meta.json"
    source = hashlib.sha256((HERE / "models.py").read_bytes()).hexdigest()[:16]
    if meta_path.is_file() and not force:  # reused while the models' source is the same
        meta = json.loads(meta_path.read_text())
        if meta.get("ok") and meta.get("device") == device and meta.get("tiny") == tiny \
                and meta.get("models_source") == source:
            return {**meta, **write_specs(folder, config, device, tiny), "step": "specs",
                    "reused": True}
    folder.mkdir(parents=True, exist_ok=True)
    factory = models.factory(arch, tiny)
    sig = torch_models.fixed_signature(factory.signature, batch)  # type: ignore[attr-defined]
    ref_device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    torch_models.write_validation_set(factory, folder / "validation", [batch] * 2,
                                      models.SEEDS[arch] + batch, signature=sig,
                                      device=ref_device,
                                      extra={"config": config, "engine_dtype": "bfloat16"})
    ref_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch_models.export_factory(factory, folder / "model.pt2", signature=sig, dtype="bfloat16",
                                device=device)
    export_s = time.perf_counter() - t0
    meta = {"step": "specs", "config": config, "arch": arch, "batch": batch, "device": device,
            "tiny": tiny, "models_source": source, "reference_device": ref_device,
            "reference_s": round(ref_s, 2), "export_s": round(export_s, 2), "ok": True}
    meta.update(write_specs(folder, config, device, tiny))
    _write(meta_path, meta)
    return meta


def write_specs(folder: Path, config: str, device: str, tiny: bool) -> dict:
    """(Re)write the configuration's spec files (cheap: text); say which were written and why
    ``release-cg.toml`` was not."""
    import make_specs

    arch, batch = parse_config(config)
    timing = {**(make_specs.TINY_TIMING if tiny else make_specs.TIMING), "confirm_top": 1}
    pinned = f"-device={device} -dtype=bfloat16"
    what = f"{arch} batch {batch} bfloat16 on {device}"
    cuda = device.startswith("cuda")
    graphs = "" if cuda else " -cuda_graph=[off|on]"  # a CPU has no graphs
    specs = [("release.toml", FAST_KNOBS), ("release-mat.toml", MAT_KNOBS),
             ("release-base.toml", BASE_KNOBS)]
    if cuda:
        specs.append(("release-cg.toml", CG_KNOBS))
    else:
        (folder / "release-cg.toml").unlink(missing_ok=True)
    for name, knobs in specs:
        (folder / name).write_text(make_specs.spec_text(
            f"suite-{config}{SPECS[name]}", what, f"{pinned} {knobs.replace(graphs, '')}",
            timing, 1e-3), encoding="utf-8")
    return {"spec_files": [name for name, _ in specs], **({} if cuda else {"no_cg": NO_CG})}


# ---------------------------------------------------------------------------------- release
def _run_summary(run_dir: Path) -> dict:
    from steps import run_summary  # bench/h200/steps.py: what a run folder's cache says

    s = run_summary(run_dir)
    d = s.get("decision") or {}
    fresh_builds = sum(1 for t in s["trials"] if t["role"] != "confirm" and t["build_s"]
                       and t.get("build_cache") != "hit")
    confirmed = [t for t in s["trials"] if t["role"] == "confirm" and t["speedup"] is not None
                 and t["route"] != s["baseline_route"]]
    best = max(confirmed, key=lambda t: t["speedup"], default=None)
    return {"baseline_route": s["baseline_route"], "selection": s["selection"],
            "best_confirmed": None if best is None else {
                "route": best["route"], "speedup": best["speedup"], "ci": best["speedup_ci"]},
            "routes_measured": s["routes_measured"], "builds": s["builds"],
            "builds_fresh": fresh_builds, "build_s_sum": s["build_s_sum"],
            "search_wall_s": s["search_wall_s"], "gain": d.get("gain"),
            "shipped_route": d.get("shipped_route"), "speedup": d.get("speedup"),
            "speedup_ci": [d.get("speedup_ci_low"), d.get("speedup_ci_high")],
            "reason": d.get("reason"),
            "trials": [{k: t[k] for k in ("route", "role", "outcome", "reason", "build_s",
                                          "build_cache", "worst_loss", "speedup", "speedup_ci",
                                          "trial_s")}
                       | {"median_ms": (t["timing"] or {}).get("median_ms")}
                       for t in s["trials"]]}


def release_folder(work: Path, config: str, spec: str) -> Path:
    return work / "releases" / f"{config}{SPECS[spec]}"


def step_release(work: Path, config: str, spec: str, timeout: float) -> dict:
    """A fresh ``dossier release`` of the configuration's spec, with its build cache."""
    folder = work / "specs" / config
    out = release_folder(work, config, spec)
    if out.exists():
        shutil.rmtree(out)
    cache = work / "build-cache" / config
    cache.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    cmd = [sys.executable, "-m", "dossier_cli.main", "release", str(folder / spec), "--out",
           str(out), "--build-cache", str(cache), "--json", "--quiet"]
    if os.environ.get("BENCH_BUILD_JOBS"):
        cmd += ["--build-jobs", os.environ["BENCH_BUILD_JOBS"]]
    rec: dict[str, Any] = {"step": "release", "config": config, "spec": spec,
                           "command": " ".join(["dossier", *cmd[3:]])}
    if not (folder / spec).is_file():
        cpu = not str(_read(folder / "meta.json").get("device", "")).startswith("cuda")
        return {**rec, "ok": False, "skipped": NO_CG if spec == "release-cg.toml" and cpu
                else f"no {spec} in {folder}"}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True,  # noqa: S603
                              timeout=timeout, check=False)
        rec["rc"] = proc.returncode
        rec["stderr_tail"] = proc.stderr[-3000:]
    except subprocess.TimeoutExpired:
        rec["rc"] = None
        rec["error"] = f"killed after {timeout:.0f} s"
    rec["wall_s"] = round(time.perf_counter() - t0, 2)
    runs = sorted((out / ".runs").glob("*")) if (out / ".runs").is_dir() else []
    if runs and (runs[0] / CACHE_FILE).is_file():
        rec["run_dir"] = str(runs[0])
        try:
            rec.update(_run_summary(runs[0]))
        except Exception as exc:  # noqa: BLE001 - record and go on
            rec["summary_error"] = f"{type(exc).__name__}: {exc}"
    bundles = sorted(out.glob("*.dossier"))
    rec["bundle"] = str(bundles[0]) if bundles else None
    rec["ok"] = rec.get("rc") == 0 and rec["bundle"] is not None
    return rec


# ---------------------------------------------------------------------------------- compare
def ratio(baseline: list[list[float]], other: list[list[float]], confidence: float) -> dict:
    """How many times faster ``other`` is than ``baseline`` (samples per round of each, timed in
    the same rounds): the Hodges-Lehmann estimate over rounds of the block-median ratio, with
    its exact distribution-free interval, and the rounds' ratios."""
    import numpy as np

    from dossier.measure.timing import round_ratios, shift_interval

    r = round_ratios(baseline, other)
    est, lo, hi = shift_interval(np.log(r), confidence)
    return {"x": round(float(np.exp(est)), 4),
            "ci": [round(float(np.exp(lo)), 4), round(float(np.exp(hi)), 4)],
            "rounds": len(r)}


def timed_side_by_side(contenders: dict[str, Callable[[Any], Any]], args: list[Any],
                       sync: Callable[[], None], rounds: int, calls: int,
                       warmup: int = 10) -> dict[str, list[list[float]]]:
    """Wall clock per call (the call, then ``sync``) of every contender, in ``rounds`` rounds of
    one block of ``calls`` timed calls each (after ``warmup`` untimed), contenders in rotating
    order (:func:`dossier.measure.timing.sample_rounds`), inputs rotated over ``args``."""
    from dossier.measure.timing import TimingSettings, sample_rounds

    def timer(fn: Callable[[Any], Any]) -> Callable[[], Callable[[int], float]]:
        def one(i: int) -> float:
            t0 = time.perf_counter_ns()
            fn(args[i])
            sync()
            return (time.perf_counter_ns() - t0) / 1e6

        return lambda: one

    names = list(contenders)
    settings = TimingSettings(rounds=rounds, samples=rounds * calls, block_warmup=warmup)
    got = sample_rounds([timer(contenders[n]) for n in names], settings, len(args))
    return dict(zip(names, got))


def profile(fn: Callable[[Any], Any], args: list[Any], calls: int, cuda: bool) -> dict:
    """Kernels per call and kernel time per call (``torch.profiler``) and, for comparison, the
    wall time per call of back-to-back calls with one synchronize at the end; then, from the same
    profile, where each timed call's wall time goes (:func:`split_calls`): every call is the
    suite's timed unit (the call, then the synchronize) inside a ``suite::call`` range."""
    import torch
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for i in range(3):
        fn(args[i % len(args)])
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for i in range(calls):
        fn(args[i % len(args)])
    if cuda:
        torch.cuda.synchronize()
    streamed = (time.perf_counter_ns() - t0) / 1e6 / calls
    with torch_profile(activities=acts) as prof:
        for i in range(calls):
            with record_function(CALL_MARK):
                fn(args[i % len(args)])
                if cuda:
                    torch.cuda.synchronize()
    events = list(prof.events())
    kernels = [e for e in events if e.device_type.name == "CUDA"
               and not e.name.startswith("suite::")]  # not the ranges' GPU-side copies
    per: dict[str, list[float]] = {}
    for e in kernels:
        per.setdefault(e.name, []).append(e.device_time)
    top = sorted(per.items(), key=lambda kv: -sum(kv[1]))[:6]
    out: dict[str, Any] = {
        "calls": calls, "streamed_ms_per_call": round(streamed, 4),
        "kernels_per_call": round(len(kernels) / calls, 1),
        "kernel_ms_per_call": round(sum(e.device_time for e in kernels) / 1e3 / calls, 4),
        "top_kernels": [{"name": n[:120], "count_per_call": round(len(v) / calls, 1),
                         "ms_per_call": round(sum(v) / 1e3 / calls, 4)} for n, v in top]}
    try:
        out["split"] = split_calls(events, kernels)
    except Exception as exc:  # noqa: BLE001 - the split is a diagnosis of the diagnosis
        out["split"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    return out


def _union_us(spans: list[tuple[float, float]]) -> float:
    """The length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def split_calls(events: list[Any], kernels: list[Any]) -> dict:
    """Where a timed call's wall time goes, from one profile (``torch.profiler`` events, times in
    us on one clock for the host and the GPU; medians over the calls, in ms). On the timeline of
    each ``suite::call`` range: ``lead_ms`` from the call's start to its first kernel's start on
    the GPU (the host's path to the first launch, and that launch's latency), ``busy_ms`` the
    time some kernel runs, ``gaps_ms`` the GPU idle between the first kernel's start and the last
    one's end, ``tail_ms`` from the last kernel's end to the call's return (the synchronize
    returning). On the host: ``host_call_ms`` from the call's start to the synchronize's start
    (the host's own work per call, which overlaps the GPU's), within it ``container_ms`` (the
    AOTInductor package's run, for a served engine without a CUDA graph), ``launch_api_ms`` (the
    CUDA runtime's launch and copy calls) and ``untraced_ms`` (the call's own time outside every
    recorded operation: Python); ``host_top`` the recorded host events by self time per call
    (the profiler's own cost is in all of these)."""
    import numpy as np

    cpu = [e for e in events if e.device_type.name == "CPU"]
    marks = sorted((e for e in cpu if e.name == CALL_MARK), key=lambda e: e.time_range.start)
    if not marks:
        return {"error": "no suite::call ranges in the profile"}
    ks = sorted((k.time_range.start, k.time_range.end) for k in kernels)
    rows: dict[str, list[float]] = {}

    def put(key: str, us: float) -> None:
        rows.setdefault(key, []).append(us / 1e3)

    for m in marks:
        s, e = m.time_range.start, m.time_range.end
        inside = [c for c in cpu if c is not m and s <= c.time_range.start < e]
        syncs = [c.time_range.start for c in inside if c.name in SYNC_APIS]
        host_end = min(syncs) if syncs else e
        put("wall_ms", e - s)
        put("host_call_ms", host_end - s)
        put("container_ms", sum(c.time_range.end - c.time_range.start for c in inside
                                if c.name == CONTAINER_MARK))
        put("launch_api_ms", sum(c.time_range.end - c.time_range.start for c in inside
                                 if c.name in LAUNCH_APIS))
        traced = [(c.time_range.start, min(c.time_range.end, host_end)) for c in inside
                  if c.time_range.start < host_end and c.name not in SYNC_APIS]
        put("untraced_ms", max(0.0, (host_end - s) - _union_us(traced)))
        mine = [k for k in ks if s <= k[0] < e]
        if mine:
            first, last = mine[0][0], max(k[1] for k in mine)
            busy = _union_us(mine)
            put("lead_ms", first - s)
            put("busy_ms", busy)
            put("gaps_ms", (last - first) - busy)
            put("tail_ms", e - last)
    lo, hi = marks[0].time_range.start, marks[-1].time_range.end
    selfs = _self_times([c for c in cpu if c.name != CALL_MARK
                         and lo <= c.time_range.start <= hi])
    n = len(marks)
    return {"calls": n, **{k: round(float(np.median(v)), 4) for k, v in rows.items()},
            "host_top": [{"name": k[:80], "self_ms_per_call": round(v / 1e3 / n, 4)}
                         for k, v in sorted(selfs.items(), key=lambda kv: -kv[1])[:10]]}


def _self_times(events: list[Any]) -> dict[str, float]:
    """Self time (us) per event name: each event's duration less that of the events nested
    directly in it on its thread."""
    out: dict[str, float] = {}
    by_thread: dict[Any, list[Any]] = {}
    for e in events:
        by_thread.setdefault(getattr(e, "thread", 0), []).append(e)
    for evs in by_thread.values():
        stack: list[list[Any]] = []  # [end, name]
        for e in sorted(evs, key=lambda e: (e.time_range.start, -e.time_range.end)):
            start, end = e.time_range.start, e.time_range.end
            while stack and stack[-1][0] <= start:
                stack.pop()
            out[e.name] = out.get(e.name, 0.0) + (end - start)
            if stack:  # nested: not its parent's own time
                parent = stack[-1][1]
                out[parent] -= min(end, stack[-1][0]) - start
            stack.append([end, e.name])
    return out


class _Marked:
    """A callable run inside a ``torch.profiler`` range (the served engine's package run)."""

    def __init__(self, inner: Any, name: str) -> None:
        self.inner, self.name = inner, name

    def __call__(self, *args: Any) -> Any:
        from torch.profiler import record_function

        with record_function(self.name):
            return self.inner(*args)


def step_compare(work: Path, config: str, spec: str, modes: list[str], timeout: float,
                 json_path: Path, rounds: int = 20, calls: int = 0,
                 max_autotune_min_s: float = 150.0) -> dict:
    """The served engine against eager and ``torch.compile`` modes, one process. The record is
    rewritten after each stage, so a stage the timeout kills leaves the earlier ones; the
    max-autotune compile (minutes) comes last and the others are timed before it, and it is
    skipped when less than ``max_autotune_min_s`` is left. The served engine is ``spec``'s
    bundle: the fast release's as ``dossier``, a one-route spec's (``release-cg.toml``,
    ``release-base.toml``) under its own label (``dossier-cg``, ``dossier-base``); the other
    releases' bundles found in ``work`` are served beside it."""
    import numpy as np
    import torch

    import dossier
    from dossier.backends.torch_inductor.model import signature_from_dict, wrap_module
    from dossier.validation import judge, load_validation_set
    from samples import torch_models

    t_start = time.perf_counter()
    arch, batch = parse_config(config)
    folder = work / "specs" / config
    meta = json.loads((folder / "meta.json").read_text())
    device = meta["device"]
    cuda = device.startswith("cuda")
    bundles = sorted(release_folder(work, config, spec).glob("*.dossier"))
    factory = models.factory(arch, meta["tiny"])
    sig = signature_from_dict(torch_models.fixed_signature(
        factory.signature, batch), config)  # type: ignore[attr-defined]
    vset = load_validation_set(folder / "validation")
    names = [t.name for t in sig.inputs]
    args = [tuple(torch.from_numpy(np.ascontiguousarray(p.inputs[n])).to(device) for n in names)
            for p in vset.pairs]
    calls = calls or (50 if batch <= 8 else 20)
    primary = ONE_ROUTE.get(spec, SERVED)
    rec: dict[str, Any] = {"step": "compare", "config": config, "spec": spec,
                           "served_label": primary, "device": device,
                           "torch": torch.__version__, "procedure": (
                               f"one process; wall clock per call (call + synchronize); "
                               f"{rounds} rounds, each contender one block of {calls} timed "
                               f"calls after 10 untimed, in rotating order; inputs rotated over "
                               f"the {len(args)} validation pairs"),
                           "contenders": {}, "ok": False}
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    module = wrap_module(factory().to(device), "bfloat16", sig)
    fns: dict[str, Callable[[Any], Any]] = {}
    engines: dict[str, Any] = {}  # label -> the loaded engine (its package run is profiled)

    def accuracy(fn: Callable[[Any], Any]) -> dict:
        outs = {}
        for p, a in zip(vset.pairs, args):
            flat = fn(a)
            if isinstance(flat, dict):
                flat = [flat[t.name] for t in sig.outputs]
            outs[p.name] = {t.name: o.detach().float().cpu().numpy()
                            for t, o in zip(sig.outputs, flat)}
        acc = judge(outs, vset, "cos", 1e-3)
        return {"worst_loss": acc.worst, "admissible": bool(acc)}

    def add(label: str, make: Callable[[], Callable[[Any], Any]]) -> None:
        row: dict[str, Any] = {}
        rec["contenders"][label] = row
        try:
            t0 = time.perf_counter()
            with torch.no_grad():
                fn = make()
                fn(args[0])
                sync()
                row["first_call_s"] = round(time.perf_counter() - t0, 2)
                for i in range(5):  # reduce-overhead records its graphs on the next calls
                    fn(args[i % len(args)])
                sync()
                row["ready_s"] = round(time.perf_counter() - t0, 2)
                row.update(accuracy(fn))
            fns[label] = fn
            row["ok"] = True
        except Exception as exc:  # noqa: BLE001 - a mode that fails is a row with its reason
            row.update(_failure(exc))
        _write(json_path, rec)

    def compiled(mode: str) -> Callable[[], Callable[[Any], Any]]:
        def make() -> Callable[[Any], Any]:
            c = torch.compile(copy.deepcopy(module), **({} if mode == "default" else
                                                        {"mode": mode}))
            return lambda a: c(*a)
        return make

    def served(found: list[Path], key: str, label: str) -> Callable[[], Callable[[Any], Any]]:
        def make() -> Callable[[Any], Any]:
            if not found:
                raise FileNotFoundError(f"no bundle for {config}: the release did not finish")
            engine = dossier.load(found[0])
            engines[label] = engine
            rec[f"{key}_route"] = engine.route
            rec[f"{key}_bundle"] = found[0].name
            return lambda a: engine(dict(zip(names, a)))
        return make

    def measure(stage: str) -> None:
        with torch.no_grad():
            t0 = time.perf_counter()
            got = timed_side_by_side(fns, args, sync, rounds, calls)
            rec[f"{stage}_timing_s"] = round(time.perf_counter() - t0, 1)
        _summarise(rec, got, stage)
        if stage == "final":
            with torch.no_grad():
                rec["profile"] = {label: _profiled(fn, args, cuda, engines.get(label))
                                  for label, fn in fns.items()}
        rec["wall_s"] = round(time.perf_counter() - t_start, 1)
        _write(json_path, rec)

    add(primary, served(bundles, "served" if primary == SERVED else EXTRA_SERVED[primary][1],
                        primary))
    for label, (other, key) in EXTRA_SERVED.items():  # the other releases' engines beside it
        found = sorted(release_folder(work, config, other).glob("*.dossier"))
        if found and spec != other:
            add(label, served(found, key, label))
    for mode in modes:
        if mode == "eager":
            add("eager", lambda: (lambda a: module(*a)))
        elif mode != "max-autotune":
            add(mode, compiled(mode))
    if "max-autotune" in modes:
        measure("before_max_autotune")
        left = timeout - (time.perf_counter() - t_start)
        if left < max_autotune_min_s:
            rec["contenders"]["max-autotune"] = {
                "ok": False, "skipped": f"time budget: {left:.0f} s left, the compile needs "
                                       f"about {max_autotune_min_s:.0f} s"}
        else:
            add("max-autotune", compiled("max-autotune"))
    measure("final")
    rec["ok"] = primary in fns and len(fns) > 1
    _write(json_path, rec)
    return rec


def _profiled(fn: Callable[[Any], Any], args: list[Any], cuda: bool,
              engine: Any = None) -> dict:
    """:func:`profile`; for a served engine, its AOTInductor package's run inside a
    ``suite::container_run`` range (the runner's ``_compiled``, restored after)."""
    runner = getattr(engine, "_runner", None)
    inner = getattr(runner, "_compiled", None)
    try:
        if inner is not None:
            runner._compiled = _Marked(inner, CONTAINER_MARK)  # type: ignore[union-attr]
        return profile(fn, args, 20, cuda)
    except Exception as exc:  # noqa: BLE001 - the profile is a diagnosis only
        return _failure(exc)
    finally:
        if inner is not None:
            runner._compiled = inner  # type: ignore[union-attr]


def _summarise(rec: dict, got: dict[str, list[list[float]]], stage: str) -> None:
    """Medians per contender and the served engine's ratio over each (``x`` > 1: faster)."""
    from dossier.measure.timing import flatten, summarize

    table = {}
    for label, rounds in got.items():
        s = summarize(flatten(rounds)[0], 0.95)
        table[label] = {"median_ms": round(s.median_ms, 4),
                        "ci": [round(s.ci_low_ms, 4), round(s.ci_high_ms, 4)], "n": s.n,
                        "p10_ms": round(s.p10_ms, 4), "p90_ms": round(s.p90_ms, 4)}
    out: dict[str, Any] = {"ms_per_call": table}
    if SERVED in got:
        out["served_over"] = {label: ratio(rounds, got[SERVED], 0.95)
                              for label, rounds in got.items() if label != SERVED}
    for extra, (_, key) in EXTRA_SERVED.items():
        if extra in got:  # served_mat_over, served_cg_over, served_base_over
            out[f"{key}_over"] = {label: ratio(rounds, got[extra], 0.95)
                                  for label, rounds in got.items() if label != extra}
    modes = [m for m in COMPILE_MODES if m in got]
    if modes:
        best = min(modes, key=lambda m: table[m]["median_ms"])
        out["best_compile_mode"] = best
        if SERVED in got:
            out["served_over_best_compile"] = out["served_over"][best]
        for extra, (_, key) in EXTRA_SERVED.items():
            if extra in got:
                out[f"{key}_over_best_compile"] = out[f"{key}_over"][best]
    rec[stage] = out


# ------------------------------------------------------------------------------------ run
class Runner:
    """Steps in child processes within one deadline; every record merged into one file."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.start = time.monotonic()
        self.work: Path = args.work
        self.out: Path = args.out
        self.results = self.work / "results" / args.tag
        self.results.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = self.out / f"suite-{args.tag}.log"
        self.n = len(list(self.results.glob("*.json")))

    def left(self) -> float:
        return self.args.deadline - (time.monotonic() - self.start)

    def note(self, text: str) -> None:
        line = f"[{time.strftime('%H:%M:%S', time.gmtime())} +{time.monotonic() - self.start:.0f}s] {text}"
        print(line, file=sys.stderr, flush=True)
        with self.log.open("a", encoding="utf-8") as f:
            f.write(line + "\n")

    def step(self, name: str, need: float, argv: list[str], cap: float | None = None) -> dict:
        self.n += 1
        file = self.results / f"{self.n:02d}-{name}.json"
        left = self.left()
        if left < need:
            rec = {"step": name, "ok": False, "skipped": f"deadline: {left:.0f} s left, it "
                   f"needs {need:.0f} s"}
            _write(file, rec)
            self.note(f"skip {name}: {left:.0f} s left")
            self.merge()
            return rec
        budget = min(left - 10, cap or left)
        self.note(f"start {name} ({left:.0f} s left, {budget:.0f} s for it)")
        cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--json", str(file),
               "--timeout", str(int(budget - 10))]
        with self.log.open("a", encoding="utf-8") as log:
            try:
                proc = subprocess.run(cmd, cwd=REPO_ROOT, stdout=log, stderr=log,  # noqa: S603
                                      timeout=budget, check=False)
                rc: int | None = proc.returncode
            except subprocess.TimeoutExpired:
                rc = None
        rec = _read(file) if file.is_file() else {"step": name, "ok": False,
                                                  "error": f"exit {rc}, no record"}
        if rc is None:
            rec["killed"] = f"after {budget:.0f} s"
            _write(file, rec)
        self.note(f"end {name} rc={rc} ok={rec.get('ok')}")
        self.merge()
        return rec

    def merge(self) -> None:
        records = [_read(p) for p in sorted(self.results.glob("*.json"))]
        _write(self.out / f"suite-{self.args.tag}.json",
               {"format": "dossier-bench-suite/1", "tag": self.args.tag, "steps": records})
        with tarfile.open(self.out / f"caches-suite-{self.args.tag}.tar.gz", "w:gz") as tar:
            for cache in sorted((self.work / "releases").glob(f"*/.runs/*/{CACHE_FILE}")):
                tar.add(cache, arcname=str(cache.relative_to(self.work / "releases")))

    def steps_together(self, steps: list[tuple[str, float, list[str]]]) -> list[dict]:
        """Steps (name, seconds needed, argv) in child processes at once, within one budget;
        each record says which steps ran beside it (``beside``)."""
        left = self.left()
        need = max(n for _, n, _ in steps)
        files = []
        for name, _, _ in steps:
            self.n += 1
            files.append(self.results / f"{self.n:02d}-{name}.json")
        if left < need:
            for (name, _, _), file in zip(steps, files):
                _write(file, {"step": name, "ok": False,
                              "skipped": f"deadline: {left:.0f} s left, it needs {need:.0f} s"})
                self.note(f"skip {name}: {left:.0f} s left")
            self.merge()
            return [_read(f) for f in files]
        budget = left - 10
        names = [name for name, _, _ in steps]
        self.note(f"start {', '.join(names)} at once ({left:.0f} s left, {budget:.0f} s for them)")
        procs = []
        with self.log.open("a", encoding="utf-8") as log:
            for (_, _, argv), file in zip(steps, files):
                cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--json", str(file),
                       "--timeout", str(int(budget - 10))]
                procs.append(subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log,  # noqa: S603
                                              stderr=log))
            until = time.monotonic() + budget
            rcs = [_wait(proc, until) for proc in procs]
        recs = []
        for name, file, rc in zip(names, files, rcs):
            rec = _read(file) if file.is_file() else {"step": name, "ok": False,
                                                      "error": f"exit {rc}, no record"}
            rec["beside"] = [n for n in names if n != name]
            if rc is None:
                rec["killed"] = f"after {budget:.0f} s"
            _write(file, rec)
            self.note(f"end {name} rc={rc} ok={rec.get('ok')}")
            recs.append(rec)
        self.merge()
        return recs

    def specs(self, config: str) -> bool:
        a = self.args
        argv = ["specs", "--work", str(a.work), "--config", config, "--device", a.device]
        return bool(self.step(f"specs-{config}", 60, argv + (["--tiny"] if a.tiny else []),
                              cap=300).get("ok"))

    def compare(self, config: str, spec: str) -> None:
        a = self.args
        self.step(f"compare-{config}", 60, ["compare", "--work", str(a.work), "--config", config,
                                           "--spec", spec, "--modes", a.modes, "--rounds",
                                           str(a.rounds), "--ma-min-s", str(a.ma_min_s)],
                  cap=a.compare_cap_s)

    def run(self) -> int:
        a = self.args
        common = ["--work", str(a.work)]
        self.n += 1
        _write(self.results / f"{self.n:02d}-env.json", _env())
        configs = [c for c in a.configs.split(",") if c]
        only = only_specs(a.only_pin, a.only_base)
        if a.together:
            # one-route releases only: they decide nothing, so their builds may share the
            # machine; every comparison still runs alone, after them
            ready = [c for c in configs if self.specs(c)]
            if ready:
                self.steps_together([(f"release-{c}{SPECS[only[c]]}", a.release_min_s,
                                      ["release", *common, "--config", c, "--spec", only[c]])
                                     for c in ready])
            for config in ready:
                self.compare(config, only[config])
            self.note(f"done in {time.monotonic() - self.start:.0f} s")
            return 0
        for config in configs:
            if not self.specs(config):
                continue
            if config in only:  # that one-route release alone, its engine served
                self.step(f"release-{config}{SPECS[only[config]]}", a.release_min_s,
                          ["release", *common, "--config", config, "--spec", only[config]])
                self.compare(config, only[config])
                continue
            pin, mat = config in a.pin.split(","), config in a.mat.split(",")
            # the pinned release builds nothing of its own (the fast release's default build,
            # from the build cache): before the max_autotune release
            for spec in ["release.toml", *(["release-cg.toml"] if pin else []),
                         *(["release-mat.toml"] if mat else [])]:
                self.step(f"release-{config}{SPECS[spec]}",
                          a.release_min_s if spec != "release-cg.toml" else 45,
                          ["release", *common, "--config", config, "--spec", spec])
            self.compare(config, "release.toml")
        self.note(f"done in {time.monotonic() - self.start:.0f} s")
        return 0


def _wait(proc: subprocess.Popen, until: float) -> int | None:
    """The child's exit status, or None when it was killed at ``until`` (monotonic)."""
    try:
        return proc.wait(timeout=max(1.0, until - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def only_specs(only_pin: str, only_base: str) -> dict[str, str]:
    """Configuration -> the one-route spec it is released with alone (``--only-pin``: the
    CUDA-graph route, ``--only-base``: the default route); ValueError for one named twice."""
    pin = [c for c in only_pin.split(",") if c]
    base = [c for c in only_base.split(",") if c]
    both = sorted(set(pin) & set(base))
    if both:
        raise ValueError(f"{both} named in both --only-pin and --only-base")
    return {**dict.fromkeys(pin, "release-cg.toml"), **dict.fromkeys(base, "release-base.toml")}


def _read(path: Path) -> dict:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as exc:
        return {"step": path.stem, "ok": False, "error": f"unreadable: {exc}"}


def _env() -> dict:
    from steps import step_env

    return step_env()


# ------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    default_work = REPO_ROOT / "bench" / "work" / "suite"
    for name in ("specs", "release", "compare", "run"):
        p = sub.add_parser(name)
        p.add_argument("--work", type=Path, default=default_work)
        if name == "run":
            p.add_argument("--configs", required=True)
            p.add_argument("--out", type=Path, required=True)
            p.add_argument("--tag", required=True)
            p.add_argument("--deadline", type=float, default=540.0)
            p.add_argument("--mat", default="", help="configs that also release max_autotune")
            p.add_argument("--pin", default="", help="configs that also release the CUDA-graph "
                           "route pinned (release-cg.toml, a GPU only)")
            p.add_argument("--modes", default=",".join(MODES))
            p.add_argument("--rounds", type=int, default=20)
            p.add_argument("--device", default="cuda")
            p.add_argument("--tiny", action="store_true")
            p.add_argument("--only-pin", default="", help="configs released with the CUDA-graph "
                           "route pinned alone (release-cg.toml), its bundle served as dossier-cg")
            p.add_argument("--only-base", default="", help="configs released with the default "
                           "route pinned alone (release-base.toml), served as dossier-base")
            p.add_argument("--together", action="store_true", help="every config is named in "
                           "--only-pin or --only-base: all specs, then their one-route releases "
                           "at once, then each comparison alone")
            p.add_argument("--release-min-s", type=float, default=120.0)
            p.add_argument("--compare-cap-s", type=float, default=420.0)
            p.add_argument("--ma-min-s", type=float, default=150.0,
                           help="the time a comparison must have left to compile max-autotune")
            continue
        p.add_argument("--config", required=True)
        p.add_argument("--json", type=Path, required=True)
        p.add_argument("--timeout", type=float, default=540.0)
        if name == "specs":
            p.add_argument("--device", default="cuda")
            p.add_argument("--tiny", action="store_true")
            p.add_argument("--force", action="store_true")
        else:
            p.add_argument("--spec", default="release.toml",
                           choices=tuple(SPECS))
        if name == "compare":
            p.add_argument("--modes", default=",".join(MODES))
            p.add_argument("--rounds", type=int, default=20)
            p.add_argument("--calls", type=int, default=0, help="timed calls per block "
                           "(default: 50 at batch <= 8, else 20)")
            p.add_argument("--ma-min-s", type=float, default=150.0,
                           help="the time left under which max-autotune is not compiled")
    args = parser.parse_args(argv)
    if args.cmd == "run":
        only = only_specs(args.only_pin, args.only_base)  # ValueError: named twice
        configs = [c for c in args.configs.split(",") if c]
        if args.together and not all(c in only for c in configs):
            parser.error("--together: every config must be named in --only-pin or --only-base "
                         "(a release that decides between routes times alone)")
        return Runner(args).run()
    t0 = time.perf_counter()
    try:
        if args.cmd == "specs":
            rec = step_specs(args.work, args.config, args.device, args.tiny, args.force)
        elif args.cmd == "release":
            rec = step_release(args.work, args.config, args.spec, args.timeout)
        else:
            modes = [m for m in args.modes.split(",") if m]
            unknown = sorted(set(modes) - set(MODES))
            if unknown:
                raise ValueError(f"unknown modes {unknown} (known: {', '.join(MODES)})")
            rec = step_compare(args.work, args.config, args.spec, modes, args.timeout,
                               args.json, args.rounds, args.calls, args.ma_min_s)
    except Exception as exc:  # noqa: BLE001 - a step never takes the suite down
        rec = {"step": args.cmd, "config": args.config, **_failure(exc)}
    rec.setdefault("step_wall_s", round(time.perf_counter() - t0, 2))
    _write(args.json, rec)
    return 0 if rec.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
