"""Replay strategies over searches whose every route is known, and report the share of the
optimum each reaches at N builds (Kernel Tuner's methodology: strategies cost nothing to replay).

Two sources of routes:

* ``--landscape KNOBS``: the synthetic landscape of :mod:`dossier_test_backends.landscape.space`
  (interactions, routes that fail to build or break accuracy, a known optimum); each measured
  speedup is the true one times ``exp(N(0, noise))``, drawn once per route and seed.
* ``--cache RUN/tuning-cache.jsonl``: a recorded ``full`` search (every route measured once, the
  knob database in ``RUN/knobs.json``); a strategy's route reads its recorded trial, and the
  optimum is the best admissible speedup recorded (``full``'s own choice is reported beside).

Each strategy (fast, mixed, random, budget) walks the space as the tuner would drive it (results
fed back after each route), up to ``--builds`` routes. After N builds the search's pick is the
admissible route with the highest *measured* speedup (what the confirmation would be offered
first); its *true* speedup over the optimum's is the share reached. A route counts as "faster"
for ``mixed`` when its measured speedup is at least 1 + the minimum effect (2%). fast and mixed
draw nothing at random, but the measurement noise differs per seed.

Writes ``bench/results/replay-<name>.json`` (every seed's curve, medians, the count of seeds
within 2% of the optimum at each N) and ``.md`` (a short table), each naming its command:

    python bench/replay.py --landscape 30 --seeds 10 --builds 150
    python bench/replay.py --landscape 30 --landscapes 0-9 --seeds 10 --builds 150
    python bench/replay.py --cache RUN/tuning-cache.jsonl --seeds 10
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "plugins"))  # the test-only landscape, never installed

from dossier_test_backends.landscape.space import (  # noqa: E402
    Landscape,
    knob_database,
    selection_text,
)

from bench.provenance import provenance  # noqa: E402
from dossier.knobs import KnobDatabase  # noqa: E402
from dossier.routes import Route, Selection  # noqa: E402
from dossier.strategies import BudgetStrategy, FastStrategy, MixedStrategy, RandomStrategy  # noqa: E402
from dossier.strategies.interface import Strategy  # noqa: E402
from dossier.strategies.spend import DEFAULT_PATIENCE, Limits  # noqa: E402
from dossier.trial import Outcome  # noqa: E402

STRATEGIES = ("fast", "mixed", "random", "budget")
MIN_EFFECT = 0.02
PATIENCE = DEFAULT_PATIENCE
WITHIN = 0.02
"""A pick within this share of the optimum's speed counts as reaching it."""


@dataclass(frozen=True)
class _Speedup:
    speedup: float


@dataclass(frozen=True)
class Replayed:
    """A replayed trial: what a strategy is told (measured) and what is true."""

    route: str
    outcome: Outcome
    comparison: _Speedup | None
    true_speedup: float | None
    trial_s: float = 1.0

    @property
    def admissible(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def faster(self) -> bool:
        return self.comparison is not None and self.admissible and \
            self.comparison.speedup >= 1 + MIN_EFFECT


@dataclass
class Space:
    """What a replay walks: a selection, its knob database, and a measurement per route."""

    name: str
    selection: Selection
    db: KnobDatabase
    measure: Callable[[Route, int], Replayed]
    optimum: float
    notes: dict[str, Any]


def landscape_space(knobs: int, noise: float, landscape_seed: int, weak: float = 0.0,
                    guarded: float = 0.2) -> Space:
    """The synthetic landscape of ``knobs`` knobs (the minor knobs' effects at most ``weak``;
    a block guarded with chance ``guarded``), measured with log-normal noise ``noise``."""
    land = Landscape.generate(knobs, landscape_seed, weak, guarded)
    db = knob_database(land)
    selection = Selection.parse(selection_text(land), db)
    _, best = land.optimum()

    def measure(route: Route, seed: int) -> Replayed:
        values = route.as_dict()
        feas = land.feasibility(values)
        if feas != "ok":
            return Replayed(route.text(), Outcome(feas), None, None)
        true = land.speedup(values)
        rng = random.Random(zlib.crc32(f"{seed}:{route.text()}".encode()))
        return Replayed(route.text(), Outcome.OK, _Speedup(true * math.exp(rng.gauss(0, noise))),
                        true)

    size = math.prod(len(v) for v in land.values.values())
    name = f"landscape-{knobs}" + (f"-weak{weak:g}" if weak else "") + \
        (f"-guarded{guarded:g}" if guarded != 0.2 else "") + \
        (f"-seed{landscape_seed}" if landscape_seed else "")
    return Space(name, selection, db, measure, best,
                 {"knobs": knobs, "routes": size, "noise": noise, "weak": weak, "guarded": guarded,
                                 "landscape_seed": landscape_seed,
                                 "optimum_speedup": round(best, 4)})


def cache_space(path: Path) -> Space:
    """A recorded ``full`` search: every route read from its tuning cache."""
    from dossier.cache import TuningCache
    from dossier.strategies.full import cartesian

    cache = TuningCache.open(path)
    db = KnobDatabase.model_validate_json((path.parent / "knobs.json").read_text())
    selection = Selection.parse(cache.header.spec.tune.selection, db)
    trials = {t.route: t for t in cache.trials if t.role != "confirm"}
    # routes that differ only in knobs without effect under them (a quantization setting of a
    # route that does not quantize) build and run one engine: the search measured one of them
    from dossier.backends import get_backend

    backend = get_backend(cache.header.backend)

    def canonical(route: Route) -> str:
        inert = backend.inert_knobs(route, db)
        return Route.of({k: db.get(k).default if k in inert else v
                         for k, v in route.as_dict().items()}).text()

    by_canonical = {canonical(Route.parse(r)): t for r, t in trials.items()}
    for r in cartesian(selection):
        if r.text() not in trials and canonical(r) in by_canonical:
            trials[r.text()] = by_canonical[canonical(r)]
    missing = [r.text() for r in cartesian(selection) if r.text() not in trials]
    if missing:
        raise SystemExit(f"{path}: not a full search: {len(missing)} routes of its selection "
                         f"are not recorded (e.g. {missing[0]})")

    def measure(route: Route, seed: int) -> Replayed:
        t = trials[route.text()]
        c = t.comparison if t.role != "baseline" else None
        s = c.speedup if c is not None else 1.0
        return Replayed(t.route, t.outcome, _Speedup(s) if t.admissible else None,
                        s if t.admissible else None, t.trial_s)

    best = max((measure(Route.parse(r), 0).true_speedup or 0.0) for r in trials)
    shipped = cache.decision.shipped_route if cache.decision is not None else None
    return Space(path.parent.name, selection, db, measure, best,
                 {"cache": str(path), "routes": len(trials), "shipped_by_full": shipped,
                  "optimum_speedup": round(best, 4)})


def make(name: str, builds: int, seed: int) -> Strategy:
    """A strategy as the replay drives it (budgets in builds)."""
    limits = Limits(max_builds=builds, min_effect=MIN_EFFECT, patience=PATIENCE)
    if name == "budget":
        return BudgetStrategy(limits, seed)
    if name == "random":
        return RandomStrategy(Limits(max_builds=builds, patience=2**31), seed)
    return {"fast": FastStrategy, "mixed": MixedStrategy}[name]()


def walk(space: Space, name: str, builds: int, seed: int) -> list[float]:
    """The share of the optimum reached after each build (index i: after i + 1 builds)."""
    strategy = make(name, builds, seed)
    strategy.open(None)
    results: dict[str, Replayed] = {}
    base = space.selection.baseline(space.db)
    results[base.text()] = space.measure(base, seed)
    curve: list[float] = []
    best_measured, pick_true = 1.0, 1.0

    def note(r: Replayed) -> None:
        nonlocal best_measured, pick_true
        if r.comparison is not None and r.true_speedup is not None \
                and r.comparison.speedup > best_measured:
            best_measured, pick_true = r.comparison.speedup, r.true_speedup
        curve.append(pick_true / space.optimum)

    note(results[base.text()])
    for route in strategy.routes(space.selection, space.db, results):
        if len(results) >= builds:
            break
        if route.text() in results:
            continue
        r = space.measure(route, seed)
        results[route.text()] = r
        note(r)
    return curve


def at(curve: list[float], n: int) -> float:
    """The share reached after ``n`` builds (a search that stopped keeps its pick)."""
    return curve[min(n, len(curve)) - 1]


def report(space: Space, seeds: int, builds: int, checkpoints: list[int]) -> dict[str, Any]:
    """Every strategy over ``seeds`` seeds."""
    out: dict[str, Any] = {}
    for name in STRATEGIES:
        curves = [walk(space, name, builds, seed) for seed in range(seeds)]
        out[name] = {
            "builds_used": [len(c) for c in curves],
            "share_at": {str(n): {"median": round(sorted(at(c, n) for c in curves)[seeds // 2], 4),
                                  "min": round(min(at(c, n) for c in curves), 4),
                                  "within_2pct": sum(at(c, n) >= 1 - WITHIN for c in curves)}
                         for n in checkpoints},
            "curves": [[round(x, 4) for x in c] for c in curves]}
    return out


def markdown(data: dict[str, Any]) -> str:
    """The short table of a report."""
    cps = data["checkpoints"]
    lines = [f"# Replay: {data['space']}", "",
             f"`{data['provenance']['command']}` ({data['provenance']['date']})", "",
             f"Share of the optimum's speedup ({data['notes']['optimum_speedup']}x) reached by "
             f"the pick (best measured admissible route) at N builds: median over "
             f"{data['seeds']} seeds, and seeds within {WITHIN:.0%} of the optimum.", "",
             "| strategy | " + " | ".join(f"N={n}" for n in cps) + " | builds used (max) |",
             "|---|" + "---|" * (len(cps) + 1)]
    for name, r in data["strategies"].items():
        cells = [f"{r['share_at'][str(n)]['median']:.3f} ({r['share_at'][str(n)]['within_2pct']}"
                 f"/{data['seeds']})" for n in cps]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {max(r['builds_used'])} |")
    lines += ["", "Settings: " + ", ".join(f"{k} {v}" for k, v in data["notes"].items()), ""]
    return "\n".join(lines)


def landscapes_markdown(data: dict[str, Any]) -> str:
    """The short table of a report over several landscapes: each landscape's row, then the
    seeds within 2% summed over them."""
    n, seeds = data["checkpoints"][-1], data["seeds"]
    cps = [c for c in data["checkpoints"] if c in (100, n)]
    head = [f"{name} N={c}" for name in STRATEGIES for c in cps]
    lines = [f"# Replay: {data['space']}", "",
             f"`{data['provenance']['command']}` ({data['provenance']['date']})", "",
             f"One row a landscape (the landscape's seed): the share of its optimum reached by the "
             f"pick at N builds, median over {seeds} seeds, and seeds within {WITHIN:.0%} of the "
             "optimum.", "",
             "| landscape | optimum | " + " | ".join(head) + " |",
             "|---|---|" + "---|" * len(head)]
    total = dict.fromkeys(head, 0)
    for land in data["landscapes"]:
        cells = []
        for name in STRATEGIES:
            for c in cps:
                at_c = land["strategies"][name]["share_at"][str(c)]
                total[f"{name} N={c}"] += at_c["within_2pct"]
                cells.append(f"{at_c['median']:.3f} ({at_c['within_2pct']}/{seeds})")
        lines.append(f"| {land['landscape_seed']} | {land['optimum_speedup']}x | "
                     + " | ".join(cells) + " |")
    runs = seeds * len(data["landscapes"])
    lines.append("| all | | " + " | ".join(f"({total[h]}/{runs})" for h in head) + " |")
    return "\n".join([*lines, ""])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--landscape", type=int, metavar="KNOBS", help="synthetic landscape")
    src.add_argument("--cache", type=Path, help="tuning-cache.jsonl of a full search")
    ap.add_argument("--noise", type=float, default=0.01, help="log-normal sigma (landscape)")
    ap.add_argument("--landscape-seed", type=int, default=0)
    ap.add_argument("--landscapes", metavar="A-B", default=None, help="landscape: every "
                    "landscape of the seeds A to B, one row each (how far a result carries "
                    "beyond one landscape)")
    ap.add_argument("--guarded", type=float, default=0.2, help="landscape: the chance that a "
                    "block has a fast setting that breaks accuracy unless guarded")
    ap.add_argument("--weak", type=float, default=0.0, help="landscape: the minor knobs' "
                    "effects at most this (0: they do nothing)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--builds", type=int, default=150)
    ap.add_argument("--checkpoints", default="25,50,100,150")
    ap.add_argument("--smoke", action="store_true", help="tiny settings (tests): 10 knobs, 2 seeds, "
                    "30 builds")
    ap.add_argument("--out", type=Path, default=None, help="JSON path (default: bench/results/"
                    "replay-<space>.json; the .md beside it)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.landscape, args.seeds, args.builds, args.checkpoints = \
            args.landscape and 10, 2, 30, "10,30"
    checkpoints = [int(n) for n in args.checkpoints.split(",") if int(n) <= args.builds]
    if args.landscapes and args.landscape:
        first, last = (int(x) for x in args.landscapes.split("-"))
        lands = []
        for seed in range(first, last + 1):
            space = landscape_space(args.landscape, args.noise, seed, args.weak, args.guarded)
            got = report(space, args.seeds, args.builds, checkpoints)
            lands.append({**space.notes, "strategies": {
                k: {"builds_used": v["builds_used"], "share_at": v["share_at"]}
                for k, v in got.items()}})
        name = space.name.rsplit("-seed", 1)[0] + f"-landscapes{first}-{last}"
        data = {"space": name, "seeds": args.seeds, "builds": args.builds,
                "checkpoints": checkpoints, "landscapes": lands,
                "provenance": provenance(None if argv is None else [sys.argv[0], *argv])}
        out = args.out or ROOT / "bench" / "results" / f"replay-{name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1) + "\n")
        out.with_suffix(".md").write_text(landscapes_markdown(data))
        print(landscapes_markdown(data))
        return
    space = landscape_space(args.landscape, args.noise, args.landscape_seed, args.weak,
                            args.guarded) \
        if args.landscape else cache_space(args.cache)
    data = {"space": space.name, "seeds": args.seeds, "builds": args.builds,
            "checkpoints": checkpoints, "notes": space.notes,
            "provenance": provenance(None if argv is None else [sys.argv[0], *argv]),
            "strategies": report(space, args.seeds, args.builds, checkpoints)}
    out = args.out or ROOT / "bench" / "results" / f"replay-{space.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(data))
    print(markdown(data))


if __name__ == "__main__":
    main()
