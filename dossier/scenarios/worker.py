"""The process of one LoadGen run: ``python -m dossier.scenarios.worker REQUEST.json``, started
by :func:`dossier.scenarios.child.measure`. It loads the engine once per session (see
:mod:`dossier.scenarios.child` for the sources), times single inferences, runs LoadGen and
writes ``child.json``."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dossier.errors import DossierError, ExitCode
from dossier.files import read_small
from dossier.scenarios.child import (
    RESULT,
    SINGLE_CALLS,
    WARMUP_CALLS,
    ChildResult,
    ScenarioRequest,
)
from dossier.scenarios.driver import Answer


def _synthetic(ms: float) -> Answer:
    def answer(_: int) -> None:
        time.sleep(ms / 1000.0)
    return answer


def _sessions(req: ScenarioRequest) -> tuple[list[Answer], int]:
    """One answering call per session, and how many samples they answer."""
    if req.source == "synthetic":
        return [_synthetic(req.sleep_ms) for _ in range(max(1, req.sessions))], 16
    from dossier.validation import load_validation_set

    if req.source == "bundle":
        from dossier import serve
        from dossier.scenarios.pool import sessions_of

        with serve.opened(req.path, **req.verify) as (engine, bundle):
            feeds = [p.inputs for p in load_validation_set(bundle.folder("validation")).pairs]
            count = req.sessions or sessions_of(bundle.manifest.engines.shipped.route)
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

    def bind(call: Callable[[dict[str, Any]], object]) -> Answer:
        return lambda i: call(feeds[i % len(feeds)])
    return [bind(c) for c in calls], len(feeds)


def _single_ms(answer: Answer, samples: int) -> float:
    times = []
    for i in range(SINGLE_CALLS):
        start = time.perf_counter_ns()
        answer(i % samples)
        times.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(times)


def main(argv: list[str]) -> int:
    """The child's work; its result in ``child.json`` beside the request."""
    from dossier.scenarios import driver

    folder = Path(argv[0]).parent
    try:
        req = ScenarioRequest.model_validate_json(read_small(argv[0], 1 << 20))
        answers, samples = _sessions(req)
        for answer in answers:
            for i in range(WARMUP_CALLS):
                answer(i % samples)
        single = _single_ms(answers[0], samples)
        driver.run(answers, samples, req.settings, folder / "loadgen")
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
