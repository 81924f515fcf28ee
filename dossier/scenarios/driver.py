"""One LoadGen run in this process: LoadGen owns the arrival process (Poisson arrivals at the
rate for server, every query at once for offline) and the statistics; the system under test
answers queries from N worker threads, each with its own engine session (what a server with N
sessions in parallel does). LoadGen's ``issue`` callback only queues the queries; the workers
answer them and call ``QuerySamplesComplete`` (thread-safe). With a batch of B (the route's
``serving_batch``), a worker that takes a query also takes those waiting behind it, up to B in
all, and answers them with one call (dynamic batching: it never waits for more to arrive).

A query whose call fails is still completed (LoadGen would otherwise wait for it forever) and
counted; the first failure is raised once the run is over (:class:`~dossier.errors.EngineFailedError`).
Meant to run in a process of its own (:mod:`dossier.scenarios.child`), which a stalled run
can be killed with.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dossier.errors import BackendUnavailableError, EngineFailedError
from dossier.scenarios.logs import KEPT, LoadGenRun, read_run
from dossier.scenarios.models import RunSettings

Answer = Callable[[Sequence[int]], object]
"""One session's call: answer the queries for the samples ``indices`` (of the samples in
memory) with one call; one index unless the run batches."""


def loadgen() -> Any:
    """The ``mlperf_loadgen`` module; BackendUnavailableError (exit 5) when it is not
    installed."""
    try:
        import mlperf_loadgen
    except ImportError:
        raise BackendUnavailableError(
            "the server and offline scenarios need MLPerf LoadGen (mlperf_loadgen), which is "
            "not installed here", hint="pip install 'dossier[scenario]'") from None
    return mlperf_loadgen


def _test_settings(lg: Any, s: RunSettings) -> Any:
    ts = lg.TestSettings()
    ts.mode = lg.TestMode.PerformanceOnly
    ts.min_duration_ms = max(1, round(s.duration_s * 1000))
    ts.max_duration_ms = max(ts.min_duration_ms, round(s.max_duration_s * 1000))
    ts.min_query_count = s.min_queries
    ts.schedule_rng_seed = ts.sample_index_rng_seed = ts.qsl_rng_seed = s.seed
    if s.kind == "server":
        ts.scenario = lg.TestScenario.Server
        ts.server_target_qps = s.qps
        ts.server_target_latency_ns = s.bound_ns
        ts.server_target_latency_percentile = s.percentile / 100.0
    elif s.kind == "offline":
        ts.scenario = lg.TestScenario.Offline
        ts.offline_expected_qps = s.qps
    else:
        ts.scenario = lg.TestScenario.SingleStream
    return ts


def run(sessions: Sequence[Answer], samples: int, settings: RunSettings, outdir: Path,
        batch: int = 1) -> LoadGenRun:
    """Run LoadGen once against ``sessions`` (one worker thread each, answering up to ``batch``
    waiting queries per call) over ``samples`` sample indices; its logs are written to
    ``outdir`` (only the summary and the detail log are kept) and read back.
    EngineFailedError when a call failed."""
    lg = loadgen()
    outdir.mkdir(parents=True, exist_ok=True)
    work: queue.SimpleQueue[Any] = queue.SimpleQueue()
    failures: list[BaseException] = []

    def worker(answer: Answer) -> None:
        stop = False
        while not stop and (item := work.get()) is not None:
            items = [item]
            while len(items) < batch:  # the queries already waiting, never more
                try:
                    more = work.get_nowait()
                except queue.Empty:
                    break
                if more is None:  # the end: answer what was taken, then stop
                    stop = True
                    break
                items.append(more)
            try:
                answer([q.index for q in items])
            except Exception as exc:  # completed all the same, said after the run
                failures.append(exc)
            lg.QuerySamplesComplete([lg.QuerySampleResponse(q.id, 0, 0) for q in items])

    def issue(query_samples: Sequence[Any]) -> None:
        for q in query_samples:
            work.put(q)

    threads = [threading.Thread(target=worker, args=(s,), daemon=True,
                                name=f"dossier-session-{i}") for i, s in enumerate(sessions)]
    for t in threads:
        t.start()
    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(samples, samples, lambda _: None, lambda _: None)
    out = lg.LogOutputSettings()
    out.outdir = str(outdir)
    out.copy_summary_to_stdout = False
    log = lg.LogSettings()
    log.log_output = out
    try:
        lg.StartTestWithLogSettings(sut, qsl, _test_settings(lg, settings), log)
    finally:
        for _ in threads:
            work.put(None)
        for t in threads:
            t.join()
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    for path in outdir.iterdir():  # the trace and the accuracy log are not kept
        if path.name not in KEPT and path.name.startswith("mlperf_log_"):
            path.unlink()
    if failures:
        first = failures[0]
        raise EngineFailedError(f"{len(failures)} of the scenario's queries failed; the first: "
                                f"{str(first).strip().splitlines()[0][:300] if str(first).strip() else type(first).__name__}")
    return read_run(outdir)
