"""The process of one LoadGen run: ``python -m dossier.scenarios.worker REQUEST.json``, started
by :func:`dossier.scenarios.child.measure`. It loads the engine once per session (see
:mod:`dossier.scenarios.child` for the sources), times single inferences, runs LoadGen (each
call answering up to the route's ``serving_batch`` waiting queries, their inputs concatenated
along the first axis) and writes ``child.json``."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dossier.errors import DossierError, ExitCode
from dossier.files import read_small
from dossier.scenario import SWITCH_INTERVAL_S
from dossier.scenarios.child import (
    RESULT,
    SINGLE_CALLS,
    WARMUP_CALLS,
    ChildResult,
    ScenarioRequest,
)
from dossier.scenarios.driver import Answer


def _synthetic(ms: float) -> Answer:
    def answer(_: Sequence[int]) -> None:
        time.sleep(ms / 1000.0)
    return answer


def _batched(feeds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The feeds of several queries as one: each input concatenated along the first axis."""
    import numpy as np

    return {name: np.concatenate([f[name] for f in feeds], axis=0) for name in feeds[0]}


def _sessions(req: ScenarioRequest) -> tuple[list[Answer], int, int]:
    """One answering call per session, how many samples they answer, and the most queries one
    call answers."""
    from dossier.scenarios.pool import batch_of, sessions_of

    if req.source == "synthetic":
        return [_synthetic(req.sleep_ms) for _ in range(max(1, req.sessions))], 16, \
            max(1, req.batch)
    from dossier.validation import load_validation_set

    if req.source == "bundle":
        from dossier import serve

        with serve.opened(req.path, **req.verify) as (engine, bundle):
            feeds = [p.inputs for p in load_validation_set(bundle.folder("validation")).pairs]
            shipped = bundle.manifest.engines.shipped.route
            count = req.sessions or sessions_of(shipped)
            batch = req.batch or batch_of(shipped)
        # each further session is one more dossier.load, as a serving process makes them
        engines = [engine] + [serve.load(req.path, **req.verify) for _ in range(count - 1)]
        calls: list[Callable[[dict[str, Any]], object]] = list(engines)
    else:
        from dossier.backends import get_backend
        from dossier.routes import Route

        backend = get_backend(req.backend)
        route = Route.parse(req.route)
        runners = [backend.load(Path(req.path), route) for _ in range(max(1, req.sessions))]
        calls = [r.run for r in runners]
        feeds = [p.inputs for p in load_validation_set(Path(req.validation)).pairs]
        batch = req.batch or batch_of(req.route)

    def bind(call: Callable[[dict[str, Any]], object]) -> Answer:
        def answer(indices: Sequence[int]) -> object:
            if len(indices) == 1:
                return call(feeds[indices[0] % len(feeds)])
            return call(_batched([feeds[i % len(feeds)] for i in indices]))
        return answer
    return [bind(c) for c in calls], len(feeds), batch


def _single_ms(answer: Answer, samples: int) -> float:
    times = []
    for i in range(SINGLE_CALLS):
        start = time.perf_counter_ns()
        answer([i % samples])
        times.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(times)


def main(argv: list[str]) -> int:
    """The child's work; its result in ``child.json`` beside the request."""
    from dossier.scenarios import driver

    folder = Path(argv[0]).parent
    try:
        req = ScenarioRequest.model_validate_json(read_small(argv[0], 1 << 20))
        answers, samples, batch = _sessions(req)
        if len(answers) > 1:  # what the load recipe tells a serving process to set
            sys.setswitchinterval(SWITCH_INTERVAL_S)
        for answer in answers:
            for i in range(WARMUP_CALLS):
                answer([i % samples])
            if batch > 1:  # a batch as large as the run may make: refused here, not mid-run
                answer([i % samples for i in range(batch)])
        single = _single_ms(answers[0], samples)
        driver.run(answers, samples, req.settings, folder / "loadgen", batch=batch)
        out = ChildResult(single_ms=single)
    except DossierError as exc:
        out = ChildResult(error=str(exc)[:2000], exit_code=int(exc.exit_code))
    except Exception as exc:  # an engine's own error while warming up or timing
        out = ChildResult(error=f"{type(exc).__name__}: {str(exc).strip()[:1900]}",
                          exit_code=int(ExitCode.INVALID))
    (folder / RESULT).write_text(out.model_dump_json())
    return 0 if out.error is None else 1


if __name__ == "__main__":  # pragma: no cover - run as a process by child.measure()
    sys.exit(main(sys.argv[1:]))
