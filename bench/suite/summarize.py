"""The workload suite's records (``suite-TAG.json`` files of ``bench/suite/run.sh``) as one
table: per configuration, the release (shipped route, its speedup over the AOTInductor default
route with the interval, wall time, builds) and the side-by-side timing (ms per call of eager,
each ``torch.compile`` mode and the served engine; the served engine's ratio to the best mode),
and, where a configuration released them too, the ``max_autotune`` release and the pinned
CUDA-graph and default-route releases (``release-cg.toml``, ``release-base.toml``) with their
engines served (``dossier-mat``, ``dossier-cg``, ``dossier-base``); last, where the profile pass
split it, where each contender's timed call spends its time.

    python bench/suite/summarize.py FILE [FILE ...] [--out-json J] [--out-md M]

A later file's record of a configuration replaces an earlier one's. A configuration's row in the
first table takes its latest comparison; where that comparison served a one-route release's
bundle alone (``run.sh`` with ``SUITE_ONLY_PIN`` or ``SUITE_ONLY_BASE``), the served cells are
that bundle's, marked with its label, and a note under the table names the route the
configuration's fast release shipped. Writes ``bench/results/suite.json`` and
``bench/results/suite.md`` by default.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODES = ("eager", "default", "reduce-overhead", "max-autotune")
KNOB_WORDS = {"-cuda_graph=on": "CUDA graph", "-inductor:freezing=true": "freezing",
              "-inductor:max_autotune=true": "max_autotune", "-cuda_graph=off": "default"}
SERVED_KEYS = {"dossier": "served", "dossier-mat": "served_mat", "dossier-cg": "served_cg",
               "dossier-base": "served_base"}
"""A served engine's label -> the prefix of its keys in a comparison record."""
ONE_ROUTE = {"dossier-cg": ("release_cg", "CUDA graph",
                            "the pinned CUDA-graph bundle (`release-cg.toml`, `-cuda_graph=on`, "
                            "released alone)"),
             "dossier-base": ("release_base", "default",
                              "the default-route bundle (`release-base.toml`, `-cuda_graph=off`, "
                              "released alone)")}
"""A one-route release's served label -> (its release kind, the route it ships in words, what
it is)."""


def short_route(route: str | None, baseline: str | None) -> str:
    """The knobs a route sets beyond the baseline's, in words (``default`` for none)."""
    if not route:
        return "default"
    base = set((baseline or "").split())
    extra = [t for t in route.split() if t not in base]
    return " + ".join(KNOB_WORDS.get(t, t) for t in extra) or "default"


def _fmt_x(r: dict | None, digits: int = 2) -> str:
    if not r or r.get("x") is None:
        return "-"
    lo, hi = r["ci"]
    return f"{r['x']:.{digits}f}x [{lo:.{digits}f}, {hi:.{digits}f}]"


def served_label(cmp_: dict) -> str:
    """The engine a comparison was made for (records before the one-route releases: dossier)."""
    return str(cmp_.get("served_label") or "dossier")


def collect(files: list[Path]) -> dict[str, dict[str, Any]]:
    """Per configuration: its latest release, max_autotune release, CUDA-graph release,
    default-route release and compare records, each with the tag it came from, and under
    ``compare_by`` the latest comparison in which each served engine ran and under
    ``compare_ma`` the latest in which max-autotune was timed."""
    rows: dict[str, dict[str, Any]] = {}
    for file in files:
        data = json.loads(file.read_text())
        tag = data.get("tag", file.stem)
        for step in data.get("steps", []):
            config = step.get("config")
            kind = step.get("step")
            if not config or kind not in ("release", "compare", "specs"):
                continue
            if kind == "release" and step.get("spec") == "release-mat.toml":
                kind = "release_mat"
            if kind == "release" and step.get("spec") == "release-cg.toml":
                kind = "release_cg"
            if kind == "release" and step.get("spec") == "release-base.toml":
                kind = "release_base"
            if step.get("skipped"):
                continue
            rec = {**step, "tag": tag}
            row = rows.setdefault(config, {})
            row[kind] = rec
            if kind == "compare":
                for label in SERVED_KEYS:
                    if (step.get("contenders") or {}).get(label, {}).get("ok"):
                        row.setdefault("compare_by", {})[label] = rec
                if "max-autotune" in View(rec).ms:
                    row["compare_ma"] = rec
    return rows


def knob_screened(r: dict, token: str) -> str:
    """How the route that sets ``token`` (``-inductor:max_autotune=true``) fared in the release:
    its screening speedup over the default route with the interval, or why it has none."""
    for t in r.get("trials") or []:
        if token in (t.get("route") or "").split() and t.get("role") == "search":
            if t.get("speedup") is None:
                return f"{t.get('outcome') or 'failed'}: {(t.get('reason') or '?')[:100]}"
            lo, hi = t.get("speedup_ci") or (None, None)
            ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""
            built = f", built in {t['build_s']:.0f} s" if t.get("build_s") else ""
            return f"{t['speedup']:.2f}x{ci}{built}"
    return "not tried"


class View:
    """The timing of one comparison record: cells per contender, the best compile mode, each
    served engine's ratio over it."""

    def __init__(self, cmp_: dict) -> None:
        self.rec = cmp_
        # a comparison killed while compiling max-autotune keeps the timing before it
        self.killed = bool(cmp_.get("killed")) and not cmp_.get("final")
        self.final = cmp_.get("final") or cmp_.get("before_max_autotune") or {}
        self.ms = self.final.get("ms_per_call") or {}
        self.cont = cmp_.get("contenders") or {}
        self.best_mode = self.final.get("best_compile_mode")

    def cell(self, label: str) -> str:
        if label in self.ms:
            acc = self.cont.get(label, {})
            flag = "" if acc.get("admissible", True) else " (inaccurate)"
            return f"{self.ms[label]['median_ms']:.3f}{flag}"
        c = self.cont.get(label)
        if c is None:
            return ("killed while compiling" if self.killed and label == "max-autotune"
                    else "not run")
        return "skipped" if c.get("skipped") else "failed"

    def served_cell(self, label: str) -> str:
        return self.cell(label) if label in self.cont else "-"

    def over(self, label: str, other: str) -> dict | None:
        """``label``'s ratio over ``other`` (x > 1: ``label`` faster)."""
        got = (self.final.get(f"{SERVED_KEYS[label]}_over") or {}).get(other)
        return got if isinstance(got, dict) else None

    def over_best(self, label: str) -> dict | None:
        if not self.best_mode:
            return None
        got = self.final.get(f"{SERVED_KEYS[label]}_over_best_compile")
        return got if isinstance(got, dict) else self.over(label, self.best_mode)

    def best(self) -> str:
        if not self.best_mode:
            return "-"
        return self.best_mode + ("" if "max-autotune" in self.ms else " (max-autotune not timed)")


def row_text(config: str, row: dict[str, Any]) -> dict[str, str]:
    rel, mat, cmp_ = row.get("release") or {}, row.get("release_mat") or {}, row.get("compare") or {}
    cg, base = row.get("release_cg") or {}, row.get("release_base") or {}

    def release_cell(r: dict) -> str:
        if not r:
            return "not run"
        if not r.get("ok") and r.get("speedup") is None and not r.get("gain"):
            why = r.get("error") or (r.get("stderr_tail") or "").strip().splitlines()[-1:] or ["?"]
            return f"failed: {why if isinstance(why, str) else why[0]}"[:160]
        if r.get("gain"):
            return (f"{short_route(r.get('shipped_route'), r.get('baseline_route'))} "
                    f"{r['speedup']:.2f}x [{r['speedup_ci'][0]:.2f}, {r['speedup_ci'][1]:.2f}]")
        best = r.get("best_confirmed")
        if best:
            return (f"default route (no significant gain; "
                    f"{short_route(best['route'], r.get('baseline_route'))} confirmed at "
                    f"{best['speedup']:.2f}x [{best['ci'][0]:.2f}, {best['ci'][1]:.2f}])")
        return "default route (no significant gain)"

    def builds(r: dict) -> str:
        if not r or r.get("wall_s") is None:
            return "-"
        beside = f"; beside {', '.join(r['beside'])}" if r.get("beside") else ""
        return f"{r['wall_s']:.0f} s, {r.get('builds_fresh', '?')} of {r.get('builds', '?')}" \
            + beside

    def one_route_cell(r: dict) -> str:
        """A one-route release: the route it shipped and its reading per inference."""
        if not r:
            return "not run"
        if not r.get("ok"):
            why = r.get("error") or (r.get("stderr_tail") or "").strip().splitlines()[-1:] or ["?"]
            return f"failed: {why if isinstance(why, str) else why[0]}"[:160]
        first = next((t for t in r.get("trials") or [] if t.get("role") == "baseline"), {})
        per = (first.get("median_ms") or 0) / 2  # a sample is one pass over the two pairs
        route = r.get("shipped_route") or ""
        where = " ".join(t for t in route.split() if t.startswith(("-device=", "-dtype=")))
        reading = ""
        if per:
            beside = ", taken beside the other releases' builds" if r.get("beside") else ""
            reading = f", {per:.3f} ms per inference (the release's reading{beside})"
        return short_route(route, where) + reading

    v = View(cmp_)
    label = served_label(cmp_)
    modes = {m: v.cell(m) for m in MODES}
    best_text = v.best()
    ma_rec = row.get("compare_ma") or {}
    if v.best_mode and "max-autotune" not in v.ms and ma_rec and ma_rec is not cmp_:
        # timed in another comparison only: its figure with its tag, never this run's
        vm = View(ma_rec)
        ma_ms = vm.ms["max-autotune"]["median_ms"]
        there = vm.best_mode or "max-autotune"
        modes["max-autotune"] += f"; {ma_ms:.3f} in {ma_rec['tag']}"
        if there == "max-autotune":
            best_text = (f"{v.best_mode} (max-autotune not timed here; the fastest mode in "
                         f"{ma_rec['tag']})")
        else:
            rel_speed = vm.ms[there]["median_ms"] / ma_ms
            best_text = (f"{v.best_mode} (max-autotune not timed here; in {ma_rec['tag']} "
                         f"{rel_speed:.2f}x of {there}'s speed)")
    mark = "" if label == "dossier" else f" ({label})"
    by = row.get("compare_by") or {}
    vcg, vbase = View(by.get("dossier-cg") or {}), View(by.get("dossier-base") or {})
    fast_route = (short_route(rel.get("shipped_route"), rel.get("baseline_route"))
                  if rel.get("ok") else "-")
    over_best = v.over_best(label) if label in SERVED_KEYS else None
    return {"config": config, "release": release_cell(rel), "release_wall": builds(rel),
            "mat": release_cell(mat) if mat else "not run", "mat_wall": builds(mat),
            "mat_knob": knob_screened(mat, "-inductor:max_autotune=true") if mat else "-",
            **modes,
            "served_label": label, "fast_route": fast_route,
            "dossier": v.served_cell(label) + mark,
            "dossier_mat": View(by.get("dossier-mat") or {}).served_cell("dossier-mat")
            + (f" ({by['dossier-mat']['tag']})" if by.get("dossier-mat") else ""),
            "cg": one_route_cell(cg), "cg_wall": builds(cg),
            "cg_dossier": vcg.served_cell("dossier"), "dossier_cg": vcg.served_cell("dossier-cg"),
            "cg_best": vcg.best(),
            "cg_dossier_vs_best": _fmt_x(vcg.over_best("dossier"), 3),
            "cg_vs_best": _fmt_x(vcg.over_best("dossier-cg"), 3),
            "cg_vs_dossier": _fmt_x(vcg.over("dossier-cg", "dossier"), 3),
            "cg_tags": ",".join(sorted({r["tag"] for r in (cg, by.get("dossier-cg")) if r})),
            "base": one_route_cell(base), "base_wall": builds(base),
            "dossier_base": vbase.served_cell("dossier-base"), "base_best": vbase.best(),
            "base_vs_best": _fmt_x(vbase.over_best("dossier-base"), 3),
            "base_tags": ",".join(sorted({r["tag"] for r in (base, by.get("dossier-base"))
                                          if r})),
            "best": best_text,
            "vs_best": _fmt_x(over_best) + (mark if over_best else ""),
            "tags": ",".join(sorted({r["tag"] for r in (rel, mat, cg, base, cmp_) if r}))}


SPLIT_KEYS = ("wall_ms", "lead_ms", "busy_ms", "gaps_ms", "tail_ms", "host_call_ms",
              "container_ms", "launch_api_ms", "untraced_ms")


def split_rows(rows: dict[str, dict[str, Any]]) -> list[str]:
    """Where each contender's timed call spends its time, from the profile pass of the latest
    comparison of each configuration that has the split (ms per call, medians over the calls)."""
    out = []
    for config in sorted(rows, key=_order):
        cmp_ = rows[config].get("compare") or {}
        for label, prof in (cmp_.get("profile") or {}).items():
            sp = (prof or {}).get("split") or {}
            if "wall_ms" not in sp:
                continue
            top = ", ".join(f"{h['name']} {h['self_ms_per_call']:.3f}"
                            for h in sp.get("host_top", [])[:4])
            cells = " | ".join("-" if sp.get(k) is None else f"{sp[k]:.3f}" for k in SPLIT_KEYS)
            out.append(f"| {config} | {label} | {cells} | {top} | {cmp_['tag']} |")
    return out


def _table(rows: dict[str, dict[str, Any]], key: str, header: str, columns: int,
           cells: Callable[[dict[str, str]], str]) -> list[str]:
    """A table of the configurations whose record has ``key``: ``header`` (its first column the
    configuration), then per configuration ``cells`` of its :func:`row_text`."""
    found = sorted((c for c in rows if rows[c].get(key)), key=_order)
    if not found:
        return []
    return ["", header, "|" + "---|" * columns,
            *(f"| {c} | {cells(row_text(c, rows[c]))} |" for c in found)]


def markdown(rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| config | shipped route over the AOTInductor default (release) | release wall, fresh "
        "builds | eager | compile default | reduce-overhead | max-autotune | dossier | best "
        "mode | dossier over the best mode | tags |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for config in sorted(rows, key=_order):
        t = row_text(config, rows[config])
        lines.append(f"| {config} | {t['release']} | {t['release_wall']} | {t['eager']} | "
                     f"{t['default']} | {t['reduce-overhead']} | {t['max-autotune']} | "
                     f"**{t['dossier']}** | {t['best']} | **{t['vs_best']}** | {t['tags']} |")
        label = t["served_label"]
        if label in ONE_ROUTE:
            _, route, what = ONE_ROUTE[label]
            cmp_tag = rows[config]["compare"]["tag"]
            rel_tag = (rows[config].get("release") or {}).get("tag")
            if rel_tag:
                shipped = f"the fast release of `{rel_tag}`, which shipped the {t['fast_route']} " \
                          f"route" + ("" if t["fast_route"] == route
                                      else f", not the {route} route served here")
            else:
                shipped = "no fast release recorded"
            notes.append(f"- {config}: the served engine is `{label}`, {what} and timed in "
                         f"`{cmp_tag}`; the release columns are {shipped}.")
    if notes:
        lines += ["", "Rows whose served engine is a one-route release's bundle (its label in "
                  "the dossier cells):", "", *notes]
    lines += _table(rows, "release_mat", (
        "| config | max_autotune release: shipped route over the default route | the "
        "max_autotune route screened over the default route | release wall, fresh builds | its "
        "engine served, ms per call |"), 5,
        lambda t: f"{t['mat']} | {t['mat_knob']} | {t['mat_wall']} | {t['dossier_mat']}")
    lines += _table(rows, "release_cg", (
        "| config | CUDA-graph release (`-cuda_graph=on` pinned): route, its reading | release "
        "wall, fresh builds | dossier, ms per call | dossier-cg, ms per call | best mode | "
        "dossier over the best mode | dossier-cg over the best mode | dossier-cg over dossier | "
        "tags |"), 10,
        lambda t: f"{t['cg']} | {t['cg_wall']} | {t['cg_dossier']} | **{t['dossier_cg']}** | "
                  f"{t['cg_best']} | {t['cg_dossier_vs_best']} | **{t['cg_vs_best']}** | "
                  f"{t['cg_vs_dossier']} | {t['cg_tags']}")
    lines += _table(rows, "release_base", (
        "| config | default-route release (`-cuda_graph=off` pinned): route, its reading | "
        "release wall, fresh builds | dossier-base, ms per call | best mode | dossier-base over "
        "the best mode | tags |"), 7,
        lambda t: f"{t['base']} | {t['base_wall']} | **{t['dossier_base']}** | {t['base_best']} "
                  f"| **{t['base_vs_best']}** | {t['base_tags']}")
    split = split_rows(rows)
    if split:
        lines += ["", "Where a timed call (the call, then the synchronize) spends its time, ms per "
                  "call, medians over the 20 calls of the profile pass (the profiler's own cost "
                  "included): wall = lead (the call's start to its first kernel's start on the "
                  "GPU) + busy (some kernel running) + gaps (the GPU idle between kernels) + tail "
                  "(the last kernel's end to the return); on the host, host call (the call's "
                  "start to the synchronize), within it the AOTInductor package's run "
                  "(container), the CUDA launch and copy calls (launch API) and the time outside "
                  "every recorded operation (untraced: Python).", "",
                  "| config | contender | wall | lead | busy | gaps | tail | host call | "
                  "container | launch API | untraced | top host events by self time | tag |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|", *split]
    return "\n".join(lines) + "\n"


def _order(config: str) -> tuple[int, int, str]:
    arch, _, batch = config.rpartition("_b")
    order = ("resnet50", "bert_base", "vit_b16", "gpt2", "convnext_t", "whisper_enc")
    return (int(batch) if batch.isdigit() else 0,
            order.index(arch) if arch in order else len(order), config)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--out-json", type=Path, default=ROOT / "bench" / "results" / "suite.json")
    ap.add_argument("--out-md", type=Path, default=ROOT / "bench" / "results" / "suite.md")
    args = ap.parse_args(argv)
    rows = collect(args.files)
    slim = {c: {"table": row_text(c, r),
                **{k: {kk: vv for kk, vv in v.items() if kk not in ("traceback", "trials")}
                   for k, v in r.items()}} for c, r in rows.items()}
    args.out_json.parent.mkdir(parents=True, exist_ok=True)
    args.out_json.write_text(json.dumps({"format": "dossier-bench-suite-summary/1",
                                         "sources": [f.name for f in args.files],
                                         "configs": slim}, indent=1, default=str) + "\n")
    args.out_md.write_text(markdown(rows))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
