"""A/A check of the decision rule on ONNX Runtime (CPU): a selection whose two values do the
same thing must end "no significant gain" every time.

The knob is ``-inter_op_num_threads=[0|1]`` with the default sequential execution mode, where
ORT runs no inter-op pool: both routes build the same engine (the second reuses the first) and
run the same way. Writes bench/results/aa-ort.json with how often the rule shipped a route
anyway (a false positive), and how often the screening alone would have.

    python bench/aa_check.py [--runs 10] [--sample convnet]

With ``--spec``, any release spec instead of a sample's (its own ``[timing]``; the selection
replaced), e.g. the BERT-base encoder, whose float32 engine loads slower than ONNX Runtime's
switch pause, so its sessions are kept open between blocks::

    python bench/aa_check.py --spec bench/work/olive/bert/release.toml --runs 10 \
        --out bench/results/aa-ort-bert-kept.json

With ``--strategy budget``, a larger selection of knobs that do nothing in sequential mode (the
inter-op pool's size and its spinning: every route the same engine run the same way), searched
within ``--max-builds``: the route screened best is the luckiest draw of noise, and the
confirmation must still ship none:

    python bench/aa_check.py --strategy budget --max-builds 5 --out bench/results/aa-ort-budget.json \
        --selection "-execution_mode=sequential -inter_op_num_threads=[0|1|2|4] -inter_op_allow_spinning=[on|off]"
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dossier.spec import load_spec  # noqa: E402
from dossier.tuner import tune  # noqa: E402

SELECTION = "-execution_mode=sequential -inter_op_num_threads=[0|1]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--sample", default="convnet")
    ap.add_argument("--spec", type=Path, default=None,
                    help="a release spec to use instead of the sample's")
    ap.add_argument("--strategy", default="full", choices=("full", "budget"))
    ap.add_argument("--selection", default=SELECTION, help="knobs that do nothing")
    ap.add_argument("--max-builds", type=int, default=None, help="the budget (strategy budget)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "aa-ort.json")
    args = ap.parse_args()
    selection = args.selection
    overrides: dict[str, object] = {"strategy": args.strategy, "selection": selection}
    if args.max_builds is not None:
        overrides["max_builds"] = args.max_builds
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        spec_file = ROOT / "samples" / "build.py"
        module_spec = importlib.util.spec_from_file_location("samples_build", spec_file)
        module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
        sys.modules["samples_build"] = module
        module_spec.loader.exec_module(module)  # type: ignore[union-attr]
        if args.spec is None:
            module.build_all(Path(tmp) / "samples")
        spec = load_spec(args.spec or Path(tmp) / "samples" / args.sample / "release.toml",
                         overrides)
        for i in range(args.runs):
            res = tune(spec, Path(tmp) / f"run{i}")
            searched = [t for t in res.cache.trials if t.role == "search" and t.comparison]
            screen = max(searched, key=lambda t: t.comparison.speedup)  # the best screened
            c = screen.comparison
            confirm = [t for t in res.cache.trials if t.role == "confirm"]
            runs.append({
                "run": i, "shipped": res.decision.shipped_route, "gain": res.decision.gain,
                "routes": len(searched) + 1, "best_screened": screen.route,
                "screening": {"speedup": c.speedup, "ci": [c.speedup_ci_low, c.speedup_ci_high],
                              "p_value": c.p_value, "faster": c.faster, "slower": c.slower},
                "confirmed": [{"speedup": t.comparison.speedup, "p_value": t.comparison.p_value}
                              for t in confirm if t.comparison],
                "reused_engine": screen.extra.get("reused_engine"),
                "reason": res.decision.reason})
            print(f"[{i}] screening {c.speedup:.3f}x [{c.speedup_ci_low:.3f}, "
                  f"{c.speedup_ci_high:.3f}] p={c.p_value:.2g}"
                  f"{' faster' if c.faster else ''}{' slower' if c.slower else ''}"
                  f" -> {'GAIN' if res.decision.gain else 'no significant gain'}")
    result = {
        "benchmark": "A/A check of the decision rule", "backend": "onnxruntime",
        "sample": str(args.spec) if args.spec else args.sample, "selection": selection, "strategy": args.strategy,
        "max_builds": args.max_builds, "timing": "the spec's [timing]" if args.spec else "default TimingSettings",
        "command": " ".join(["python bench/aa_check.py", *sys.argv[1:]]),
        "host": {"machine": platform.machine(), "python": platform.python_version()},
        "runs": len(runs),
        "no_significant_gain": sum(not r["gain"] for r in runs),
        "screened_faster": sum(r["screening"]["faster"] for r in runs),
        "screened_significant": sum(r["screening"]["p_value"] < 0.05 for r in runs),
        "interval_includes_1": sum(r["screening"]["ci"][0] <= 1 <= r["screening"]["ci"][1]
                                   for r in runs),
        "details": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"no significant gain in {result['no_significant_gain']} of {len(runs)} runs; "
          f"screening called 'faster' {result['screened_faster']} times, 'significant' "
          f"{result['screened_significant']} times; the interval held 1.0 "
          f"{result['interval_includes_1']} times")


if __name__ == "__main__":
    main()
