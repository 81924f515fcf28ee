"""The workload suite's records (``suite-TAG.json`` files of ``bench/suite/run.sh``) as one
table: per configuration, the release (shipped route, its speedup over the AOTInductor default
route with the interval, wall time, builds) and the side-by-side timing (ms per call of eager,
each ``torch.compile`` mode and the served engine; the served engine's ratio to the best mode),
and, where a configuration released them too, the ``max_autotune`` release and the pinned
CUDA-graph release (``release-cg.toml``) with their engines served beside the fast release's
(``dossier-mat``, ``dossier-cg``).

    python bench/suite/summarize.py FILE [FILE ...] [--out-json J] [--out-md M]

A later file's record of a configuration replaces an earlier one's. Writes
``bench/results/suite.json`` and ``bench/results/suite.md`` by default.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODES = ("eager", "default", "reduce-overhead", "max-autotune")
KNOB_WORDS = {"-cuda_graph=on": "CUDA graph", "-inductor:freezing=true": "freezing",
              "-inductor:max_autotune=true": "max_autotune"}


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


def collect(files: list[Path]) -> dict[str, dict[str, Any]]:
    """Per configuration: its latest release, max_autotune release, CUDA-graph release and
    compare records, each with the tag it came from."""
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
            if step.get("skipped"):
                continue
            rows.setdefault(config, {})[kind] = {**step, "tag": tag}
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


def row_text(config: str, row: dict[str, Any]) -> dict[str, str]:
    rel, mat, cmp_ = row.get("release") or {}, row.get("release_mat") or {}, row.get("compare") or {}
    cg = row.get("release_cg") or {}

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
        return f"{r['wall_s']:.0f} s, {r.get('builds_fresh', '?')} of {r.get('builds', '?')}"

    # a comparison killed while compiling max-autotune keeps the timing of the others before it
    killed = bool(cmp_.get("killed")) and not cmp_.get("final")
    final = cmp_.get("final") or cmp_.get("before_max_autotune") or {}
    ms = final.get("ms_per_call") or {}
    cont = cmp_.get("contenders") or {}

    def cell(label: str) -> str:
        if label in ms:
            acc = cont.get(label, {})
            flag = "" if acc.get("admissible", True) else " (inaccurate)"
            return f"{ms[label]['median_ms']:.3f}{flag}"
        c = cont.get(label)
        if c is None:
            return "killed while compiling" if killed and label == "max-autotune" else "not run"
        return "skipped" if c.get("skipped") else "failed"

    best = final.get("best_compile_mode")
    cg_over = final.get("served_cg_over") or {}

    def cg_cell(r: dict) -> str:
        """The pinned release: the route it shipped and its reading per inference."""
        if not r:
            return "not run"
        if not r.get("ok"):
            why = r.get("error") or (r.get("stderr_tail") or "").strip().splitlines()[-1:] or ["?"]
            return f"failed: {why if isinstance(why, str) else why[0]}"[:160]
        base = next((t for t in r.get("trials") or [] if t.get("role") == "baseline"), {})
        per = (base.get("median_ms") or 0) / 2  # a sample is one pass over the two pairs
        route = r.get("shipped_route") or ""
        where = " ".join(t for t in route.split() if t.startswith(("-device=", "-dtype=")))
        return (short_route(route, where)
                + (f", {per:.3f} ms per inference (the release's reading)" if per else ""))

    return {"config": config, "release": release_cell(rel), "release_wall": builds(rel),
            "mat": release_cell(mat) if mat else "not run", "mat_wall": builds(mat),
            "mat_knob": knob_screened(mat, "-inductor:max_autotune=true") if mat else "-",
            **{m: cell(m) for m in MODES}, "dossier": cell("dossier"),
            "dossier_mat": cell("dossier-mat") if "dossier-mat" in cont else "-",
            "cg": cg_cell(cg), "cg_wall": builds(cg),
            "dossier_cg": cell("dossier-cg") if "dossier-cg" in cont else "-",
            "cg_vs_best": _fmt_x(cg_over.get(best), 3) if best else "-",
            "cg_vs_dossier": _fmt_x(cg_over.get("dossier"), 3),
            "vs_best_3": _fmt_x(final.get("served_over_best_compile"), 3),
            "best": (best or "-") + ("" if not best or "max-autotune" in ms
                                     else " (max-autotune not timed)"),
            "vs_best": _fmt_x(final.get("served_over_best_compile")),
            "tags": ",".join(sorted({r["tag"] for r in (rel, mat, cg, cmp_) if r}))}


def markdown(rows: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| config | shipped route over the AOTInductor default (release) | release wall, fresh "
        "builds | eager | compile default | reduce-overhead | max-autotune | dossier | best "
        "mode | dossier over the best mode | tags |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for config in sorted(rows, key=_order):
        t = row_text(config, rows[config])
        lines.append(f"| {config} | {t['release']} | {t['release_wall']} | {t['eager']} | "
                     f"{t['default']} | {t['reduce-overhead']} | {t['max-autotune']} | "
                     f"**{t['dossier']}** | {t['best']} | **{t['vs_best']}** | {t['tags']} |")
    mats = [c for c in rows if rows[c].get("release_mat")]
    if mats:
        lines += ["", "| config | max_autotune release: shipped route over the default route | "
                  "the max_autotune route screened over the default route | release wall, fresh "
                  "builds | its engine served, ms per call |", "|---|---|---|---|---|"]
        for config in sorted(mats, key=_order):
            t = row_text(config, rows[config])
            lines.append(f"| {config} | {t['mat']} | {t['mat_knob']} | {t['mat_wall']} | "
                         f"{t['dossier_mat']} |")
    cgs = [c for c in rows if rows[c].get("release_cg")]
    if cgs:
        lines += ["", "| config | CUDA-graph release (`-cuda_graph=on` pinned): route, its reading "
                  "| release wall, fresh builds | dossier, ms per call | dossier-cg, ms per call "
                  "| best mode | dossier over the best mode | dossier-cg over the best mode | "
                  "dossier-cg over dossier | tags |", "|---|---|---|---|---|---|---|---|---|---|"]
        for config in sorted(cgs, key=_order):
            t = row_text(config, rows[config])
            lines.append(f"| {config} | {t['cg']} | {t['cg_wall']} | {t['dossier']} | "
                         f"**{t['dossier_cg']}** | {t['best']} | {t['vs_best_3']} | "
                         f"**{t['cg_vs_best']}** | {t['cg_vs_dossier']} | {t['tags']} |")
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
