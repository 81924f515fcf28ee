"""Engines of a backend that reloads per block (dossier.jobs.worker.timed_engines): loaded afresh
for every block when a load is quicker than the switch pause, else loaded once and kept open with
a pause before each block that follows another engine's."""

from __future__ import annotations

import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from dossier.backends import SearchTraits
from dossier.jobs.worker import timed_engines
from dossier.measure.timing import TimingSettings, sample_rounds, warm_up_each
from dossier.routes import Route
from dossier.validation import Pair


class _Runner:
    def __init__(self, name: str) -> None:
        self.name = name

    def prepare(self, inputs: Any) -> Any:
        return inputs

    def timed(self, prepared: Any) -> float:
        return 1.0


class _Backend:
    """Loads take ``load_s``; every load and every block start is logged with its time."""

    def __init__(self, load_s: float, pause_s: float) -> None:
        self.load_s = load_s
        self.traits = SearchTraits(reload_per_block=True, switch_pause_s=pause_s)
        self.loads: list[str] = []
        self.alive: list[weakref.ref[_Runner]] = []

    def load(self, engine: Path, route: Route) -> _Runner:
        time.sleep(self.load_s)
        self.loads.append(engine.name)
        r = _Runner(engine.name)
        self.alive.append(weakref.ref(r))
        return r

    def live(self) -> int:
        return sum(1 for r in self.alive if r() is not None)


GROUPS = [[Pair(name="p", inputs={"x": np.zeros(1, np.float32)}, references={})]]
PAIR = [(Path("a"), Route.parse("")), (Path("b"), Route.parse(""))]
SETTINGS = TimingSettings(samples=8, rounds=4, block_warmup=1, block_warmup_s=0)


def _run(backend: _Backend, first: tuple[Any, float] | None = None) -> list[float]:
    """Warm up and time both engines as a trial does; return the gaps before each block."""
    engines = timed_engines(backend, GROUPS, PAIR, first)  # type: ignore[arg-type]
    opened: list[float] = []
    wrapped = [_timed_open(e, opened) for e in engines]
    warm_up_each(wrapped, SETTINGS, 1)
    sample_rounds(wrapped, SETTINGS, 1)
    return opened


def _timed_open(engine: Any, opened: list[float]) -> Any:
    def open_() -> Any:
        t0 = time.perf_counter()
        fn = engine()
        opened.append(time.perf_counter() - t0)
        return fn
    return open_


def test_quick_loads_reload_for_every_block_one_engine_alive_at_a_time() -> None:
    b = _Backend(load_s=0.0, pause_s=0.05)
    peak: list[int] = []
    engines = timed_engines(b, GROUPS, PAIR)  # type: ignore[arg-type]

    def watch(e: Any) -> Any:
        def open_() -> Any:
            fn = e()
            peak.append(b.live())
            return fn
        return open_
    warm_up_each([watch(e) for e in engines], SETTINGS, 1)
    sample_rounds([watch(e) for e in engines], SETTINGS, 1)
    # 2 warm-up loads, 2 in the first round, then one a round (the last engine goes on)
    assert len(b.loads) == 2 + 2 + 3
    assert max(peak) == 1  # the previous engine is released before the next one loads


def test_quick_loads_take_no_pause() -> None:
    opened = _run(_Backend(load_s=0.0, pause_s=0.2))
    assert max(opened) < 0.1


def test_slow_loads_are_kept_and_each_switch_pauses() -> None:
    b = _Backend(load_s=0.03, pause_s=0.01)
    opened = _run(b)
    assert b.loads == ["a", "b"]  # each loaded once
    # warm-up: load a, pause + load b; round 0: pause (a after b), pause (b after a); then one
    # switch a round: every opening after the first paused
    assert len(opened) == 2 + 2 + 3
    assert all(gap >= 0.01 for gap in opened[1:])


def test_the_first_engines_given_load_time_decides() -> None:
    b = _Backend(load_s=0.0, pause_s=0.01)
    given = _Runner("given")
    _run(b, first=(given, 0.5))  # loaded for validation in 0.5 s: kept, not loaded again
    assert b.loads == ["b"]
    b = _Backend(load_s=0.0, pause_s=0.01)
    _run(b, first=(_Runner("given"), 0.001))  # quick: the first block uses it, then reloads
    assert b.loads == ["b", "a", "b", "a", "b", "a"]


def test_no_pause_configured_always_reloads() -> None:
    b = _Backend(load_s=0.02, pause_s=0.0)
    _run(b)
    assert len(b.loads) == 7
