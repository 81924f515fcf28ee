"""Interop with trtexec's tuning cache (``--tuningCacheFile``, TensorRT >= 11.1).

The file is JSON Lines: one header line, then one line per finished iteration::

    {"tuner_version", "accuracy_algorithm", "accuracy_parameter": {"atol", "rtol", "epsilon"},
     "searching_algorithm", "command_line", "default_build_route", "tuning_expr",
     "files": {"onnx", "save_engine", "inputs", "ref_outputs"}, "argv"}
    {"iter", "build_route", "crash", "error_message", "accuracy_loss", "gpu_time"}

What trtexec does *not* record, and so cannot be recovered here: whether an iteration failed the
accuracy check (it shows only as ``crash: false`` with ``error_message: "child exited with
status 1"`` and a loss >= epsilon), the loss of any validation pair but the last, timing
statistics (``gpu_time`` is one mean that includes warm-up runs), trial wall time, start times,
file hashes, the host, and the winner (it is only in trtexec's log).

Reading is lenient where trtexec may add fields (unknown keys are kept) and strict on the
fields this module uses; a malformed line is an :class:`TrtexecCacheError` naming its line.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dossier.cache import FileIdentity
from dossier.diskfull import output_error
from dossier.errors import InputError, OutputError, SelectionError
from dossier.files import (
    new_staging,
    remove_stale_staging,
    rename_noreplace,
    write_durable,
)
from dossier.hashing import digest_file
from dossier.routes import Route
from dossier.trial import Outcome, TrialRecord

METRICS = {"L0": "l0", "L1": "l1", "L2": "l2", "LInf": "linf", "Cosine": "cos"}
"""trtexec's ``accuracy_algorithm`` names to dossier's metric names."""
STRATEGIES = ("fast", "full", "mixed")
"""trtexec's ``--tuningSearch`` values."""
LAST_PAIR = "last-pair"
"""Key of the one loss set trtexec keeps (each validation pair overwrites the previous one's)."""
CRASH_OUTCOMES = (Outcome.CRASHED, Outcome.BUILD_FAILED, Outcome.TIMEOUT, Outcome.RUNTIME_ERROR)
"""Outcomes exported as ``crash: true``."""
SOURCE = "trtexec tuning cache"
"""``extra["source"]`` of every trial record read from a trtexec cache (how a search record
that dossier did not measure is recognised, e.g. by ``explain``)."""

_BUILD_FAILED = re.compile(r"build\w*\b.*\bfail|fail\w*\b.*\bbuild|setBuildRoute", re.IGNORECASE)
"""Wording that marks a crash as a failed build (see :func:`to_trial_records`)."""


class TrtexecCacheError(InputError):
    """A trtexec tuning cache that cannot be read."""

    hint = "pass the file trtexec wrote with --tuningCacheFile, unchanged"


class _Read(BaseModel):
    # strict: a JSON string is not silently taken for a number or a bool
    model_config = ConfigDict(frozen=True, extra="allow", strict=True)


class TrtexecAccuracyParameter(_Read):
    """``accuracy_parameter`` of the header."""

    atol: float
    """Absolute tolerance (``--atol``; l0 only)."""
    rtol: float
    """Relative tolerance (``--rtol``; l0 only)."""
    epsilon: float
    """``--accuracyThreshold``: an iteration fails when a loss is >= this."""


class TrtexecFiles(_Read):
    """``files`` of the header: absolute paths, inputs and references of validation pair 0 only."""

    onnx: str | None = None
    """The model (``--onnx``)."""
    save_engine: str | None = None
    """Where the winner was copied (``--saveEngine``)."""
    inputs: dict[str, str] = Field(default_factory=dict)
    """Input tensor name to raw input file (``--loadInputs``)."""
    ref_outputs: dict[str, str] = Field(default_factory=dict)
    """Output tensor name to raw reference file (``--loadRefOutputs``)."""


class TrtexecHeader(_Read):
    """Line 1 of a trtexec tuning cache, fields in the order trtexec writes them."""

    tuner_version: str
    """The tuner version of the knob database."""
    accuracy_algorithm: Literal["L0", "L1", "L2", "LInf", "Cosine"]
    """Loss metric (``--accuracyAlgorithm``)."""
    accuracy_parameter: TrtexecAccuracyParameter
    """Tolerances and threshold."""
    searching_algorithm: Literal["fast", "full", "mixed"]
    """``--tuningSearch``."""
    command_line: str
    """The shell-quoted command line."""
    default_build_route: str
    """Every knob at its default, in the knob database's order."""
    tuning_expr: str
    """The expanded ``--tuneBuildRoutes`` expression."""
    files: TrtexecFiles
    """Absolute paths of the files the search read and wrote."""
    argv: list[str]
    """The argument vector ``--continue`` replays."""

    @property
    def metric(self) -> str:
        """dossier's name of the loss metric (``l0``, ``l1``, ``l2``, ``linf``, ``cos``)."""
        return METRICS[self.accuracy_algorithm]

    @property
    def epsilon(self) -> float:
        """The accuracy threshold."""
        return self.accuracy_parameter.epsilon


class TrtexecIteration(_Read):
    """One iteration line of a trtexec tuning cache."""

    iter: int = Field(ge=0)
    """Index within its phase (the phase 2 of ``mixed`` starts again at 0)."""
    build_route: str
    """The route built, tokens in knob-database order."""
    crash: bool
    """True when the child left no result: a failed build, a signal, a failed fork."""
    error_message: str = ""
    """Why the child failed; "child exited with status 1" for an accuracy failure."""
    accuracy_loss: dict[str, float | None] | None = None
    """Loss per output of the last validation pair; null when crashed or without references
    (a null loss is trtexec's JSON for NaN)."""
    gpu_time: float | None = None
    """Mean GPU compute time in ms over every inference of the child, warm-up included."""

    @field_validator("error_message", mode="before")
    @classmethod
    def _null_message(cls, value: object) -> object:
        return "" if value is None else value


# --------------------------------------------------------------------------------------------
# Reading


def read_trtexec_cache(path: Path) -> tuple[TrtexecHeader, list[TrtexecIteration]]:
    """Read a trtexec tuning cache.

    Blank lines are skipped (trtexec counts only non-empty lines when it resumes). A final line
    without a newline that does not parse is a torn write and is ignored; one that parses is
    kept. Raises TrtexecCacheError (naming the line) for anything else that is not a header or
    an iteration.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TrtexecCacheError(f"cannot read trtexec tuning cache {path}: "
                                f"{exc.strerror or exc}") from None
    lines = raw.split(b"\n")
    torn_at = len(lines) if raw.endswith(b"\n") or not raw else len(lines) - 1
    if not lines[0].strip():
        raise TrtexecCacheError(f"{path} is not a trtexec tuning cache (line 1, the header, "
                                "is empty)")
    header_data = _json_line(path, 1, lines[0])
    if isinstance(header_data, dict) and header_data.get("kind") == "header":
        raise TrtexecCacheError(f"{path} is a dossier tuning cache, not a trtexec one",
                                hint="dossier reads its own caches with `tune --continue`")
    try:
        header = TrtexecHeader.model_validate(header_data)
    except ValidationError as exc:
        raise TrtexecCacheError(f"{path} line 1 is not a trtexec tuning cache header "
                                f"({_first(exc)})") from None
    iterations: list[TrtexecIteration] = []
    for index, line in enumerate(lines[1:], start=1):
        if not line.strip():
            continue
        try:
            iterations.append(TrtexecIteration.model_validate(_json_line(path, index + 1, line)))
        except ValidationError as exc:
            if index == torn_at:
                break
            raise TrtexecCacheError(f"{path} line {index + 1} is not a trtexec iteration "
                                    f"({_first(exc)})") from None
        except TrtexecCacheError:
            if index == torn_at:
                break
            raise
    return header, iterations


def _json_line(path: Path, number: int, line: bytes) -> Any:
    try:
        return json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise TrtexecCacheError(f"{path} line {number} is not UTF-8 text") from None
    except (ValueError, RecursionError) as exc:
        raise TrtexecCacheError(f"{path} line {number} is not JSON ({exc})") from None


def _first(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "line"
    return f"{where}: {err.get('msg', 'invalid')}"


# --------------------------------------------------------------------------------------------
# Judging, as trtexec would and as dossier does


def _failing_losses(it: TrtexecIteration, epsilon: float) -> list[tuple[str, float | None]]:
    return [(name, loss) for name, loss in (it.accuracy_loss or {}).items()
            if loss is None or not math.isfinite(loss) or loss >= epsilon]


def trtexec_winner(iterations: Sequence[TrtexecIteration], epsilon: float) -> int | None:
    """The position (in ``iterations``) of the route trtexec would ship, None if none qualifies.

    trtexec's rule: among iterations whose child exited 0, the lowest ``gpu_time``, with a
    strict ``<`` so the first of equal times wins. Read back from the cache, that is: not
    crashed, no error message (the message is only set for a non-zero exit, e.g. "child exited
    with status 1" after an accuracy failure), every loss below ``epsilon``, and a gpu_time.

    A null loss (trtexec's JSON for NaN) counts as failing here. trtexec itself compares
    ``NaN >= epsilon`` as false and would have passed it: this is the one place where this
    function is stricter than the tool it reproduces. The position, not the ``iter`` field, is
    returned because ``mixed`` restarts ``iter`` at 0 in phase 2.
    """
    best: int | None = None
    best_time = math.inf
    for pos, it in enumerate(iterations):
        if it.crash or it.error_message or it.gpu_time is None or not math.isfinite(it.gpu_time):
            continue
        if _failing_losses(it, epsilon):
            continue
        if it.gpu_time < best_time:
            best, best_time = pos, it.gpu_time
    return best


def to_trial_records(header: TrtexecHeader,
                     iterations: Sequence[TrtexecIteration]) -> list[TrialRecord]:
    """dossier trial records for trtexec's iterations (one per line, in file order).

    Outcome:

    - ``crash: true``: ``build_failed`` when the message says so (the words "build" and "fail"
      together, or "setBuildRoute"), else ``crashed``. trtexec records a failed build as a crash
      (a child that builds nothing writes no result), so only the wording can tell them apart,
      and a crash whose message does not say "build" may still have been one.
    - not crashed, some loss >= epsilon (or null, i.e. NaN): ``rejected``, the reason naming the
      output, the loss and the threshold.
    - not crashed, every loss passing, but an error message (a non-zero exit trtexec excluded
      from selection for another reason): ``runtime_error`` with that message.
    - else ``ok``.

    What cannot be honest is not invented: ``timing`` and ``comparison`` are None (``gpu_time``
    is one mean including warm-up, not a sample set; it is in ``extra["trtexec_gpu_time_ms"]``),
    ``trial_s`` is 0.0 only because the model requires a number (``extra["trial_s"] ==
    "unknown"``), ``started_at`` is "unknown". Losses are ``{"last-pair": {output: loss}}``:
    trtexec keeps one loss per output, the last validation pair's. ``index`` is the position in
    the file (``extra["trtexec_iter"]`` keeps trtexec's own counter); the first iteration of a
    ``fast`` or ``mixed`` search is the baseline.
    """
    eps = header.epsilon
    records = []
    for pos, it in enumerate(iterations):
        try:
            route = Route.parse(it.build_route).text()
        except SelectionError as exc:
            raise TrtexecCacheError(f"iteration {pos} (iter {it.iter}): build route "
                                    f"{it.build_route!r} does not parse ({exc})") from None
        extra = {"source": SOURCE, "trtexec_iter": str(it.iter),
                 "trtexec_build_route": it.build_route, "trial_s": "unknown",
                 "metric": header.metric, "threshold": repr(eps),
                 "trtexec_row": json.dumps(it.model_dump(mode="json"), ensure_ascii=False)}
        if it.gpu_time is not None:
            extra["trtexec_gpu_time_ms"] = repr(it.gpu_time)
            extra["trtexec_gpu_time_note"] = "mean of every inference, warm-up included"
        losses = None
        worst = None
        if it.accuracy_loss is not None:
            losses = {LAST_PAIR: dict(it.accuracy_loss)}
            extra["losses"] = ("last-pair: trtexec keeps one loss per output, the last "
                               "validation pair's")
            finite = [v for v in it.accuracy_loss.values() if v is not None]
            worst = max(finite) if finite else None
        failing = _failing_losses(it, eps)
        reason: str | None
        if it.crash:
            outcome = Outcome.BUILD_FAILED if _BUILD_FAILED.search(it.error_message) \
                else Outcome.CRASHED
            reason = it.error_message or "trtexec recorded a crash without a message"
        elif failing:
            outcome = Outcome.REJECTED
            name, loss = failing[0]
            reason = (f"output {name!r} loss is null (NaN in trtexec's result)" if loss is None
                      else f"output {name!r} {header.metric} loss {loss:g} >= threshold {eps:g}")
            if it.error_message:
                reason += f" ({it.error_message})"
        elif it.error_message:
            outcome, reason = Outcome.RUNTIME_ERROR, it.error_message
        else:
            outcome, reason = Outcome.OK, None
        role: Literal["baseline", "search"] = "baseline" if pos == 0 and header.searching_algorithm in ("fast", "mixed") \
            else "search"
        records.append(TrialRecord(
            index=pos, route=route, role=role, outcome=outcome, reason=reason, losses=losses,
            worst_loss=worst, timing=None, comparison=None, trial_s=0.0, started_at="unknown",
            extra=extra))
    return records


# --------------------------------------------------------------------------------------------
# Writing


def make_trtexec_header(*, tuner_version: str, metric: str, atol: float, rtol: float,
                        epsilon: float, strategy: str, default_build_route: str,
                        tuning_expr: str, command_line: str = "", onnx: str | None = None,
                        save_engine: str | None = None, inputs: dict[str, str] | None = None,
                        ref_outputs: dict[str, str] | None = None,
                        argv: Sequence[str] = ()) -> TrtexecHeader:
    """A trtexec header from dossier's names (``metric`` l0/l1/l2/linf/cos). InputError when
    the metric or the strategy has no trtexec equivalent."""
    by_ours = {v: k for k, v in METRICS.items()}
    if metric not in by_ours:
        raise InputError(f"metric {metric!r} has no trtexec equivalent",
                         hint=f"trtexec knows {', '.join(by_ours)}")
    if strategy not in STRATEGIES:
        raise InputError(f"strategy {strategy!r} has no trtexec equivalent",
                         hint=f"trtexec knows {', '.join(STRATEGIES)}")
    return TrtexecHeader(
        tuner_version=tuner_version, accuracy_algorithm=by_ours[metric],  # type: ignore[arg-type]
        accuracy_parameter=TrtexecAccuracyParameter(atol=atol, rtol=rtol, epsilon=epsilon),
        searching_algorithm=strategy,  # type: ignore[arg-type]
        command_line=command_line, default_build_route=default_build_route,
        tuning_expr=tuning_expr,
        files=TrtexecFiles(onnx=onnx, save_engine=save_engine, inputs=dict(inputs or {}),
                           ref_outputs=dict(ref_outputs or {})),
        argv=list(argv))


def to_trtexec_iterations(records: Sequence[TrialRecord]) -> list[TrtexecIteration]:
    """trtexec iteration lines for dossier trials (see :func:`write_trtexec_cache`). A record
    read from trtexec (``extra["trtexec_row"]`` whose route is the record's) is written back as
    trtexec wrote it."""
    out = []
    for rec in records:
        original = _original_row(rec)
        if original is not None:
            out.append(original)
            continue
        crash = rec.outcome in CRASH_OUTCOMES
        loss = None
        if rec.losses and not crash:
            last = list(rec.losses.values())[-1]
            loss = {k: (v if v is not None and math.isfinite(v) else None)
                    for k, v in last.items()}
        gpu_time = None
        if not crash:
            if rec.timing is not None:
                gpu_time = rec.timing.median_ms
            elif "trtexec_gpu_time_ms" in rec.extra:  # a record read from trtexec keeps its mean
                try:
                    gpu_time = float(rec.extra["trtexec_gpu_time_ms"])
                except ValueError:
                    gpu_time = None
        if gpu_time is not None and not math.isfinite(gpu_time):
            gpu_time = None
        out.append(TrtexecIteration(iter=rec.index, build_route=rec.route, crash=crash,
                                    error_message=rec.reason or "", accuracy_loss=loss,
                                    gpu_time=gpu_time))
    return out


def _original_row(rec: TrialRecord) -> TrtexecIteration | None:
    text = rec.extra.get("trtexec_row")
    if text is None:
        return None
    try:
        row = TrtexecIteration.model_validate_json(text)
        same = Route.parse(row.build_route).text() == rec.route
    except (ValidationError, SelectionError):
        return None
    return row if same else None


def write_trtexec_cache(path: Path, header: TrtexecHeader, records: Sequence[TrialRecord], *,
                        overwrite: bool = False) -> None:
    """Export dossier trials as a trtexec tuning cache.

    One header line (fields in trtexec's order), then one line per record: ``iter`` = the
    trial index, ``build_route`` = the canonical route, ``crash`` = the outcome is crashed,
    build_failed, timeout or runtime_error, ``error_message`` = the reason or "",
    ``accuracy_loss`` = the last validation pair's losses (null when crashed or none), and
    ``gpu_time`` = the candidate's median in ms (or, for a record read from trtexec, its
    original mean), null when not timed.

    Records read from a trtexec cache are written back as read (see
    :func:`to_trtexec_iterations`). Lost in the export of dossier's own trials: every
    validation pair's loss but the last; the difference between
    build_failed, crashed, timeout and runtime_error (all ``crash: true``); that ``rejected``
    was an accuracy failure (only ``crash: false``, the reason and the loss say so); timing
    statistics, raw samples and the comparison with the baseline; build and trial times, start
    times, engine files and digests; session and decision records (trtexec writes no winner
    row); input digests and the host. Routes are written sorted by knob name, not in the knob
    database's order (TensorRT parses each token separately, so this does not change a build).
    ``gpu_time`` then holds a median of warm samples, which is not comparable with trtexec's
    warm-up-including mean. trtexec ``--continue`` replays the header's ``argv``: an exported
    file is for reading and auditing, not for resuming with trtexec unless ``argv`` is real.

    Raises OutputError when ``path`` exists (unless ``overwrite``) or cannot be written,
    DiskFullError (exit 74) when its file system is full; either way nothing is left at ``path``
    but what was there.
    """
    path = Path(path)
    try:
        lines = [_dumps(header.model_dump(mode="json"))]
    except ValueError:
        raise InputError("the trtexec header holds a NaN or infinite number; trtexec's JSON "
                         "reader cannot read it") from None
    lines += [_dumps(it.model_dump(mode="json")) for it in to_trtexec_iterations(records)]
    if not overwrite and os.path.lexists(path):
        raise OutputError(f"{path} exists already", hint="choose another path")
    # a staging file beside it, renamed into place: an interrupted or failed write (a full
    # disk: exit 74) leaves the earlier file or none, never half a cache
    remove_stale_staging(path.parent)
    staging = new_staging(path.parent, path.name, directory=False)
    try:
        write_durable(staging, ("\n".join(lines) + "\n").encode("utf-8"))
        (os.replace if overwrite else rename_noreplace)(staging, path)
    except FileExistsError:
        raise OutputError(f"{path} exists already", hint="choose another path") from None
    except OSError as exc:
        raise output_error(exc, path.parent, f"writing {path.name}", f"write {path}") from exc
    finally:
        staging.unlink(missing_ok=True)  # gone already once renamed


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, allow_nan=False)


# --------------------------------------------------------------------------------------------
# Files named in the header


def hash_header_files(header: TrtexecHeader) -> dict[str, FileIdentity | None]:
    """xxh3-128 identity of every file the header names: keys ``onnx``, ``save_engine``,
    ``inputs:<tensor>``, ``ref_outputs:<tensor>``; None where the file does not exist (or the
    header names none). trtexec records no hashes itself, so this is what ties a cache to the
    files it was made from, as far as they are still there. Raises InputError when a file
    exists but cannot be read."""
    named: dict[str, str | None] = {"onnx": header.files.onnx,
                                    "save_engine": header.files.save_engine}
    named.update({f"inputs:{k}": v for k, v in header.files.inputs.items()})
    named.update({f"ref_outputs:{k}": v for k, v in header.files.ref_outputs.items()})
    out: dict[str, FileIdentity | None] = {}
    for key, name in named.items():
        if not name or not Path(name).is_file():
            out[key] = None
            continue
        try:
            digest, size = digest_file(Path(name))
        except OSError as exc:
            raise InputError(f"cannot read {name} (named by the trtexec cache as {key}): "
                             f"{exc.strerror or exc}") from None
        out[key] = FileIdentity(path=name, size=size, digest=digest)
    return out
