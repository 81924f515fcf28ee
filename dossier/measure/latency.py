"""One latency figure per route: per inference, from the confirmation where it measured the
route, from screening (and said so) where it did not.

A timed sample runs one inference per input shape of the validation set, the pairs of one shape
taking turns (so caches do not flatter); with ``[timing] inputs = "pairs"`` (and in records from
before that setting) it is one pass over every pair's inputs. Every latency a reader sees is
that sample divided by the inferences in it (the header's ``inferences_per_sample``): the
median, the 90th and the 99th percentile of the per-inference time of a sample (for a model
with one input shape, of one inference), and the throughput (inferences per second over the
samples' total time, one stream). The confirmation's samples come from measuring processes of their
own in production load configuration; the screening trial's from one process beside the
baseline. Where the confirmation measured a route, its reading is the one shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from dossier.measure.record import TrialRecord

Source = Literal["confirmation", "screening"]


class RouteLatency(BaseModel):
    """A route's latency per inference, and where it was measured."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    route: str
    """The route."""
    source: Source
    """confirmation: measuring processes of their own (what the decision rests on);
    screening: its search trial only (the confirmation did not measure it)."""
    trial_index: int
    """The trial record the samples come from."""
    inferences_per_sample: int
    """Inferences in one timed sample (one per input shape, or one per pair)."""
    n: int
    """Timed samples."""
    median_ms: float
    """Median time per inference."""
    p90_ms: float
    """90th percentile of the time per inference (of a sample, divided by its inferences)."""
    p99_ms: float
    """99th percentile of the same."""
    throughput_per_s: float
    """Inferences per second, one stream: inferences over the samples' total time."""

    def text(self) -> str:
        """``0.047 ms per inference (p90 0.051, p99 0.060 ms; 21,277/s; confirmation)``."""
        return (f"{self.median_ms:.4g} ms per inference (p90 {self.p90_ms:.4g}, p99 "
                f"{self.p99_ms:.4g} ms; {self.throughput_per_s:,.0f} inferences/s; "
                + ("confirmation" if self.source == "confirmation" else "screening only")
                + ")")


def per_inference(samples_ms: Sequence[float], inferences: int, *, route: str, source: Source,
                  trial_index: int) -> RouteLatency | None:
    """The figures of ``samples_ms`` (passes of ``inferences`` inferences each); None without
    samples."""
    import numpy as np  # here: verify imports this module and must stay light

    x = np.asarray(samples_ms, dtype=float) / max(inferences, 1)
    if not len(x) or not np.all(np.isfinite(x)):
        return None
    total = float(x.sum())
    return RouteLatency(route=route, source=source, trial_index=trial_index,
                        inferences_per_sample=max(inferences, 1), n=len(x),
                        median_ms=float(np.median(x)), p90_ms=float(np.percentile(x, 90)),
                        p99_ms=float(np.percentile(x, 99)),
                        throughput_per_s=len(x) / total * 1000.0 if total > 0 else 0.0)


def confirmed(trials: Sequence[TrialRecord], route: str, baseline_route: str,
              ) -> tuple[TrialRecord, list[float]] | None:
    """The last confirmation record that measured ``route`` and its samples of it (the
    baseline: the A/A record's first load); None when the confirmation did not."""
    for t in reversed(trials):
        if t.role != "confirm" or t.route != route:
            continue
        samples = t.baseline_samples_ms if route == baseline_route else t.samples_ms
        if samples:
            return t, list(samples)
    return None


def screened(trials: Sequence[TrialRecord], route: str) -> TrialRecord | None:
    """The search (or baseline) trial that timed ``route``."""
    return next((t for t in reversed(trials) if t.role != "confirm" and t.route == route
                 and t.samples_ms), None)


def of_route(trials: Sequence[TrialRecord], route: str, baseline_route: str,
             inferences: int) -> RouteLatency | None:
    """``route``'s latency: the confirmation's reading where it measured it, else the
    screening trial's; None when it was never timed."""
    got = confirmed(trials, route, baseline_route)
    if got is not None:
        return per_inference(got[1], inferences, route=route, source="confirmation",
                             trial_index=got[0].index)
    t = screened(trials, route)
    if t is None or not t.samples_ms:
        return None
    return per_inference(t.samples_ms, inferences, route=route, source="screening",
                         trial_index=t.index)


def of_record(t: TrialRecord, inferences: int) -> RouteLatency | None:
    """The latency of the engine one record timed (its own samples)."""
    if not t.samples_ms:
        return None
    return per_inference(t.samples_ms, inferences, route=t.route,
                         source="confirmation" if t.role == "confirm" else "screening",
                         trial_index=t.index)
