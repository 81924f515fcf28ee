"""Summarise calibration searches confirmed in measuring processes (the rule of
dossier.measure.confirmation) from the H200 bench's result files: per config, how many releases shipped
the route, their intervals' lower ends, the A/A reading inside every confirmation, the
confirmation's wall time, and coverage of the recorded prediction interval by (a) the fresh
re-measurements (``step_fresh``, the procedure of ``verify --rebench``) and (b) the next
release's confirmation reading (new processes, the same engines: a re-measurement too).

    python bench/h200/calibration_summary.py bench/results/h200-raw/h200-g1.json
        # -> bench/results/h200-calibration.json and .md

Searches recorded before the rule (no ``confirmation`` in their rows) are left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _share(hits: int, n: int) -> dict:
    from scipy import stats

    if n == 0:
        return {"hits": 0, "n": 0}
    ci = stats.binomtest(hits, n).proportion_ci(0.95, method="exact")
    return {"hits": hits, "n": n, "ci": [round(ci.low, 3), round(ci.high, 3)]}


def _start(c: dict) -> str:
    """How its measuring processes started: each at its turn, or on standby ahead of it
    (``confirm_prestart``; recorded since the phases were)."""
    return "prestart" if "standby" in (c.get("phases_s") or {}) else "in turn"


def _walls(conf: list[dict]) -> dict:
    return {"median": round(statistics.median(c["wall_s"] for c in conf), 1),
            "max": round(max(c["wall_s"] for c in conf), 1), "n": len(conf)}


def _phases(conf: list[dict]) -> dict:
    """Median seconds per measuring process of each phase, over the confirmations that
    recorded phases (each confirmation's sum divided by its processes)."""
    rows = [{k: v / c["processes"] for k, v in c["phases_s"].items()}
            for c in conf if c.get("phases_s")]
    keys = sorted({k for r in rows for k in r})
    return {k: round(statistics.median(r.get(k, 0.0) for r in rows), 2) for k in keys}


def _runs(files: list[Path], kind: str) -> tuple[list, dict[str, list[dict]]]:
    """The tags, and per config the decided repetitions of the steps named ``kind``."""
    configs: dict[str, list[dict]] = {}
    tags = []
    for f in files:
        doc = json.loads(f.read_text())
        tags.append(doc.get("tag"))
        for step in doc.get("steps", []):
            if step.get("step") != kind:
                continue
            for r in step.get("runs", []):
                if r.get("ok") and (r.get("confirmation") or kind == "release"):
                    configs.setdefault(step["config"], []).append({**r, "tag": doc.get("tag")})
    return tags, configs


def releases(files: list[Path]) -> dict:
    """The ``release`` steps (fast searches over every knob): per config, how many shipped the
    CUDA-graph route, their readings, and the confirmation's time per candidate."""
    out: dict = {}
    for name, runs in _runs(files, "release")[1].items():
        conf = [r["confirmation"] for r in runs if r.get("confirmation")]
        graph = [r for r in runs if r.get("cuda_graph")]
        out[name] = {
            "releases": len(runs), "cuda_graph_shipped": _share(len(graph), len(runs)),
            "shipped_routes": [r.get("shipped_route") if r.get("gain") else None for r in runs],
            "speedups": [round(c["speedup"], 3) for c in conf],
            "lower_ends": [round(c["ci"][0], 3) for c in conf],
            "confirmation_s_per_candidate": [round(c["wall_s"] / max(c.get("candidates", 1), 1),
                                                   1) for c in conf],
        }
    return out


def summarise(files: list[Path]) -> dict:
    tags, configs = _runs(files, "calib")
    out: dict = {"files": [str(f) for f in files], "tags": tags, "configs": {},
                 "releases": releases(files)}
    for name, runs in configs.items():
        runs.sort(key=lambda r: (r["tag"], r["rep"]))
        shipped = [r for r in runs if r.get("gain")]
        conf = [r["confirmation"] for r in runs]
        fresh = [r["fresh"] for r in runs if (r.get("fresh") or {}).get("fresh_speedup")]
        nxt = [(a["confirmation"], b["confirmation"]) for a, b in zip(runs, runs[1:])]
        out["configs"][name] = {
            "releases": len(runs), "shipped": _share(len(shipped), len(runs)),
            "speedups": [round(c["speedup"], 3) for c in conf],
            "lower_ends": [round(c["ci"][0], 3) for c in conf],
            "lowest_lower_end": round(min(c["ci"][0] for c in conf), 3),
            "processes": sorted({c["processes"] for c in conf}),
            "confirmation_s": _walls(conf),
            "confirmation_s_by_start": {
                start: _walls(group) for start in ("in turn", "prestart")
                if (group := [c for c in conf if _start(c) == start])},
            "process_phases_s": _phases(conf),
            "aa_readings": [round(c["aa"]["speedup"], 4) for c in conf if c.get("aa")],
            "aa_intervals_include_1": _share(
                sum(c["aa"]["ci"][0] <= 1.0 <= c["aa"]["ci"][1] for c in conf if c.get("aa")),
                sum(1 for c in conf if c.get("aa"))),
            "fresh_inside_prediction": _share(sum(1 for f in fresh if f["inside_prediction"]),
                                              len(fresh)),
            "fresh": [{"speedup": round(f["fresh_speedup"], 3),
                       "prediction": [round(x, 3) for x in f["tuned_prediction"]]}
                      for f in fresh],
            "next_release_inside_prediction": _share(
                sum(1 for a, b in nxt if a["prediction"][0] <= b["speedup"] <= a["prediction"][1]),
                len(nxt)),
        }
    return out


def _cost(c: dict) -> str:
    by = c.get("confirmation_s_by_start") or {"in turn": c["confirmation_s"]}
    return "; ".join(f"{start}: median {w['median']} s (max {w['max']} s, {w['n']})"
                     for start, w in by.items())


def markdown(s: dict) -> str:
    lines = ["# H200: the CUDA-graph route under the confirmation in measuring processes", "",
             f"Produced by `python bench/h200/calibration_summary.py {' '.join(s['files'])}` "
             f"(tags {', '.join(map(str, s['tags']))}).", "",
             "| config | releases | shipped | speedups (confirmation) | lowest lower end | "
             "A/A in the same processes | confirmation | fresh re-measurement inside the "
             "prediction interval | next release inside it |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, c in s["configs"].items():
        aa = c["aa_readings"]
        lines.append(
            f"| {name} | {c['releases']} | {c['shipped']['hits']} of {c['shipped']['n']} | "
            f"{', '.join(f'{x:.2f}x' for x in c['speedups'])} | {c['lowest_lower_end']:.2f}x | "
            f"{min(aa):.3f}-{max(aa):.3f}x, interval holds 1.0 in "
            f"{c['aa_intervals_include_1']['hits']} of {c['aa_intervals_include_1']['n']} | "
            f"{_cost(c)}, "
            f"{'/'.join(map(str, c['processes']))} processes | "
            f"{c['fresh_inside_prediction']['hits']} of {c['fresh_inside_prediction']['n']} | "
            f"{c['next_release_inside_prediction']['hits']} of "
            f"{c['next_release_inside_prediction']['n']} |")
    if s.get("releases"):
        lines += ["", "`release` steps (the `fast` search over every knob, repeated):", "",
                  "| config | releases | shipped the CUDA-graph route | speedups (confirmation) "
                  "| lower ends | confirmation per candidate |", "|---|---|---|---|---|---|"]
        for name, r in s["releases"].items():
            lines.append(
                f"| {name} | {r['releases']} | {r['cuda_graph_shipped']['hits']} of "
                f"{r['cuda_graph_shipped']['n']} | "
                f"{', '.join(f'{x:.2f}x' for x in r['speedups'])} | "
                f"{', '.join(f'{x:.2f}x' for x in r['lower_ends'])} | "
                f"{', '.join(f'{x:.0f} s' for x in r['confirmation_s_per_candidate'])} |")
    phased = {n: c["process_phases_s"] for n, c in s["configs"].items() if c["process_phases_s"]}
    if phased:
        lines += ["", "Seconds per measuring process, medians over the confirmations that recorded "
                  "them (`process`: from its turn to its result; `standby`: waiting, started "
                  "ahead, before its turn; `wait`: for its successor's imports before timing):",
                  ""]
        lines += [f"- {n}: " + ", ".join(f"{k} {v}" for k, v in p.items())
                  for n, p in phased.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "h200-calibration")
    args = ap.parse_args()
    s = summarise(args.files)
    args.out.with_suffix(".json").write_text(json.dumps(s, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(s))
    print(markdown(s))


if __name__ == "__main__":
    main()
