"""A synthetic knob landscape with a known optimum: what a route's engine costs, and whether it
builds and passes accuracy, as a pure function of the route.

The knobs are split into independent blocks of one to three knobs. Inside a block, each
non-default value has a main effect on the run time, a pair of values can interact (a synergy
that helps only together, or a conflict that undoes a gain), one combination fails to build and
one value breaks accuracy unless a guard knob of its block is set with it. Blocks multiply, so
the optimum is the product of each block's best feasible assignment: known exactly, by
enumerating every block, however many knobs there are.

Nothing here imports a compiler: the replay benchmark (``bench/replay.py``) walks strategies over
it directly, and the ``landscape`` backend times real engines held to its run times.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Literal

from dossier.knobs import Knob, KnobDatabase, KnobPhase

Feasibility = Literal["ok", "build_failed", "rejected"]


@dataclass(frozen=True)
class Block:
    """Knobs whose effects interact; independent of every other block."""

    knobs: tuple[str, ...]
    """The block's knob names."""
    main: dict[tuple[str, str], float]
    """(knob, non-default value) -> its log run-time change (negative: faster)."""
    pairs: dict[tuple[tuple[str, str], tuple[str, str]], float]
    """Two (knob, value) settings -> the extra log run-time change when both are set."""
    broken: tuple[tuple[str, str], ...] | None
    """A combination of settings that fails to build (None: every combination builds)."""
    unguarded: tuple[tuple[str, str], tuple[str, str]] | None
    """(setting, guard): the setting breaks accuracy unless the guard is set with it."""

    def log_time(self, values: dict[str, str]) -> float:
        """The block's log run-time change for the route's ``values``."""
        t = sum(e for (k, v), e in self.main.items() if values.get(k) == v)
        t += sum(e for (a, b), e in self.pairs.items()
                 if values.get(a[0]) == a[1] and values.get(b[0]) == b[1])
        return t

    def feasibility(self, values: dict[str, str]) -> Feasibility:
        """Whether the block's settings build and pass accuracy."""
        if self.broken and all(values.get(k) == v for k, v in self.broken):
            return "build_failed"
        if self.unguarded:
            (k, v), (gk, gv) = self.unguarded
            if values.get(k) == v and values.get(gk) != gv:
                return "rejected"
        return "ok"


@dataclass(frozen=True)
class Landscape:
    """Knobs, their values (the first is the default) and the blocks over them."""

    values: dict[str, tuple[str, ...]]
    """Knob name -> allowed values, default first."""
    blocks: tuple[Block, ...]
    """The independent blocks; every knob is in exactly one."""

    @classmethod
    def generate(cls, knobs: int = 30, seed: int = 0, weak: float = 0.0,
                 guarded: float = 0.2) -> Landscape:
        """A landscape of ``knobs`` knobs (two to four values each), drawn from ``seed``.

        About one knob in four matters (a main effect of -12% to +6% per value); the rest move
        the run time by at most ``weak`` (0: not at all, as most knobs of a compiler do nothing
        for a given model). A block of two or three knobs holds, each with chance one
        in two: an interaction between two settings that help on their own (-2% to -8% each;
        together a synergy of a further -3% to -8%, or a conflict of +4% to +10% that undoes
        much of their sum), and a combination of two settings that fails to build; with chance
        ``guarded`` (one block in five by default) a block has a setting that is fast (-6% to -12%) but breaks accuracy unless the block's
        guard setting (+1% to +3% on its own) is set with it.
        """
        if knobs < 1:
            raise ValueError("a landscape needs at least one knob")
        rng = random.Random(seed)
        names = [f"k{i:02d}" for i in range(knobs)]
        values = {n: tuple(f"v{j}" for j in range(rng.choice((2, 2, 2, 3, 4)))) for n in names}
        blocks: list[Block] = []
        i = 0
        while i < knobs:
            size = min(rng.choice((1, 2, 2, 3)), knobs - i)
            members = tuple(names[i:i + size])
            i += size
            main: dict[tuple[str, str], float] = {}
            for k in members:
                strong = rng.random() < 0.25
                for v in values[k][1:]:
                    main[(k, v)] = math.log(1 + (rng.uniform(-0.12, 0.06) if strong
                                                 else rng.uniform(-weak, weak)))
            settings = [(k, v) for k in members for v in values[k][1:]]
            pairs: dict[tuple[tuple[str, str], tuple[str, str]], float] = {}
            broken: tuple[tuple[str, str], ...] | None = None
            unguarded: tuple[tuple[str, str], tuple[str, str]] | None = None
            if size >= 2:
                if rng.random() < 0.5:  # between two settings of their own effect
                    a, b = _two_knobs(rng, members, values)
                    for setting in (a, b):
                        main[setting] = math.log(1 + rng.uniform(-0.08, -0.02))
                    effect = (rng.uniform(-0.08, -0.03) if rng.random() < 0.6
                              else rng.uniform(0.04, 0.10))
                    pairs[(a, b)] = math.log(1 + effect)
                if rng.random() < 0.5:
                    broken = _two_knobs(rng, members, values)
                if rng.random() < guarded:
                    fast, guard = _two_knobs(rng, members, values)
                    main[fast] = math.log(1 + rng.uniform(-0.12, -0.06))
                    main[guard] = math.log(1 + rng.uniform(0.01, 0.03))
                    unguarded = (fast, guard)
            elif settings and rng.random() < 0.15:
                broken = (rng.choice(settings),)
            blocks.append(Block(members, main, pairs, broken, unguarded))
        return cls(values, tuple(blocks))

    @property
    def knobs(self) -> list[str]:
        """Knob names in order."""
        return list(self.values)

    def default(self) -> dict[str, str]:
        """The baseline: every knob at its first value."""
        return {k: v[0] for k, v in self.values.items()}

    def time(self, values: dict[str, str]) -> float:
        """Run time relative to the baseline's (1.0) of the route setting ``values`` (knobs it
        leaves out are at their default)."""
        return math.exp(sum(b.log_time(values) for b in self.blocks))

    def speedup(self, values: dict[str, str]) -> float:
        """Baseline time / the route's time."""
        return 1.0 / self.time(values)

    def feasibility(self, values: dict[str, str]) -> Feasibility:
        """``ok``, or why the route fails (the first failing block's reason)."""
        for b in self.blocks:
            f = b.feasibility(values)
            if f != "ok":
                return f
        return "ok"

    def optimum(self) -> tuple[dict[str, str], float]:
        """The fastest feasible route and its speedup over the baseline, by enumerating each
        block on its own (blocks are independent)."""
        best: dict[str, str] = {}
        for b in self.blocks:
            options = [dict(zip(b.knobs, combo))
                       for combo in itertools.product(*(self.values[k] for k in b.knobs))]
            feasible = [o for o in options if b.feasibility(o) == "ok"]
            chosen: dict[str, str] = min(feasible, key=b.log_time)
            best.update(chosen)
        return best, self.speedup(best)


def _two_knobs(rng: random.Random, members: tuple[str, ...],
               values: dict[str, tuple[str, ...]]) -> tuple[tuple[str, str], tuple[str, str]]:
    """Non-default settings of two different knobs of a block."""
    a, b = rng.sample(members, 2)
    return (a, rng.choice(values[a][1:])), (b, rng.choice(values[b][1:]))


def knob_database(landscape: Landscape, backend: str = "landscape",
                  version: str = "landscape-1") -> KnobDatabase:
    """The landscape's knobs as a knob database (build-time knobs: a route may fail to build)."""
    return KnobDatabase(backend=backend, tuner_version=version, knobs=tuple(
        Knob(name=k, values=v, default=v[0], phase=KnobPhase.BUILD,
             help="synthetic: its effect is the landscape's") for k, v in landscape.values.items()))


def selection_text(landscape: Landscape) -> str:
    """A selection that varies every knob over all its values."""
    return " ".join(f"-{k}=[{'|'.join(v)}]" for k, v in landscape.values.items())
