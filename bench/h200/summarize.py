"""Turn the H200 benchmark's result files into ``bench/results/h200.json`` and a Markdown table.

::

    python bench/h200/summarize.py RESULTS... [--out-json bench/results/h200.json]
                                              [--out-md bench/results/h200.md]

RESULTS are ``h200-<tag>.json`` files written by ``run.sh`` (or folders holding them), oldest
first: later files win where two measured the same thing; A/A repetitions and independent
re-measurements add up over all files. For every configuration it reports eager and
torch.compile medians with their 95% intervals; for every search the number of builds, the
search's wall time, the baseline's and the winner's medians, the speedup with its interval,
whether the fresh-process re-measurement fell inside the tuned interval, and for ``full`` how
many builds ``fast`` and ``mixed`` needed to reach full's winner: measured (their own runs) and
replayed (the strategies walked over full's measurements, which cover every route).
A/A rows count how often the decision was "no significant gain" out of N.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

STRATEGIES = ("fast", "mixed", "full")


def load_results(paths: list[Path]) -> list[dict]:
    """Every run.sh result file under ``paths``, oldest tag first."""
    files: list[Path] = []
    for p in paths:
        files += sorted(p.glob("h200-*.json")) if p.is_dir() else [p]
    data = []
    for f in files:
        try:
            d = json.loads(f.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"skipping {f}: {exc}", file=sys.stderr)
            continue
        if d.get("format", "").startswith("dossier-bench-h200"):
            d["_file"] = str(f)
            data.append(d)
    return data  # in the order given: later files win


def _ci(t: dict | None) -> dict | None:
    if not t:
        return None
    return {"median_ms": t["median_ms"], "ci_ms": [t["ci_low_ms"], t["ci_high_ms"]], "n": t["n"]}


def search_row(rec: dict) -> dict:
    """One search's summary row."""
    trials = [t for t in rec.get("trials", []) if t["role"] != "confirm"]
    confirms = {t["route"]: t for t in rec.get("trials", []) if t["role"] == "confirm"}
    base = next((t for t in trials if t["role"] == "baseline"), None)
    d = rec.get("decision") or {}
    shipped = d.get("shipped_route")
    win = confirms.get(shipped) or next((t for t in trials if t["route"] == shipped), None)
    outcomes: dict[str, int] = {}
    for t in trials:
        outcomes[t["outcome"]] = outcomes.get(t["outcome"], 0) + 1
    fresh = rec.get("fresh") or {}
    return {
        "strategy": rec.get("strategy"), "ok": rec.get("ok"), "routes": len(trials),
        "builds": sum(1 for t in trials if t.get("build_s") is not None),
        "build_s_sum": round(sum(t.get("build_s") or 0.0 for t in trials), 1),
        "wall_over_builds": (round(rec["search_wall_s"] / sum(t["build_s"] for t in trials
                                                               if t.get("build_s")), 3)
                             if rec.get("search_wall_s") and any(t.get("build_s") for t in trials)
                             else None),
        "outcomes": outcomes, "search_wall_s": rec.get("search_wall_s"),
        "command_wall_s": rec.get("wall_s"),
        "build_s": [t["build_s"] for t in trials if t.get("build_s") is not None],
        "baseline": _ci(base["timing"]) if base else None,
        "baseline_route": rec.get("baseline_route"),
        "gain": d.get("gain"), "shipped_route": shipped,
        "winner": _ci(win["timing"]) if win and d.get("gain") else None,
        "speedup": d.get("speedup"),
        "speedup_ci": [d.get("speedup_ci_low"), d.get("speedup_ci_high")] if d.get("gain") else None,
        "p_value": d.get("p_value"), "reason": d.get("reason"),
        "order": [t["route"] for t in trials],
        "fresh": {k: fresh.get(k) for k in (
            "ok", "target", "route", "fresh_speedup", "fresh_speedup_ci", "fresh_median_ms",
            "tuned_speedup", "tuned_speedup_ci", "tuned_median_ci_ms", "speedup_inside_ci",
            "median_inside_ci", "baseline_median_inside_ci", "note", "error", "procedure")}
        if fresh else None,
        "error": None if rec.get("ok") else (rec.get("error") or rec.get("timeout")
                                             or (rec.get("stderr_tail") or "")[-400:]),
    }


class _Judged:
    def __init__(self, trial: dict | None) -> None:
        self.admissible = bool(trial and trial["outcome"] == "ok")
        self.faster = bool(trial and trial.get("faster"))


def full_best(full: dict) -> str | None:
    """Full's answer: its shipped route (the baseline when nothing was significantly faster)."""
    d = full.get("decision") or {}
    return d.get("shipped_route")


def reaches(route: str, best: str) -> bool:
    """``route`` sets every knob of full's answer ``best`` to its value: a search over more
    knobs (``fast`` below with ``coordinate_descent_tuning``) reaches full's answer when it
    agrees on the knobs full searched."""
    from dossier.routes import Route

    mine = Route.parse(route).as_dict()
    return all(mine.get(k) == v for k, v in Route.parse(best).as_dict().items())


def replay(full: dict, strategy: str) -> dict:
    """Walk ``strategy`` over full's measurements: the routes it would build, in order."""
    from dossier.knobs import KnobDatabase
    from dossier.routes import Selection
    from dossier.strategies import get_strategy

    db = KnobDatabase.model_validate(full["knob_database"])
    selection = Selection.parse(full["selection"], db)
    table = {t["route"]: t for t in full["trials"] if t["role"] != "confirm"}
    base = full["baseline_route"]
    results: dict[str, _Judged] = {base: _Judged(table.get(base))}
    order = [base]
    for route in get_strategy(strategy).routes(selection, db, results):
        text = route.text()
        if text in results:
            continue
        order.append(text)
        results[text] = _Judged(table.get(text))
    best = full_best(full)
    # (the confirmation re-timing cannot be replayed: which route the replayed search would
    # ship is not claimed, only whether and when it builds full's answer)
    return {"builds": len(order), "order": order,
            "builds_to_reach_full_best": order.index(best) + 1 if best in order else None}


def summarize(results: list[dict]) -> dict:
    """The summary document."""
    env: dict = {}
    configs: dict[str, dict] = {}
    sources = []
    for doc in results:
        sources.append({"tag": doc.get("tag"), "file": doc.get("_file")})
        for step in doc.get("steps", []):
            kind = step.get("step")
            if kind == "env":
                env = {k: v for k, v in step.items() if k not in ("step", "ok", "step_wall_s")}
            elif kind == "eager":
                for r in step.get("records", []):
                    c = configs.setdefault(r["config"], {})
                    if r.get("ok"):
                        c["eager"] = {**(_ci(r["eager"]["timing"]) or {}),
                                      "worst_loss": r["eager"]["worst_loss"]}
                        for label in ("compile", "reduce_overhead"):
                            if label in r:
                                c[label] = {**(_ci(r[label]["timing"]) or {}),
                                            "worst_loss": r[label]["worst_loss"],
                                            "compile_s": r[label].get("compile_s")}
                    else:
                        c.setdefault("errors", []).append(f"eager: {r.get('error') or r.get('skipped')}")
            elif kind == "tune":
                c = configs.setdefault(step["config"], {})
                key = "aa_single" if step.get("aa") else step["strategy"]
                row = c.setdefault("searches", {})[key] = search_row(step)
                fresh = step.get("fresh") or {}
                row["redecided"] = _reanalyse(doc, Path(step.get("run_dir", "")).name, {
                    "route": fresh.get("route"), "speedup": fresh.get("fresh_speedup")})
                if step.get("strategy") == "full" and step.get("ok") and not step.get("aa"):
                    c["_full"] = step
                c.setdefault("_raw", {})[key] = step
            elif kind in ("procvar", "bundle"):
                _remeasures(configs, doc.get("tag"), step)
            elif kind == "aa":
                c = configs.setdefault(step["config"], {})
                c.setdefault("_aa_runs", []).extend(
                    [{**r, "tag": doc.get("tag")} for r in step.get("runs", []) if r.get("ok")])
                c.setdefault("_aa_planned", 0)
                c["_aa_planned"] += step.get("reps_planned") or 0
                runs = c["_aa_runs"]
                speedups = [r["screened_speedup"] for r in runs if r.get("screened_speedup")]
                c["aa"] = {"reps": len(runs), "planned": c["_aa_planned"],
                           "no_significant_gain": sum(1 for r in runs if r["gain"] is False),
                           "screened_faster": sum(1 for r in runs if r["screened_faster"]),
                           "screened_slower": sum(1 for r in runs if r["screened_slower"]),
                           "median_screened_speedup": statistics.median(speedups) if speedups
                           else None,
                           "from_build_cache": sum(1 for r in runs
                                                   if r.get("build_cache_hits")),
                           "stopped": step.get("stopped"), "error": step.get("error")}
            elif kind == "calib":
                c = configs.setdefault(step["config"], {})
                runs = c.setdefault("_calib_runs", [])
                for r in step.get("runs", []):
                    if r.get("ok"):  # per run as recorded; older files: per step
                        gens = r.get("confirm_processes") or step.get("confirm_processes", 1)
                        runs.append({**r, "tag": doc.get("tag"), "generations": gens,
                                     "reanalysed": _reanalyse(
                                         doc, f"{step['config']}-calib-{r['rep']:02d}",
                                         {"route": r.get("shipped_route"), "speedup": (
                                             r.get("fresh") or {}).get("fresh_speedup")}
                                         if r.get("gain") else None, gens)})
                c["calib"] = _calib(runs)
                c.setdefault("errors", []).extend(
                    f"calib ({doc.get('tag')}) run {r['rep']}: {r['error'].strip()[-200:]}"
                    for r in step.get("runs", []) if not r.get("ok") and r.get("error"))
    for c in configs.values():
        c.pop("_aa_runs", None)
        c.pop("_aa_planned", None)
        c.pop("_calib_runs", None)
        full = c.pop("_full", None)
        raw = c.pop("_raw", {})
        if not full:
            continue
        best = full_best(full)
        reach: dict[str, Any] = {"full_best": best, "full_builds": len(
            [t for t in full["trials"] if t["role"] != "confirm"])}
        for s in ("fast", "mixed"):
            entry: dict[str, Any] = {}
            measured = raw.get(s)
            if measured and measured.get("trials"):
                order = [t["route"] for t in measured["trials"] if t["role"] != "confirm"]
                hit = [i for i, r in enumerate(order) if best and reaches(r, best)]
                entry["measured_builds_to_reach"] = hit[0] + 1 if hit else None
                entry["measured_ships_same"] = bool(best) and reaches(
                    (measured.get("decision") or {}).get("shipped_route") or "", best)
            try:
                rp = replay(full, s)
                entry["replayed_builds_to_reach"] = rp["builds_to_reach_full_best"]
                entry["replayed_builds"] = rp["builds"]
            except Exception as exc:  # noqa: BLE001 - a replay problem must not hide the rest
                entry["replay_error"] = f"{type(exc).__name__}: {exc}"
            reach[s] = entry
        c["reach_full_best"] = reach
    return {"format": "dossier-bench-h200-summary/1", "sources": sources, "env": env,
            "configs": configs}


def _reanalyse(doc: dict, search: str, fresh: dict | None,
               processes: int | None = None) -> dict | None:
    """A recorded search re-decided with today's rule: never possible for the searches kept
    here, so always None. They confirmed with one process per engine (in process
    generations); today's confirmation times the baseline, its A/A load and the candidates in
    the same measuring process and tests the difference per process, a measurement those
    records do not hold. They are reported as they were decided."""
    del doc, search, fresh, processes
    return None


def _calib(runs: list[dict], split: bool = True) -> dict:
    """Coverage of the calibration searches: of the shipped gains re-measured independently,
    how many readings fall inside the recorded 95% interval, and how many exclude 1.0 (also
    by the number of process generations the searches confirmed in)."""
    by_gens = ({str(g): _calib([r for r in runs if r.get("generations", 1) == g], False)
                for g in sorted({r.get("generations", 1) for r in runs})} if split else {})
    shipped = [r for r in runs if r.get("gain")]
    fresh = [r["fresh"] for r in shipped
             if (r.get("fresh") or {}).get("fresh_speedup") is not None]
    return {"searches": len(runs), "shipped": len(shipped), "remeasured": len(fresh),
            "by_generations": by_gens,
            "inside": sum(1 for f in fresh if f["speedup_inside_ci"]),
            "remeasure_excludes_one": sum(1 for f in fresh if f["fresh_speedup_ci"][0] > 1.0),
            "from_build_cache": sum(1 for r in runs if r.get("build_cache_hits")),
            "reanalysed": sum(1 for r in runs if r.get("reanalysed")),
            "reanalysed_shipped": sum(1 for r in runs if (r.get("reanalysed") or {}).get("gain")),
            "reanalysed_remeasured": sum(1 for r in runs if (r.get("reanalysed") or {}).get(
                "fresh_inside") is not None),
            "reanalysed_inside": sum(1 for r in runs
                                     if (r.get("reanalysed") or {}).get("fresh_inside")),
            "reanalysed_excludes_one": sum(1 for r in runs
                                           if (r.get("reanalysed") or {}).get("excludes_one")),
            "rows": [{"tag": r["tag"], "rep": r["rep"], "gain": r.get("gain"),
                      "generations": r.get("generations", 1), "reanalysed": r.get("reanalysed"),
                      "speedup": r.get("speedup"), "speedup_ci": r.get("speedup_ci"),
                      "fresh_speedup": (r.get("fresh") or {}).get("fresh_speedup"),
                      "fresh_speedup_ci": (r.get("fresh") or {}).get("fresh_speedup_ci"),
                      "inside": (r.get("fresh") or {}).get("speedup_inside_ci")}
                     for r in runs]}


def _config_of(run_dir: str) -> tuple[str, str]:
    """``.../resnet50_b1-full`` -> (``resnet50_b1``, ``full``)."""
    name = Path(run_dir).name
    config, _, rest = name.rpartition("-")
    return (config, rest) if rest in STRATEGIES else (name.split("-aa")[0], "aa")


def _remeasures(configs: dict[str, dict], tag: str | None, step: dict) -> None:
    """Independent re-measurements (a fresh process per engine: ``procvar``'s plans and
    ``verify --rebench`` in the ``bundle`` step) of a search's shipped route and of the baseline
    against itself, next to the interval the search recorded for that route."""
    config, strategy = _config_of(step.get("run_dir", ""))
    c = configs.setdefault(config, {})
    out = c.setdefault("independent", [])
    recorded = (c.get("searches") or {}).get(strategy) or {}
    ci = recorded.get("speedup_ci")
    if step.get("step") == "bundle":
        report = step.get("verify_report") or {}
        c.setdefault("bundles", []).append({
            "tag": tag, "strategy": strategy, "bundle": step.get("bundle_path"),
            "bundle_mb": step.get("bundle_mb"), "verdict": report.get("verdict"),
            "reasons": report.get("reasons") or [], "html": step.get("html"),
            "accuracy_rechecked": (report.get("recheck") or {}).get("passed")})
        rb = (report.get("rebench") or {}).get("comparison")
        if rb:
            out.append({"tag": tag, "strategy": strategy, "source": "verify --rebench",
                        "plan": "target", "speedup": rb["speedup"],
                        "ci": [rb["speedup_ci_low"], rb["speedup_ci_high"]],
                        "p_value": rb["p_value"], "recorded": recorded.get("speedup"),
                        "recorded_ci": ci})
        return
    for m in step.get("measures", []):
        if m.get("speedup") is None or m.get("plan") == "four":
            continue
        out.append({"tag": tag, "strategy": strategy, "source": "procvar", "plan": m["plan"],
                    "speedup": m["speedup"], "ci": m["speedup_ci"], "p_value": m["p_value"],
                    "recorded": recorded.get("speedup") if m["plan"] == "target" else None,
                    "recorded_ci": ci if m["plan"] == "target" else None})


# ------------------------------------------------------------------------------------ markdown
def _ms(x: dict | None) -> str:
    if not x:
        return "-"
    lo, hi = x["ci_ms"]
    return f"{x['median_ms']:.3f} [{lo:.3f}, {hi:.3f}]"


def _sp(v: float | None, ci: list | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3f}x [{ci[0]:.3f}, {ci[1]:.3f}]" if ci and None not in ci else f"{v:.3f}x"


def _redecided(r: dict | None) -> str:
    if not r:
        return "-"
    if not r.get("gain"):
        return "no gain"
    inside = r.get("fresh_inside")
    return (_sp(r.get("speedup"), r.get("speedup_ci"))
            + ("" if inside is None else f", re-measurement {'inside' if inside else 'outside'}"))


def _yn(v: object) -> str:
    return "-" if v is None else ("yes" if v else "no")


def markdown(summary: dict) -> str:
    """The summary as Markdown tables."""
    env = summary.get("env", {})
    lines = ["# dossier torch-inductor on an H200", ""]
    if env:
        lines += [f"GPU {env.get('gpu', '?')} (sm {env.get('compute_capability', '?')}), "
                  f"torch {env.get('torch', '?')} (CUDA {env.get('torch_cuda', '?')}), "
                  f"nvidia-smi: {env.get('nvidia_smi', '?')}, "
                  f"{env.get('cpus', '?')} CPUs, {env.get('gxx', '')}".rstrip(", "), ""]
    lines += ["Medians in ms with their 95% confidence intervals (order statistics); a speedup "
              "is the paired estimate over rounds (Hodges-Lehmann of the per-round ratios of "
              "block medians) with its exact 95% interval; the search's speedup is the "
              "independent confirmation's (one fresh process per engine).", "",
              "## Eager and torch.compile", "",
              "| config | eager | torch.compile (default) | compile s | torch.compile "
              "reduce-overhead | compile s | AOTI default route (baseline) | shipped route |",
              "|---|---|---|---|---|---|---|---|"]
    cfgs = summary["configs"]
    for name, c in sorted(cfgs.items()):
        base = next((s["baseline"] for s in c.get("searches", {}).values() if s.get("baseline")),
                    None)
        comp, ro = c.get("compile"), c.get("reduce_overhead")
        shipped = next((s["winner"] for s in c.get("searches", {}).values()
                        if s.get("winner")), None)
        lines.append(f"| {name} | {_ms(c.get('eager'))} | {_ms(comp)} | "
                     f"{comp.get('compile_s') if comp else '-'} | {_ms(ro)} | "
                     f"{ro.get('compile_s') if ro else '-'} | {_ms(base)} | {_ms(shipped)} |")
    lines += ["", "## Searches", "",
              "| config | strategy | routes | builds | search s | builds' s (sum) | search / builds "
              "| baseline | shipped route | winner | speedup | fresh re-measurement | inside tuned "
              "interval? | builds to full's best | re-decided with today's rule |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, c in sorted(cfgs.items()):
        reach = c.get("reach_full_best", {})
        for strat in (*STRATEGIES, "aa_single"):
            s = c.get("searches", {}).get(strat)
            if not s:
                continue
            f = s.get("fresh") or {}
            inside = (f"speedup {_yn(f.get('speedup_inside_ci'))}, median "
                      f"{_yn(f.get('median_inside_ci'))}") if f.get("fresh_speedup") else "-"
            fresh = (f"{_sp(f.get('fresh_speedup'), f.get('fresh_speedup_ci'))} "
                     f"({f.get('target')}, "
                     f"{'own processes' if f.get('procedure') == 'independent' else 'one process'})") if f.get("fresh_speedup") else (f.get("note") or
                                                                            f.get("error") or "-")
            if strat == "full":
                to_best = str(reach.get("full_builds", "-"))
            else:
                r = reach.get(strat, {})
                to_best = (f"measured {r.get('measured_builds_to_reach', '-')}, replayed "
                           f"{r.get('replayed_builds_to_reach', '-')}") if r else "-"
            shipped = s.get("shipped_route") if s.get("gain") else "(baseline: no significant gain)"
            if not s.get("ok"):
                shipped = f"FAILED: {str(s.get('error'))[:80]}"
            wall = s.get("search_wall_s")
            ratio = s.get("wall_over_builds")
            lines.append(f"| {name} | {strat} | {s.get('routes', '-')} | {s['builds']} | "
                         f"{wall if wall is not None else '-'} | {s.get('build_s_sum', '-')} | "
                         f"{f'{ratio:.0%}' if ratio is not None else '-'} | "
                         f"{_ms(s.get('baseline'))} | `{shipped}` | {_ms(s.get('winner'))} | "
                         f"{_sp(s.get('speedup'), s.get('speedup_ci'))} | {fresh} | {inside} | "
                         f"{to_best} | {_redecided(s.get('redecided'))} |")
    aa_rows = [(n, c["aa"]) for n, c in sorted(cfgs.items()) if c.get("aa")]
    if aa_rows:
        lines += ["", "## A/A (two values that build the same kernels)", "",
                  "| config | runs that finished | no significant gain | screened faster | "
                  "screened slower | "
                  "median screened speedup | engines from the build cache |",
                  "|---|---|---|---|---|---|---|"]
        for name, a in aa_rows:
            med = a.get("median_screened_speedup")
            lines.append(f"| {name} | {a['reps']} | "
                         f"{a['no_significant_gain']} of {a['reps']} | {a['screened_faster']} | "
                         f"{a['screened_slower']} | {f'{med:.4f}' if med else '-'} | "
                         f"{a.get('from_build_cache', 0)} of {a['reps']} runs |")
    calib = [(n, c["calib"]) for n, c in sorted(cfgs.items())
             if c.get("calib") and c["calib"]["searches"]]
    if calib:
        lines += ["", "## Coverage (repeated searches of the calibration spec, each shipped gain "
                  "re-measured independently)", "",
                  "| config | searches | shipped a gain | re-measured | inside the recorded 95% "
                  "interval | re-measure excludes 1.0 |", "|---|---|---|---|---|---|"]
        for name, a in calib:
            for g, part in sorted(a["by_generations"].items()):
                lines.append(f"| {name} ({g} generation{'s' if int(g) > 1 else ''}, as "
                             f"recorded) | {part['searches']} | {part['shipped']} | "
                             f"{part['remeasured']} | {part['inside']} of {part['remeasured']} | "
                             f"{part['remeasure_excludes_one']} of {part['remeasured']} |")
        for name, a in calib:
            if a["reanalysed"]:
                lines.append(
                    f"\nRe-decided with today's rule ({name}): the {a['reanalysed']} searches "
                    "confirmed in process generations, every confirmation reading recomputed "
                    "from its recorded rounds (a candidate's interval also covers a new "
                    "generation's reading, the A/A's the generations' mean) and the decision "
                    f"taken again: {a['reanalysed_shipped']} ship a gain; of the "
                    f"{a['reanalysed_remeasured']} of those re-measured (the ones that shipped "
                    f"as recorded), {a['reanalysed_inside']} fall inside; "
                    f"{a['reanalysed_excludes_one']} of {a['reanalysed_shipped']} intervals "
                    "exclude 1.0. The rule was changed after seeing these searches; the "
                    "searches that ship only under today's rule were not re-measured.")
        lines += ["", "| config | run | generations | shipped speedup (confirmation, as "
                  "recorded) | independent re-measurement | inside? | re-decided with today's rule "
                  "| inside? |", "|---|---|---|---|---|---|---|---|"]
        for name, a in calib:
            for r in a["rows"]:
                ra = r.get("reanalysed") or {}
                again = ("-" if not ra else _sp(ra.get("speedup"), ra.get("speedup_ci"))
                         if ra.get("gain") else "no gain")
                lines.append(f"| {name} | {r['tag']}-{r['rep']:02d} | {r['generations']} | "
                             f"{_sp(r['speedup'], r['speedup_ci']) if r['gain'] else 'no gain'} | "
                             f"{_sp(r['fresh_speedup'], r['fresh_speedup_ci'])} | "
                             f"{_yn(r['inside']) if r['inside'] is not None else '-'} | "
                             f"{again} | "
                             f"{_yn(ra['fresh_inside']) if ra.get('fresh_inside') is not None else '-'} |")
    bundles = [(n, b) for n, c in sorted(cfgs.items()) for b in c.get("bundles", [])]
    if bundles:
        lines += ["", "## Bundles verified on the H200 (`verify --recheck --rebench`)", "",
                  "| config | search | bundle | MiB | accuracy re-checked | verdict | why | "
                  "HTML report |", "|---|---|---|---|---|---|---|---|"]
        for name, b in bundles:
            why = "; ".join(b["reasons"]) or "-"
            lines.append(f"| {name} | {b['strategy']} ({b['tag']}) | {b['bundle']} | "
                         f"{b['bundle_mb']} | {_yn(b['accuracy_rechecked'])} | "
                         f"{b['verdict'] or '-'} | {why} | {b['html'] or '-'} |")
    rows = [(n, r) for n, c in sorted(cfgs.items()) for r in c.get("independent", [])]
    if rows:
        lines += ["", "## Independent re-measurements (a fresh process per engine, production "
                  "load)", "",
                  "`target`: the shipped route against the baseline, next to the interval the "
                  "search recorded (its independent confirmation); `aa`: the baseline against a "
                  "second process of itself (significant at p < 0.05 is a false positive).", "",
                  "| config | search | source | plan | speedup | p | recorded | inside? |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, r in rows:
            lo_hi = r.get("recorded_ci")
            inside = ("-" if not lo_hi else
                      _yn(lo_hi[0] <= r["speedup"] <= lo_hi[1]))
            lines.append(f"| {name} | {r['strategy']} ({r['tag']}) | {r['source']} | {r['plan']} | "
                         f"{_sp(r['speedup'], r['ci'])} | {r['p_value']:.2g} | "
                         f"{_sp(r.get('recorded'), lo_hi)} | {inside} |")
    errors = [(n, e) for n, c in sorted(cfgs.items()) for e in c.get("errors", [])]
    if errors:
        lines += ["", "## Failed steps", ""] + [f"- {n}: {e}" for n, e in errors]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--out-json", type=Path, default=REPO_ROOT / "bench" / "results" / "h200.json")
    parser.add_argument("--out-md", type=Path, default=REPO_ROOT / "bench" / "results" / "h200.md")
    args = parser.parse_args(argv)
    results = load_results(args.results)
    if not results:
        print("no result files found", file=sys.stderr)
        return 1
    summary = summarize(results)
    args.out_json.parent.mkdir(parents=True, exist_ok=True)
    args.out_json.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    args.out_md.write_text(markdown(summary), encoding="utf-8")
    print(args.out_md.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
