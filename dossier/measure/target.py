"""Target conditions: what the deployment gives the engine, declared in the spec's ``[target]``.

A figure is worth shipping only together with the conditions it holds under. The spec says
what the engine will get in production: the cores it owns (``cores``: all of them, or N),
whether it shares them (``co_tenants``: 0 for a dedicated host, K for K cores kept busy by
other work), and on a GPU host whether other work shares the device (``gpu``). The default is
a dedicated, quiet host: what "the speed of my engine" means to most users.

dossier measures as close to the declaration as the host allows, and says how close:

- every screening trial and measuring process is pinned to the declared cores
  (``os.sched_setaffinity``) and, for a dedicated target, asks for a raised scheduling
  priority (``priority = "raise"``: nice :data:`RAISED_NICE` where the process may, recorded
  either way), so that what else runs on the host takes less from it;
- a shared target is measured under a load dossier starts and stops itself
  (:mod:`dossier.jobs.cotenants`: ``co_tenants`` busy processes on the same cores);
- a measurement during which *other* processes still kept the host busy
  (:meth:`~dossier.measure.conditions.Conditions.busy`) was *busier than declared*: its
  readings are taken of each block's 10th percentile instead of its median
  (:func:`estimator_for`; noise from other processes only adds time), and a route that
  differs from the baseline only in knobs whose effect depends on the load
  (:attr:`~dossier.backends.Backend.contention_knobs`) is *conditional*: its gain may be the
  load's (spinning off won 1.62x under load and lost 0.81x quiet), so it does not ship unless
  the spec opts in (``conditional = "ship"``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from dossier.measure.conditions import BUSY_SHARE, Conditions, gpu_states
from dossier.measure.timing import ROBUST, Estimator

if TYPE_CHECKING:
    from dossier.measure.record import TrialRecord

RAISED_NICE = -10
"""The nice value a measuring process of a dedicated target asks for: well above ordinary
work (a nice-0 process then gets about a tenth of a core it shares with it), not the
maximum, so the host's own services still run."""


class TargetConditions(BaseModel):
    """The spec's ``[target]``: the conditions the engine will serve under."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cores: int | Literal["all"] = "all"
    """The cores the engine owns in production: ``all`` (every core this process may use,
    ``os.sched_getaffinity``), or a number (the first N of them). Measurements are pinned to
    them."""
    co_tenants: int = Field(0, ge=0, le=1024)
    """Cores of the engine's that other work keeps busy in production: 0 for a dedicated host
    (the default); K measures the engine under K busy processes dossier runs on the same cores
    (:mod:`dossier.jobs.cotenants`), at most the engine's cores."""
    gpu: Literal["dedicated", "shared"] = "dedicated"
    """On a GPU host: whether other work computes on the engine's GPU (recorded beside the
    GPU processes each measurement saw; a CPU host cannot honour ``shared``)."""
    conditional: Literal["hold", "ship"] = "hold"
    """A route whose gain was confirmed only busier than declared, and that differs from the
    baseline only in knobs whose effect depends on the load: ``hold`` (it does not ship; the
    release says why) or ``ship`` (it ships, labelled conditional)."""
    priority: Literal["raise", "keep"] = "raise"
    """For a dedicated target: ``raise`` asks for nice :data:`RAISED_NICE` in each measuring
    process where the process may (recorded either way); ``keep`` leaves it."""

    @property
    def dedicated(self) -> bool:
        """No co-tenants declared."""
        return self.co_tenants == 0

    def text(self) -> str:
        """``all cores, dedicated`` / ``2 cores, shared with 1 busy core``."""
        cores = "all cores" if self.cores == "all" else \
            f"{self.cores} core{'s' if self.cores != 1 else ''}"
        share = "dedicated" if self.dedicated else \
            f"shared with {self.co_tenants} busy core{'s' if self.co_tenants != 1 else ''}"
        gpu = ", GPU shared" if self.gpu == "shared" else ""
        return f"{cores}, {share}{gpu}"


def usable_cores() -> list[int]:
    """The cores this process may run on (``os.sched_getaffinity``; every core where the
    platform has no affinity)."""
    getter = getattr(os, "sched_getaffinity", None)
    if getter is not None:
        return sorted(getter(0))
    return list(range(os.cpu_count() or 1))


def problems(target: TargetConditions, *, cores: Sequence[int], gpus: int | None) -> list[str]:
    """Why this host cannot honour ``target`` (empty when it can): more cores than it lets
    dossier use, more co-tenants than the engine's cores, a GPU share without a GPU."""
    out = []
    n = len(cores) if target.cores == "all" else target.cores
    if target.cores != "all" and not 1 <= target.cores <= len(cores):
        out.append(f"target.cores = {target.cores}: this host lets dossier use "
                   f"{len(cores)} core{'s' if len(cores) != 1 else ''} "
                   f"({', '.join(map(str, cores))})")
    if target.co_tenants > n:
        out.append(f"target.co_tenants = {target.co_tenants}: more busy cores than the "
                   f"engine's {n}")
    if target.gpu == "shared" and not gpus:
        out.append("target.gpu = \"shared\": this host has no GPU to share")
    return out


def cores_for(target: TargetConditions, cores: Sequence[int] | None = None) -> list[int]:
    """The cores a measurement of ``target`` is pinned to: the first ``target.cores`` of
    ``cores`` (this process's, by default), or all of them."""
    have = list(cores) if cores is not None else usable_cores()
    return have if target.cores == "all" else have[: target.cores]


def busier(c: Conditions | None, share: float = BUSY_SHARE) -> bool:
    """Whether a measurement was busier than its target declares: other processes (not
    dossier's, nor the co-tenant load it runs for a shared target) kept ``share`` of the cores
    busy, or computed on a GPU. None (not recorded) is not known to be."""
    return c is not None and c.busy(share)


def estimator_for(conditions: Iterable[Conditions | None],
                  share: float = BUSY_SHARE) -> Estimator:
    """The estimator a reading over measurements with these ``conditions`` is taken with:
    :data:`~dossier.measure.timing.ROBUST` (each block's 10th percentile) when any of them was
    busier than declared, the block median otherwise."""
    return ROBUST if any(busier(c, share) for c in conditions) else "median"


def conditional(route: dict[str, str], baseline: dict[str, str],
                contention_knobs: Iterable[str]) -> bool:
    """Whether ``route`` differs from ``baseline`` only in knobs whose effect depends on the
    load (and differs at all)."""
    knobs = set(contention_knobs)
    differ = {k for k in set(route) | set(baseline) if route.get(k) != baseline.get(k)}
    return bool(differ) and differ <= knobs


def estimator_text(estimator: Estimator | None) -> str:
    """How a reading's per-round ratios were taken, in words."""
    if estimator == ROBUST:
        return ("each block's 10th percentile (the host was busier than declared: added delay "
                "cannot inflate it)")
    return "each block's median"


def gpus_here() -> int:
    """NVIDIA GPUs this host has (the driver's ``/proc`` entries, else NVML's count)."""
    d = Path("/proc/driver/nvidia/gpus")
    try:
        if d.is_dir():
            return sum(1 for _ in d.iterdir())
    except OSError:
        pass
    return len(gpu_states())


def problems_here(target: TargetConditions) -> list[str]:
    """:func:`problems` of ``target`` on this host."""
    if target.gpu == "dedicated" and target.cores == "all" and not target.co_tenants:
        return []  # the default: every host honours it, and no GPU need be looked for
    return problems(target, cores=usable_cores(), gpus=gpus_here())


def held_conditional(trials: Sequence[TrialRecord], target: TargetConditions,
                     contention_knobs: Iterable[str], share: float = BUSY_SHARE, *,
                     hold: bool = True) -> dict[str, str]:
    """The routes a decision must hold back as conditional, each with why (a clause): routes
    whose last reading was taken busier than declared (its ``estimator`` is the robust one, or
    a measurement of it was busy) and that differ from the baseline only in
    ``contention_knobs``, under a dedicated target whose ``conditional`` is ``hold``. With
    ``hold`` false: those routes whatever the spec opts into (to label one that shipped)."""
    if not target.dedicated or (hold and target.conditional == "ship"):
        return {}
    base = next((t for t in trials if t.role == "baseline"), None)
    if base is None:
        return {}
    knobs = frozenset(contention_knobs)
    last = {t.route: t for t in trials if t.comparison is not None and t.role != "baseline"}
    out = {}
    for route, t in last.items():
        c = t.comparison
        assert c is not None
        busy = c.estimator == ROBUST or any(busier(x, share) for x in t.conditions or [])
        if busy and conditional(_values(route), _values(base.route), knobs):
            out[route] = ("was held back as conditional: it was confirmed only on a host busier "
                          "than the target declares, and differs from the baseline only in "
                          "knobs whose effect depends on the load "
                          f"({', '.join(sorted(_differ(route, base.route)))}); release on a "
                          "host as quiet as the target, or set [target] conditional = \"ship\"")
    return out


def _values(route: str) -> dict[str, str]:
    from dossier.routes import Route

    return dict(Route.parse(route).as_dict())


def _differ(a: str, b: str) -> set[str]:
    x, y = _values(a), _values(b)
    return {k for k in set(x) | set(y) if x.get(k) != y.get(k)}


def not_comparable(target: TargetConditions, *, busier_count: int | None, measurements: int,
                   of: str | None, estimator: Estimator | None,
                   conditional_shipped: bool = False) -> str | None:
    """The one line a decision whose figures do not hold for the declared target gets (None
    when they do): how many of its measurements were busier than declared, what the speedup
    was taken of, and that the latencies are as measured, under that load. The same words in
    ``release``'s last line, ``inspect``, ``explain`` and ``verify``."""
    if not busier_count and not conditional_shipped:
        return None
    parts = []
    if busier_count:
        parts.append(f"{busier_count} of {measurements} measurement(s) of the "
                     f"{of or 'search'} ran busier than declared")
    if estimator == ROBUST:
        parts.append("the readings are taken of each block's 10th percentile (added delay "
                     "cannot inflate it); median, p90, p99 and throughput are as measured, "
                     "under that load")
    if conditional_shipped:
        parts.append("the shipped route is conditional on the load ([target] conditional = "
                     "\"ship\")")
    return (f"not comparable with the declared target ({target.text()}): " + "; ".join(parts)
            + "; re-measure on a host as quiet as the target (verify --rebench there, or "
            "[timing] quiet_host = \"wait\")")
