"""Write the GPU benchmark's release specs, exported programs and validation sets.

For each configuration (model x batch) it writes ``WORK/specs/<config>/``:

``model.pt2``
    the model exported with ``torch.export`` at a fixed batch, computing in ``--dtype``
    (bfloat16) behind a float32 interface (the dtype cast happens in the traced module, so
    transformers traces its attention masks in the compute dtype); the spec pins ``-dtype`` to
    the same value.
``validation/``
    ``--pairs`` pairs at the configuration's batch; references from PyTorch eager in float64
    (``model.double()``) of the float32 model, on the GPU when there is one (``--ref-device``).
``release.toml``
    the search spec: backend torch-inductor, metric ``cos`` (1 - cosine similarity, scale-free:
    bf16 lands near 1e-4), threshold 1e-3, a selection over three knobs whose builds are cheap,
    a per-trial timeout. The strategy is chosen on the command line (``dossier tune --strategy``).
``release-aa.toml``
    the A/A spec: one knob whose two values build the same kernels for a GPU package
    (``-inductor:cpp.simdlen=[default|512]``: CPU vector width, and a CUDA package has no CPU
    kernels), cheaper timing settings.
``release-calib.toml``
    the calibration spec: the production timing of ``release.toml`` over one knob that makes a
    real difference (``-cuda_graph=[off|on]`` on a GPU, ``-inductor:freezing=[false|true]`` on a
    CPU), so that repeated searches ship gains whose independent re-measurement can be checked
    against the interval recorded (coverage); its two routes share one build. Its confirmation
    (and so the re-measurement) runs in ``CALIB_GENERATIONS`` process generations.
``meta.json``
    what was written and how long it took.

``--tiny`` replaces ResNet-50 and BERT by the CPU samples' tiny models and uses tiny timing, so
the whole pipeline can be tried on a CPU: ``python bench/h200/make_specs.py --tiny --device cpu``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from samples import torch_models  # noqa: E402

CONFIGS: dict[str, tuple[str, int]] = {
    "resnet50_b1": ("resnet50", 1), "resnet50_b32": ("resnet50", 32),
    "bert_b1": ("bert_base", 1), "bert_b32": ("bert_base", 32),
}
TINY_CONFIGS: dict[str, tuple[str, int]] = {
    "tiny_mlp_b8": ("tiny_mlp", 8), "tiny_convnet_b4": ("tiny_convnet", 4),
}
KNOBS = {
    "resnet50": "-inductor:freezing=[false|true] -inductor:epilogue_fusion=[true|false] "
                "-inductor:layout_optimization=[true|false] "
                "-inductor:coordinate_descent_tuning=[false|true] -cuda_graph=[off|on]",
    "bert_base": "-inductor:freezing=[false|true] -inductor:epilogue_fusion=[true|false] "
                 "-inductor:coordinate_descent_tuning=[false|true] -cuda_graph=[off|on]",
    "tiny_mlp": "-inductor:freezing=[false|true] -inductor:epilogue_fusion=[true|false] "
                "-inductor:aggressive_fusion=[false|true]",
    "tiny_convnet": "-inductor:freezing=[false|true] -inductor:epilogue_fusion=[true|false] "
                    "-inductor:layout_optimization=[true|false]",
}
"""Varied knobs per model (``release.toml``, for fast and mixed): cheap builds only
(max_autotune costs minutes per build); cuda_graph is a load-time knob, so its routes reuse the
engine of the same build."""
FULL_KNOBS = ("-inductor:freezing=[false|true] -inductor:epilogue_fusion=[true|false] "
              "-inductor:layout_optimization=[true|false] -cuda_graph=[off|on]")
"""The full search's selection (``release-full.toml``): 16 routes, 8 builds (cuda_graph reuses
the engine), so that with 8 build jobs it fits one command of the device tool."""
AA_KNOB = "-inductor:cpp.simdlen=[default|512]"
CALIB_KNOB = {"cuda": "-cuda_graph=[off|on]", "cpu": "-inductor:freezing=[false|true]"}
SEEDS = {"resnet50": 3101, "bert_base": 3102, "tiny_mlp": 3103, "tiny_convnet": 3104}

TIMING = {"samples": 100, "rounds": 10, "warmup_max_s": 2.0, "confirm_top": 2,
          "trial_timeout_s": 300.0}
"""Production timing; the confirmation's processes as the backend's GPU defaults say (first
look after 6 measuring processes)."""
AA_TIMING = {"samples": 64, "rounds": 8, "warmup_max_s": 1.0, "confirm_top": 1,
             "trial_timeout_s": 300.0}
TINY_TIMING = {"samples": 24, "rounds": 6, "confirm_rounds": 4, "confirm_runs": 20,
               "warmup_window": 2, "warmup_min_runs": 1, "warmup_max_s": 0.3, "confirm_top": 1,
               "confirm_processes": 3, "confirm_max_processes": 3, "trial_timeout_s": 300.0}


def spec_text(name: str, description: str, selection: str, timing: dict, threshold: float,
              metric: str = "cos") -> str:
    """A release.toml for one configuration (paths relative to its folder)."""
    lines = [
        "[release]", f'name = "{name}"', "version = 1", f'description = "{description}"', "",
        "[model]", 'path = "model.pt2"', "", "[validation]", 'path = "validation"', "",
        "[tune]", 'backend = "torch-inductor"', 'strategy = "fast"', f'selection = "{selection}"',
        f'metric = "{metric}"', f"threshold = {threshold!r}", "", "[timing]",
        *(f"{k} = {v!r}" for k, v in timing.items()), "",
    ]
    return "\n".join(lines)


def write_config(work: Path, config: str, factory_name: str, batch: int, *, device: str,
                 ref_device: str, dtype: str, pairs: int, tiny: bool, force: bool) -> dict:
    """Write one configuration's folder; return its meta record."""
    folder = work / "specs" / config
    meta_path = folder / "meta.json"
    if meta_path.is_file() and not force:
        meta = json.loads(meta_path.read_text())
        if meta.get("ok") and meta.get("device") == device and meta.get("dtype") == dtype \
                and (folder / "release-calib.toml").is_file():
            return {**meta, "reused": True}
    folder.mkdir(parents=True, exist_ok=True)
    factory = torch_models.FACTORIES[factory_name]
    signature = torch_models.fixed_signature(factory.signature, batch)  # type: ignore[attr-defined]
    seed = SEEDS[factory_name] + batch
    t0 = time.perf_counter()
    torch_models.write_validation_set(factory, folder / "validation", [batch] * pairs, seed,
                                      signature=signature, device=ref_device,
                                      extra={"config": config, "engine_dtype": dtype})
    ref_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch_models.export_factory(factory, folder / "model.pt2", signature=signature, dtype=dtype,
                                device=device)
    export_s = time.perf_counter() - t0
    pinned = f"-device={device} -dtype={dtype}"
    selection = f"{pinned} {KNOBS[factory_name]}"
    aa_selection = f"{pinned} {AA_KNOB}"
    timing, aa_timing = (TINY_TIMING, TINY_TIMING) if tiny else (TIMING, AA_TIMING)
    threshold = 1e-3
    (folder / "release.toml").write_text(spec_text(
        f"bench-{config}", f"{factory_name} batch {batch} {dtype} on {device}", selection, timing,
        threshold), encoding="utf-8")
    if factory_name in ("resnet50", "bert_base"):
        (folder / "release-full.toml").write_text(spec_text(
            f"bench-{config}-full", f"{factory_name} batch {batch} {dtype} on {device}",
            f"{pinned} {FULL_KNOBS}", timing, threshold), encoding="utf-8")
    (folder / "release-aa.toml").write_text(spec_text(
        f"bench-{config}-aa", f"A/A: {factory_name} batch {batch} {dtype} on {device}",
        aa_selection, aa_timing, threshold), encoding="utf-8")
    (folder / "release-calib.toml").write_text(spec_text(
        f"bench-{config}-calib", f"calibration: {factory_name} batch {batch} {dtype} on {device}",
        f"{pinned} {CALIB_KNOB['cuda' if device.startswith('cuda') else 'cpu']}",
        {**timing, "confirm_top": 1}, threshold),
        encoding="utf-8")
    meta = {"config": config, "factory": factory_name, "batch": batch, "device": device,
            "dtype": dtype, "ref_device": ref_device, "pairs": pairs, "selection": selection,
            "aa_selection": aa_selection, "metric": "cos", "threshold": threshold,
            "reference_s": round(ref_s, 2), "export_s": round(export_s, 2), "ok": True}
    meta_path.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=REPO_ROOT / "bench" / "work" / "h200")
    parser.add_argument("--configs", default="", help="comma-separated subset of the configs")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--ref-device", default="auto", choices=("auto", "cuda", "cpu"),
                        help="where the float64 references are computed (auto: the GPU if any)")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--pairs", type=int, default=2, help="validation pairs per config")
    parser.add_argument("--tiny", action="store_true", help="tiny CPU models, tiny timing")
    parser.add_argument("--force", action="store_true", help="rewrite existing configs")
    parser.add_argument("--json", type=Path, help="also write the records to this file")
    args = parser.parse_args(argv)

    import torch

    table = {**CONFIGS, **TINY_CONFIGS}
    names = [c for c in args.configs.split(",") if c] or list(TINY_CONFIGS if args.tiny
                                                              else CONFIGS)
    ref_device = args.ref_device
    if ref_device == "auto":
        ref_device = "cuda" if torch.cuda.is_available() else "cpu"
    records = []
    for name in names:
        if name not in table:
            records.append({"config": name, "ok": False, "error": f"unknown config {name!r}"})
            continue
        factory_name, batch = table[name]
        t0 = time.perf_counter()
        try:
            rec = write_config(args.work, name, factory_name, batch, device=args.device,
                               ref_device=ref_device, dtype=args.dtype, pairs=args.pairs,
                               tiny=args.tiny or name in TINY_CONFIGS, force=args.force)
        except Exception as exc:  # noqa: BLE001 - record the failure and go on with the next
            rec = {"config": name, "ok": False, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc(limit=5)}
        rec["wall_s"] = round(time.perf_counter() - t0, 2)
        records.append(rec)
        status = "ok" if rec.get("ok") else f"FAILED: {rec.get('error')}"
        print(f"{name}: {status} ({rec['wall_s']} s)", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"step": "specs", "records": records}, indent=2) + "\n")
    return 0 if all(r.get("ok") for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
