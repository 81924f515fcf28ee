"""LoadGen's logs, read back: ``mlperf_log_detail.txt`` (``:::MLLOG {json}`` lines) into a
:class:`LoadGenRun`.

The logs are untrusted input whenever they are read back (from a bundle, from a folder a run
left): they are read with a size limit, line by line with a length limit, parsed as JSON data
only (never evaluated), and only the keys dossier uses are kept, each checked for its type and
range. Anything else is :class:`LogError`, one line.

LoadGen's own ``result_validity`` (``VALID`` / ``INVALID``) is kept as :attr:`LoadGenRun.loadgen_result`:
LoadGen's statement about its own constraints (minimum duration, query count, its latency
check), never dossier's verdict on a release or a host.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from dossier.errors import BundleError
from dossier.files import read_small

DETAIL = "mlperf_log_detail.txt"
"""LoadGen's machine-readable log (one ``:::MLLOG {json}`` event a line)."""
SUMMARY = "mlperf_log_summary.txt"
"""LoadGen's human-readable summary (kept as evidence; the figures are read from DETAIL)."""
KEPT = (SUMMARY, DETAIL)
"""The log files a run keeps (the trace and accuracy logs are not kept)."""

LOG_MAX_BYTES = 4 << 20
"""Largest detail log read (LoadGen writes about 30 KiB)."""
LINE_MAX = 16 << 10
"""Longest line parsed (LoadGen's are under 1 KiB)."""
LINES_MAX = 20_000
"""Most lines read."""
_PERCENTILE_KEY = re.compile(r"result_(\d{1,2}\.\d{2})_percentile_latency_ns")
_NS_MAX = 10**15
"""Largest latency accepted (about 11 days, in nanoseconds)."""


class LogError(BundleError):
    """A LoadGen log that cannot be read, or says something impossible (exit 6)."""


class LoadGenRun(BaseModel):
    """What one LoadGen run reported about itself (its own statistics)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scenario: Literal["SingleStream", "MultiStream", "Server", "Offline"]
    """LoadGen's scenario."""
    loadgen_result: Literal["VALID", "INVALID"]
    """LoadGen's own result line: its constraints held or not. Not dossier's verdict."""
    loadgen_invalid_reason: str = Field("", max_length=500)
    """LoadGen's reason for INVALID, when it gave one."""
    target_qps: float | None = Field(None, ge=0, le=1e9, allow_inf_nan=False)
    """The rate asked for (server, offline's expected rate)."""
    target_latency_ns: int | None = Field(None, ge=0, le=_NS_MAX)
    """The latency bound (server)."""
    target_percentile: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    """The bound's percentile, in percent (server)."""
    min_duration_ms: float = Field(0, ge=0, le=1e10, allow_inf_nan=False)
    """The minimum duration LoadGen ran for."""
    query_count: int = Field(ge=0, le=10**12)
    """Queries LoadGen issued."""
    overlatency_count: int | None = Field(None, ge=0, le=10**12)
    """Queries over the bound (server)."""
    scheduled_qps: float | None = Field(None, ge=0, le=1e12, allow_inf_nan=False)
    """Queries scheduled per second (server)."""
    completed_qps: float | None = Field(None, ge=0, le=1e12, allow_inf_nan=False)
    """Samples completed per second (server), or samples per second (offline)."""
    latency_ns: dict[str, int] = Field(default_factory=dict)
    """Latency by statistic: ``min``, ``mean``, ``max`` and percentiles (``50.00``, ``99.00``...)."""
    errors: int = Field(0, ge=0, le=10**12)
    """Errors LoadGen counted."""
    loadgen_version: str = Field("", max_length=100)
    """LoadGen's version string."""

    def latency_ms(self, statistic: str) -> float | None:
        """A latency statistic in milliseconds (None when LoadGen did not report it)."""
        ns = self.latency_ns.get(statistic)
        return None if ns is None else ns / 1e6

    def meets(self, bound_ns: int, percentile: float) -> bool:
        """dossier's reading of a server run: at most ``100 - percentile`` percent of the
        queries took longer than ``bound_ns`` (LoadGen's own count of them, against the bound
        it was given), no query failed, and the rate completed kept up with the rate
        scheduled (a backlog that never drains reads as a failure): within 10 %, or within
        ``2 / sqrt(queries)`` for a short run, whose completion rate is that noisy."""
        if self.overlatency_count is None or self.query_count == 0 or self.errors:
            return False
        if self.target_latency_ns != bound_ns:
            return False
        late = self.overlatency_count / self.query_count
        slack = max(0.1, 2 / math.sqrt(self.query_count))
        kept_up = (self.completed_qps or 0.0) >= (1 - slack) * (self.scheduled_qps or 0.0)
        return late <= (100.0 - percentile) / 100.0 + 1e-12 and kept_up


_NUMBERS = {"effective_target_qps": "target_qps", "effective_target_latency_ns":
            "target_latency_ns", "effective_target_latency_percentile": "target_percentile",
            "effective_min_duration_ms": "min_duration_ms", "result_query_count": "query_count",
            "result_overlatency_query_count": "overlatency_count",
            "result_scheduled_samples_per_sec": "scheduled_qps",
            "result_completed_samples_per_sec": "completed_qps",
            "result_samples_per_second": "completed_qps", "num_errors": "errors"}
_LATENCIES = {"result_min_latency_ns": "min", "result_mean_latency_ns": "mean",
              "result_max_latency_ns": "max"}
_TEXTS = {"effective_scenario": "scenario", "result_validity": "loadgen_result",
          "result_invalid_reason": "loadgen_invalid_reason", "loadgen_version":
          "loadgen_version"}


def _number(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise LogError(f"LoadGen log: {key} is not a finite number ({str(value)[:40]!r})")
    return float(value)


def parse_detail(text: str, *, where: str = DETAIL) -> LoadGenRun:
    """The run a detail log describes. LogError for a log too long, a line that is not
    LoadGen's, a value of the wrong type or range, or a log without a result."""
    fields: dict[str, object] = {}
    latency: dict[str, int] = {}
    lines = text.splitlines()
    if len(lines) > LINES_MAX:
        raise LogError(f"{where}: more than {LINES_MAX} lines")
    for number, line in enumerate(lines, 1):
        if not line.startswith(":::MLLOG "):
            continue
        if len(line) > LINE_MAX:
            raise LogError(f"{where}: line {number} is longer than {LINE_MAX} characters")
        try:
            event = json.loads(line[len(":::MLLOG "):])
        except (ValueError, RecursionError) as exc:
            raise LogError(f"{where}: line {number} is not JSON: {str(exc)[:80]}") from None
        if not isinstance(event, dict) or not isinstance(event.get("key"), str):
            raise LogError(f"{where}: line {number} is not a LoadGen event")
        key, value = event["key"], event.get("value")
        if key in _NUMBERS:
            v = _number(key, value)
            if key == "effective_target_latency_percentile":
                v *= 100.0
            fields[_NUMBERS[key]] = round(v) if _NUMBERS[key] in (
                "query_count", "overlatency_count", "errors", "target_latency_ns") else v
        elif key in _LATENCIES or _PERCENTILE_KEY.fullmatch(key):
            match = _PERCENTILE_KEY.fullmatch(key)
            name = match.group(1) if match else _LATENCIES[key]
            v = _number(key, value)
            if not 0 <= v <= _NS_MAX:
                raise LogError(f"{where}: {key} = {v:g} ns is out of range")
            latency[name] = round(v)
        elif key in _TEXTS:
            if not isinstance(value, str):
                raise LogError(f"{where}: {key} is not text")
            fields[_TEXTS[key]] = value[:500] if key == "result_invalid_reason" else value
    if "loadgen_result" not in fields or "query_count" not in fields:
        raise LogError(f"{where}: no result (the run did not finish, or this is not LoadGen's "
                       "detail log)")
    if fields.get("scenario") != "Server":  # overlatency and the bound are the server's
        for name in ("overlatency_count", "target_latency_ns", "target_percentile"):
            fields.pop(name, None)
    from pydantic import ValidationError

    try:
        return LoadGenRun.model_validate({**fields, "latency_ns": latency})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise LogError(f"{where}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None


def read_run(folder: Path) -> LoadGenRun:
    """The run whose logs are in ``folder`` (its detail log, read with a size limit)."""
    path = Path(folder) / DETAIL
    try:
        data = read_small(path, LOG_MAX_BYTES, follow=False)
    except FileNotFoundError:
        raise LogError(f"{path}: LoadGen wrote no detail log") from None
    except OSError as exc:
        raise LogError(f"{path}: {exc.strerror or exc}") from None
    return parse_detail(data.decode("utf-8", "replace"), where=str(path))
