"""The tables docs/results.md and docs/timing.md lead with: one row per claim (the figure, the
host it was measured on, the command that made it, the results file), every figure computed here
from its file under bench/results, so that a table cannot say what no file holds.

    python bench/claims.py              # print both tables
    python bench/claims.py --write      # write them into the docs, between their markers

A host is what the file records (its CPU model and matrix units, or its machine); where a file
records none, the claim names the host, and the row says that the file does not.
``tests/project/test_claims.py`` checks that the tables in the docs are what this writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOCS = {"results": ROOT / "docs" / "results.md", "timing": ROOT / "docs" / "timing.md"}
BEGIN = "<!-- claims: begin (written by `python bench/claims.py --write`; do not edit) -->"
END = "<!-- claims: end -->"


@dataclass(frozen=True)
class Claim:
    """One row: what is claimed, the file that holds it and how the figure is read from it."""

    doc: str
    claim: str
    file: str
    figure: Callable[[dict[str, Any]], str]
    host: str = ""
    """The host, for a file that does not record one."""
    command: str = ""
    """The command, for a file that does not record one."""


def _releases(d: dict[str, Any]) -> str:
    """``shipped k of n: 3.18-3.27x`` over a file of releases (bench/precision.py)."""
    runs = d["releases"]
    gains = [r["speedup"] for r in runs if r.get("gain") and r.get("speedup")]
    span = f": {min(gains):.2f}-{max(gains):.2f}x" if gains else ""
    return f"a gain shipped in {len(gains)} of {len(runs)} releases{span}"


def _filter(d: dict[str, Any]) -> str:
    tight, held = d["tight_threshold"]["releases"], d["holdout_breaks_int8"]["releases"]
    return (f"int8 shipped {d['tight_threshold_int8_shipped']} of {len(tight)} under a tight "
            f"bar, {d['holdout_breaks_int8_int8_shipped']} of {len(held)} with a hold-out pair "
            "that only int8 breaks")


def _calibration(d: dict[str, Any]) -> str:
    s = d["shipped"]
    out = f"shipped {s['hits']} of {s['n']} (true speedup {d['truth']['speedup']:g}x)"
    if s["hits"] and "shipped_speedup" in d:
        out += f", median shipped speedup {d['shipped_speedup']['median']:.3f}x"
    return out


def _coverage(d: dict[str, Any]) -> str:
    c, r = d["shipped_interval_covers_truth"], d["rebench_inside_prediction"]
    return (f"shipped interval covered 1.25x in {c['hits']} of {c['n']}; re-measurements inside "
            f"the prediction interval {r['hits']} of {r['n']}")


def _h200(config: str) -> Callable[[dict[str, Any]], str]:
    def read(d: dict[str, Any]) -> str:
        c = d["configs"][config]
        s = c["shipped"]
        return (f"CUDA-graph route shipped {s['hits']} of {s['n']}: {min(c['speedups']):.2f}-"
                f"{max(c['speedups']):.2f}x, lowest lower end {c['lowest_lower_end']:.2f}x")
    return read


def _h200_prediction(d: dict[str, Any]) -> str:
    hits = n = 0
    for c in d["configs"].values():
        for key in ("fresh_inside_prediction", "next_release_inside_prediction"):
            if key in c:
                hits, n = hits + c[key]["hits"], n + c[key]["n"]
    return f"re-measurements inside the recorded prediction interval {hits} of {n}"


def _bias(d: dict[str, Any]) -> str:
    r = d["results"]

    def one(name: str) -> str:
        x = r[name]["second_over_first_in_block"]
        return f"{x['median']:.3f} [{x['ci'][0]:.3f}, {x['ci'][1]:.3f}]"
    return (f"second-in-block over first: {one('kept, 50 ms pause')} kept with the pause, "
            f"{one('kept, no pause')} without it")


def _headline(d: dict[str, Any]) -> str:
    ok = [r for r in d["releases"] if r.get("exit") == 0 and r.get("gain")]
    heads = [r["speedup"] for r in ok]
    alone = [r["alone"]["ratio"] for r in ok]
    w = d["within"]
    return (f"headline within +-25% of the engines timed alone in {w['hits']} of {w['n']}: "
            f"headline {min(heads):.2f}-{max(heads):.2f}x, alone {min(alone):.2f}-"
            f"{max(alone):.2f}x")


def _quiet(d: dict[str, Any]) -> str:
    (r,) = d["releases"]
    a = r["alone"]
    return (f"{r['shipped']} shipped at {r['speedup']:.3f}x [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] "
            f"(read of {'block medians' if r['estimator'] == 'median' else r['estimator']}); "
            f"the two engines timed alone {a['ratio']:.3f}x [{a['ci95'][0]:.3f}, "
            f"{a['ci95'][1]:.3f}]")


def _contention(d: dict[str, Any]) -> str:
    c = d["contention_only_shipped"]
    held = sum(1 for r in d["releases"] if r.get("conditional_held"))
    return (f"a contention-only route shipped {c['hits']} of {c['n']}; one was held back as "
            f"conditional in {held}")


def _power(d: dict[str, Any]) -> str:
    g, a = d["x1.25"]["shipped"], d["aa"]["shipped"]
    return (f"known 1.25x gain shipped {g['hits']} of {g['n']} (median "
            f"{d['x1.25']['shipped_speedup']['median']:.3f}x), A/A {a['hits']} of {a['n']}")


def _rebench(d: dict[str, Any]) -> str:
    h, o = d["honest_valid"], d["overstated_flagged"]
    return (f"honest bundles VALID {h['hits']} of {h['n']}; overstated {d['overstated'][0]['factor']:g}x "
            f"not VALID {o['hits']} of {o['n']}")


AMX = "Intel Xeon with AMX, 2 cores (not recorded in the file)"
CLAIMS = (
    Claim("results", "BERT-base dynamic int8 against float32 (ONNX Runtime CPU)",
          "precision-bert-amx.json", _releases, host=AMX),
    Claim("results", "BERT-base on OpenVINO's CPU device, bf16", "openvino-bert-amx.json",
          _releases),
    Claim("results", "ResNet-18 on OpenVINO's CPU device, static int8",
          "openvino-resnet18-amx.json", _releases),
    Claim("results", "ResNet-18 on OpenVINO's CPU device, static int8 (onnxruntime-openvino)",
          "openvino-resnet18.json", _releases,
          host="AMD EPYC with AVX-512 VNNI, 2 cores (not recorded in the file)"),
    Claim("results", "the accuracy filter's known answers (tblock sample)",
          "precision-filter-amx.json", _filter, host=AMX),
    Claim("results", "ResNet-50 b1 bf16, CUDA-graph route (AOTInductor)", "h200-calibration.json",
          _h200("resnet50_b1"), host="NVIDIA H200 (tags g1-g7, bench/results/h200-raw/)",
          command="bench/h200/run.sh (see docs/calibration.md)"),
    Claim("results", "BERT b1, CUDA-graph route (AOTInductor)", "h200-calibration.json",
          _h200("bert_b1"), host="NVIDIA H200 (tags g1-g7, bench/results/h200-raw/)",
          command="bench/h200/run.sh (see docs/calibration.md)"),
    Claim("timing", "a known 1.25x gain ships", "calibration-x1.25-20.json", _calibration),
    Claim("timing", "the interval and the prediction of a known 1.25x gain",
          "calibration-x1.25-20.json", _coverage),
    Claim("timing", "a known 1.05x gain ships", "calibration-x1.05.json", _calibration),
    Claim("timing", "an A/A (no gain) does not ship", "calibration-aa-20.json", _calibration),
    Claim("timing", "the prediction interval on the GPU", "h200-calibration.json",
          _h200_prediction, host="NVIDIA H200 (tags g1-g7, bench/results/h200-raw/)",
          command="bench/h200/run.sh (see docs/calibration.md)"),
    Claim("timing", "the tblock int8 sample on the quiet host (no load)",
          "conditions-headline-quiet.json", _quiet),
    Claim("timing", "the tblock int8 sample's headline under a 2-process background load",
          "conditions-headline.json", _headline),
    Claim("timing", "no contention-only route under the default target (tblock float32, "
          "2-process load)", "conditions-contention.json", _contention),
    Claim("timing", "decision power under a 2-process load", "conditions-power.json", _power),
    Claim("timing", "verify --rebench under a 2-process load: honest and overstated records",
          "conditions-rebench.json", _rebench),
    Claim("timing", "order bias of kept ONNX Runtime sessions (tblock A/A)",
          "timing-bias-kept.json", _bias,
          command="python bench/bias_check.py --sample tblock --repeats 4 --rounds 10 --only "
                  "\"new procedure\" \"kept, no pause\" \"kept, 50 ms pause\" \"kept, 50 ms "
                  "lead-in\""),
)


def _host(d: dict[str, Any], claim: Claim) -> str:
    cpu = d.get("host_cpu") or (d["host"].get("cpu") if isinstance(d.get("host"), dict)
                                else None)
    if isinstance(cpu, dict) and cpu.get("model"):
        units = [f for f in cpu.get("matrix_flags", []) if f.startswith("amx")]
        cores = d.get("cores") or (d["host"].get("cores") if isinstance(d.get("host"), dict)
                                   else None)
        return f"{cpu['model']}" + (" with AMX" if units else "") + (
            f", {cores} cores" if cores else "")
    if claim.host:
        return claim.host
    machine = d.get("machine") or d.get("host")
    if isinstance(machine, dict):
        cpus = machine.get("cpus")
        kind = machine.get("processor") or machine.get("machine") or "?"
        return f"{kind}, {cpus} CPUs" if cpus else str(kind)
    return "not recorded"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(doc: str) -> str:
    """The claims table of ``doc`` (``results`` or ``timing``), Markdown."""
    rows = ["| claim | figure | host | command | results file |", "|---|---|---|---|---|"]
    for c in CLAIMS:
        if c.doc != doc:
            continue
        d = json.loads((RESULTS / c.file).read_text(encoding="utf-8"))
        command = d.get("command") or c.command or "not recorded"
        command = command.replace("/work/main/", "")
        rows.append(f"| {_cell(c.claim)} | {_cell(c.figure(d))} | {_cell(_host(d, c))} | "
                    f"`{_cell(command)}` | `bench/results/{c.file}` |")
    return "\n".join(rows)


def current(text: str) -> str | None:
    """The table between the markers of a doc's text (None without markers)."""
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def write(doc: str) -> None:
    path = DOCS[doc]
    text = path.read_text(encoding="utf-8")
    if current(text) is None:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(f"{head}{BEGIN}\n{table(doc)}\n{END}{tail}", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the tables into the docs")
    args = parser.parse_args(argv)
    for doc in DOCS:
        if args.write:
            write(doc)
        else:
            print(f"{doc}:\n{table(doc)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
