"""The scenario: the load profile a release serves, as MLPerf LoadGen defines it.

``[scenario]`` in a release spec::

    [scenario]
    kind = "server"          # "single-stream" (the default), "server" or "offline"
    latency_ms = 5.0         # server: the latency bound ...
    percentile = 99.0        # ... at this percentile of the queries
    target_qps = 400         # server, optional: the rate the deployment must hold

- **single-stream** (the default): one query at a time, back to back; today's per-inference
  timing and decision, nothing else is run.
- **server**: queries arrive at random (LoadGen's Poisson arrivals) at a rate; a rate is met when
  at most ``100 - percentile`` percent of the queries take longer than ``latency_ms``. The
  metric is the highest rate met (queries per second), found by a bounded search; with
  ``target_qps`` the scenario also says whether that rate holds.
- **offline**: every query at once; the metric is throughput (inferences per second), each
  query one validation input as the spec's data sets shape it (their batch).

Every number is bounded and checked before anything runs (:class:`~dossier.errors.SpecError`,
exit 3): a zero or negative rate, a percentile outside (0, 100), a bound of zero, fields that
belong to another kind. A bound below the engine's single-inference time can only be told once
the engine runs: :func:`check_bound` says it, before any LoadGen run.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dossier.errors import SpecError

ScenarioKind = Literal["single-stream", "server", "offline"]
"""The scenarios dossier runs (MLPerf LoadGen's SingleStream, Server and Offline)."""

SESSIONS_KNOB = "serving_sessions"
"""The serving knob of a backend that offers one: how many sessions (engine instances) serve
queries in parallel, one worker thread each. A load-time knob: the engine file is the same; a
server and offline scenario load that many; single-stream timing loads one."""
SESSIONS_VALUES = ("1", "2", "4")
"""The counts a backend's ``serving_sessions`` knob offers (its default: 1)."""
SWITCH_INTERVAL_S = 0.0002
"""The interpreter's thread switch interval (``sys.setswitchinterval``) of a process that serves
from several sessions: Python's default of 5 ms is how long a thread may wait for the GIL that
another session's thread holds, which alone breaks a p99 bound of a few milliseconds (one H100,
ResNet-50 b1 at p99 <= 5 ms: 2 instances served 0.25x one instance at 5 ms, 1.68x at 0.2 ms).
The scenario's worker sets it, and the load recipe says so."""


def sessions_lines(count: int, each: str) -> list[str]:
    """The load recipe's comment lines for ``count`` sessions (none for one): how many, what
    each is (``each``), and the switch interval the serving process sets."""
    if count <= 1:
        return []
    return [f"# serve with {count} {each} in parallel, one per worker thread, each made as "
            "below (the server loop is yours), and in the serving process",
            f"# sys.setswitchinterval({SWITCH_INTERVAL_S:g}): Python's 5 ms default lets a "
            "thread wait that long for the GIL (what dossier measured with)"]


BATCH_KNOB = "serving_batch"
"""The other serving knob: the most queries one call answers. A worker takes the queries
waiting for it, up to this many, and answers them with one call on their inputs concatenated
along the first axis (dynamic batching; the engine must take a batch that large). A load-time
knob: the engine file is the same; single-stream timing calls one query at a time."""
BATCH_VALUES = ("1", "4", "8")
"""The batch sizes a backend's ``serving_batch`` knob offers (its default: 1)."""
BATCH_MAX = 1024
"""The most queries per call a route read back may ask for (it is untrusted)."""
QPS_MAX = 1e7
"""The largest rate a spec may ask for (queries per second)."""
LATENCY_MS_MAX = 3_600_000.0
"""The largest latency bound (an hour, in milliseconds)."""


class ScenarioSection(BaseModel):
    """The load profile the release serves (MLPerf LoadGen's scenarios)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ScenarioKind = "single-stream"
    """single-stream (one query at a time: today's per-inference timing), server (random
    arrivals; the highest rate whose latency percentile meets the bound) or offline
    (throughput)."""
    latency_ms: float | None = Field(None, gt=0, le=LATENCY_MS_MAX, allow_inf_nan=False)
    """server: the latency bound, in milliseconds (required for server)."""
    percentile: float = Field(99.0, gt=0, lt=100, allow_inf_nan=False)
    """server: the share of queries, in percent, that must finish within ``latency_ms``."""
    target_qps: float | None = Field(None, gt=0, le=QPS_MAX, allow_inf_nan=False)
    """server: the rate the deployment must hold (queries per second); the search starts
    there and the result says whether it holds."""
    duration_s: float = Field(5.0, gt=0, le=3600, allow_inf_nan=False)
    """Each LoadGen run's minimum duration in seconds (MLPerf's official runs use 600; a
    shorter run keeps the scenario's semantics and the bundle records how long it was)."""
    min_queries: int = Field(100, ge=1, le=10**8)
    """Each LoadGen run's minimum number of queries."""
    run_timeout_s: float = Field(120.0, gt=0, le=86400, allow_inf_nan=False)
    """A LoadGen run that has not finished after this many seconds is stopped and fails."""
    search_steps: int = Field(8, ge=1, le=40)
    """server: LoadGen runs of the search for the highest rate meeting the bound, at most."""
    processes: int = Field(6, ge=1, le=100)
    """Repetitions of the scenario's decision (the unit: each measures every configuration
    once). A candidate needs every repetition to clear the minimum effect (the sign test:
    ``0.5 ** n`` below its level), so fewer than 5 can ship nothing; 6 suffice for two
    candidates at alpha 0.05."""

    @model_validator(mode="after")
    def _fields_of_the_kind(self) -> ScenarioSection:
        server_only = [name for name in ("latency_ms", "target_qps")
                       if getattr(self, name) is not None]
        if self.kind == "server" and self.latency_ms is None:
            raise ValueError("a server scenario needs latency_ms (the bound at the percentile)")
        if self.kind != "server" and server_only:
            raise ValueError(f"{', '.join(server_only)} only applies to kind = \"server\", "
                             f"not {self.kind!r}")
        return self

    @property
    def loadgen(self) -> bool:
        """Whether the scenario is run by LoadGen (every kind but single-stream)."""
        return self.kind != "single-stream"

    @property
    def bound_ns(self) -> int:
        """The server bound in nanoseconds (LoadGen's unit); 0 for other kinds."""
        return round(self.latency_ms * 1e6) if self.latency_ms is not None else 0

    def describe(self) -> str:
        """One line: ``server: p99 <= 5 ms`` (``, target 400 QPS``)."""
        if self.kind != "server":
            return self.kind
        text = f"server: p{self.percentile:g} <= {self.latency_ms:g} ms"
        return text + (f", target {self.target_qps:g} QPS" if self.target_qps else "")


def check_bound(scenario: ScenarioSection, single_ms: float, *, where: str = "scenario") -> None:
    """SpecError (exit 3) when a server scenario's bound is below ``single_ms``, the engine's
    single-inference time measured on this host: no rate can meet it."""
    if scenario.kind == "server" and scenario.latency_ms is not None \
            and scenario.latency_ms < single_ms:
        raise SpecError(f"{where}.latency_ms = {scenario.latency_ms:g} ms is below the engine's "
                        f"single-inference time here ({single_ms:.3g} ms): no rate can meet it",
                        hint="raise latency_ms above the time of one inference")
