"""Trial records built through the production judge: screening readings from
:func:`dossier.measure.timing.compare` over synthetic rounds, confirmation readings from
:func:`dossier.measure.confirmation.confirm` over simulated measuring processes. No test builds a
comparison by hand, so no test can decide by a rule production does not apply."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dossier.measure import confirmation
from dossier.measure.confirmation import Confirmation, ProcessRun
from dossier.measure.timing import TimingSettings, compare, flatten, summarize
from dossier.trial import Outcome, TrialRecord

STARTED = "2026-01-01T00:00:00+00:00"


class Simulated:
    """Measuring processes of a model host: a process's state multiplies every engine's
    latency by one factor (it cancels within the process), and changes the candidate's
    speedup by another (the H200's launch-bound baseline: a CUDA graph gained 2.2x to 3.7x
    depending on the process); each block reads its engine's latency with log-normal noise.
    ``speedups``: route -> true speedup over the baseline (1.0 when absent)."""

    def __init__(self, speedups: Mapping[str, float], *, seed: int = 0, base_ms: float = 1.0,
                 state_sd: float = 0.3, gain_sd: float = 0.0, block_sd: float = 0.03,
                 samples: int = 5) -> None:
        self.speedups = dict(speedups)
        self.rng = np.random.default_rng(seed)
        self.base_ms, self.state_sd, self.gain_sd = base_ms, state_sd, gain_sd
        self.block_sd, self.samples = block_sd, samples
        self.calls: list[list[str]] = []

    def __call__(self, engines: Sequence[tuple[Path, str]], offset: int, /, *,
                 more: bool = True) -> ProcessRun:
        self.calls.append([r for _, r in engines])
        state = float(np.exp(self.rng.normal(0, self.state_sd)))
        gain = float(np.exp(self.rng.normal(0, self.gain_sd)))
        rounds = []
        for _, route in engines:
            s = self.speedups.get(route, 1.0)
            ms = self.base_ms * state / (s * gain if s != 1.0 else 1.0)
            rounds.append([list(ms * np.exp(self.rng.normal(0, self.block_sd, self.samples)))
                           for _ in range(6)])
        return ProcessRun(rounds=rounds, warmup_runs=[5] * len(engines), wall_s=0.1)


def screening_rounds(speedup: float, *, seed: int = 0, rounds: int = 16, sd: float = 0.02,
                     base_ms: float = 10.0) -> tuple[list[list[float]], list[list[float]]]:
    """Baseline and candidate samples per round, the candidate ``speedup`` times faster."""
    rng = np.random.default_rng(seed)
    drift = np.exp(rng.normal(0, 0.05, rounds))
    base = [list(base_ms * d * np.exp(rng.normal(0, sd, 20))) for d in drift]
    cand = [list(base_ms / speedup * d * np.exp(rng.normal(0, sd, 20))) for d in drift]
    return base, cand


def screened(index: int, route: str, speedup: float, settings: TimingSettings, *,
             role: str = "search", seed: int | None = None, sd: float = 0.02,
             outcome: Outcome = Outcome.OK) -> TrialRecord:
    """A screening trial whose comparison :func:`dossier.measure.timing.compare` computed from rounds
    in which the route ran ``speedup`` times as fast as the baseline."""
    base, cand = screening_rounds(speedup, seed=index if seed is None else seed, sd=sd)
    samples, rounds = flatten(cand)
    base_samples, base_rounds = flatten(base)
    return TrialRecord(
        index=index, route=route, role=role, outcome=outcome,  # type: ignore[arg-type]
        timing=summarize(samples, settings.confidence), comparison=compare(base, cand, settings),
        samples_ms=samples, sample_rounds=rounds, baseline_samples_ms=base_samples,
        baseline_sample_rounds=base_rounds, worst_loss=1e-6, build_s=2.0, trial_s=5.0,
        phases_s={"time": 1.5}, engine=f"engines/{index}.onnx",
        started_at=f"2026-01-01T00:00:{index:02d}+00:00")


def confirmed(trials: Sequence[TrialRecord], settings: TimingSettings, speedups: Mapping[str, float],
              **model: float) -> tuple[list[TrialRecord], Confirmation]:
    """``trials`` (a baseline and screened candidates) followed by the confirmation records of
    the candidates the decision would confirm, measured in :class:`Simulated` processes where
    each route runs ``speedups[route]`` times as fast as the baseline."""
    from dossier.decision import candidates

    base = next(t for t in trials if t.role == "baseline")
    chosen = candidates(trials, settings)[: settings.confirm_top]
    measure = Simulated(speedups, **model)  # type: ignore[arg-type]
    result = confirmation.confirm((Path("base"), base.route),
                                  [(Path(t.route), t.route) for t in chosen], settings, measure)
    return [*trials, *confirmation.records(result, base, chosen, settings, len(trials),
                                           STARTED)], result
