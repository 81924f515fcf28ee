"""The Ray executor on a local Ray instance: the same search as the local executor, a search
started from a folder holding a folder named ``dossier``, a measure worker killed mid-trial, a
driver killed mid-search, workers of another stack refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'dossier[ray]')")

from conftest import write_tiny_timing  # noqa: E402

from dossier.bundle import write_bundle  # noqa: E402
from dossier.errors import TuneError  # noqa: E402
from dossier.executors import ray_cluster  # noqa: E402
from dossier.run_folder import CACHE_NAME  # noqa: E402
from dossier.trial import Outcome  # noqa: E402
from dossier.tuner import continue_tune, tune  # noqa: E402

WHERE = ("worker_node", "worker_host", "worker_gpu")


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A local Ray instance of two CPUs, shared by the tests of this file."""
    faults = tmp_path_factory.mktemp("faults")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": {"DOSSIER_FAULT_DIR": str(faults)}})
    yield faults
    ray.shutdown()


def _found(res) -> list[tuple]:  # type: ignore[no-untyped-def]
    """What a search found, without timings, digests (ONNX Runtime writes other bytes for the
    same route in every process) and the worker that measured."""
    return [(t.index, t.route, t.role, t.outcome, t.worst_loss, t.engine, t.losses,
             t.build_s is None, {k: v for k, v in t.extra.items() if k not in WHERE})
            for t in res.cache.trials if t.role != "confirm"]


def _layout(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# before the tests of local_ray: this one needs a process without a Ray instance, and
# local_ray's lasts until the module's last test
@pytest.mark.ray
def test_ray_runs_from_a_folder_holding_a_folder_named_dossier(sample: Any, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """Before: --executor ray failed (exit 4) from a folder holding a folder named ``dossier``
    (Ray puts the driver's working directory first on its workers' path), and every Ray search
    left a /tmp/dossier-measure-* folder with the baseline engine in it."""
    ray = pytest.importorskip("ray")
    from dossier.tuner import tune

    if ray.is_initialized():
        pytest.skip("a Ray instance of another test is running in this process")
    _, spec = sample("convnet", strategy="fast", selection="-intra_op_num_threads=[0|1]")
    shadow = tmp_path / "here"
    (shadow / "dossier").mkdir(parents=True)
    (shadow / "dossier" / "__init__.py").write_text("raise ImportError('not dossier')\n")
    monkeypatch.chdir(shadow)
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    before = set(tmp.glob("dossier-measure-*"))
    result = tune(spec, tmp_path / "run", executor="ray")
    assert all(t.admissible for t in result.cache.trials), [t.reason for t in result.cache.trials]
    assert set(tmp.glob("dossier-measure-*")) <= before


def test_ray_gives_the_routes_outcomes_and_bundle_of_the_local_executor(local_ray, sample,
                                                                      tmp_path: Path) -> None:
    _, spec = sample("convnet", strategy="fast",
                     selection="-intra_op_num_threads=[0|1] -optimizer:NchwcTransformer=[on|off]")
    here = tune(spec, tmp_path / "local")
    measure = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("dossier-measure-*"))
    there = tune(spec, tmp_path / "ray", executor="ray")
    # the measure workers removed their folders (the baseline engine was left there)
    assert set(Path(os.environ.get("TMPDIR", "/tmp")).glob("dossier-measure-*")) <= measure
    assert _found(here) == _found(there)
    assert len(_found(there)) == 3 and all(t.admissible for t in there.cache.trials)
    # the third route differs only in a load-time knob: the baseline's engine is reused
    assert there.cache.trials[2].extra["reused_engine"] == "trial-0000.ort"
    node = ray.get_runtime_context().get_node_id()
    for t in there.cache.trials:
        if t.role != "confirm":  # each trial names the worker and GPU that measured it
            assert t.extra["worker_node"] == node and t.extra["worker_gpu"] == "none"
    # no note but the placement's (a suite started at a lowered priority keeps it, and says so)
    assert [n for n in there.notes if not n.startswith("started at nice")] == []
    assert not (tmp_path / "ray" / ".work").exists()
    a = write_bundle(tmp_path / "local", tmp_path / "out-local")
    b = write_bundle(tmp_path / "ray", tmp_path / "out-ray")
    assert _layout(Path(a.path)) == _layout(Path(b.path))
    shipped = [json.loads(line) for line in next(Path(b.path).rglob(CACHE_NAME)).read_text()
               .splitlines()[1:]]  # the bundle keeps who measured each trial
    assert all(r["extra"]["worker_node"] == node for r in shipped
               if r["kind"] == "trial" and r["role"] != "confirm")


def test_a_killed_measure_worker_requeues_the_trial_once(local_ray, sample, tmp_path: Path) -> None:
    """The trial's process kills its measure worker (SIGKILL to the actor's process): killed
    once, the trial runs again on a new worker and passes; killed every time, it is recorded
    crashed after its second run and the search goes on."""
    _, spec = sample("convnet", backend="faulty", strategy="fast",
                     selection="-fault=[none|kill_worker_once|kill_worker|nan]")
    res = tune(spec, tmp_path / "run", executor="ray")
    by_route = {t.route: t for t in res.cache.trials if t.role != "confirm"}
    assert list(by_route) == ["-fault=none", "-fault=kill_worker_once", "-fault=kill_worker",
                              "-fault=nan"]
    once, always = by_route["-fault=kill_worker_once"], by_route["-fault=kill_worker"]
    assert once.outcome is Outcome.OK and once.engine is not None
    assert always.outcome is Outcome.CRASHED and always.engine is None
    assert "died in every attempt (2)" in (always.reason or "")
    assert by_route["-fault=nan"].outcome is Outcome.REJECTED  # the search went on
    assert (local_ray / "killed-trial-0001.ort").exists()
    requeued = sorted(n for n in res.notes if "re-queued" in n)  # measured in any order
    assert len(requeued) == 2 and "trial 1" in requeued[0] and "trial 2" in requeued[1]


def test_the_hold_out_checks_run_on_a_measure_worker(local_ray, samples_dir: Path,
                                                    tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``fault=drift`` (1.5x faster on the faulty backend's clock, wrong on inputs of large
    magnitude; the hold-out set holds one) is confirmed, then stopped by its hold-out check:
    the checks run on the measure worker (the hold-out set sent there), and the driver starts
    no worker process of its own."""
    import shutil

    import numpy as np
    from conftest import TINY_TIMING

    import dossier.jobs.child as child_module
    from dossier.spec import load_spec
    from dossier.tensors import write_tensors
    from dossier.validation import load_validation_set

    folder = tmp_path / "tblock"
    shutil.copytree(samples_dir / "tblock", folder)
    hold = folder / "holdout" / "pair-000"
    x = load_validation_set(folder / "holdout").pairs[0].inputs["x"] * 4
    build = sys.modules["samples_build"]  # the samples_dir fixture loaded it
    weights = build.tblock_weights(np.random.default_rng(build.TBLOCK_SEED))
    write_tensors(hold / "inputs.arrow", {"x": x})
    write_tensors(hold / "references.arrow", build.tblock_reference(weights, x))
    spec = load_spec(folder / "release-int8.toml", {
        "backend": "faulty", "strategy": "full",
        "selection": "-pace=clock -fault=[none|drift] -intra_op_num_threads=1"})
    timing = TINY_TIMING.model_copy(update={"confirm_top": 1, "confirm_rounds": 4,
                                            "confirm_runs": 10})

    def here(*args: object, **kwargs: object) -> None:
        raise AssertionError("a worker process started on the driver")

    monkeypatch.setattr(child_module.Child, "__init__", here)  # the driver's, not the workers'
    res = tune(spec.model_copy(update={"timing": timing}), tmp_path / "run", executor="ray")
    d = res.decision
    drift = "-fault=drift -intra_op_num_threads=1 -pace=clock"
    checks = {h.route: h for h in res.cache.holdouts}
    assert checks[d.baseline_route].passed and checks[d.baseline_route].pairs == 3
    assert d.holdout_rejected == [drift], d.reason
    assert not checks[drift].passed and "pair-000" in (checks[drift].reason or "")
    assert not d.gain and d.holdout is not None and d.holdout.route == d.shipped_route


def test_driver_killed_then_continue_loses_only_trials_in_flight(local_ray, samples_dir: Path,
                                                                 tmp_path: Path) -> None:
    """A SIGKILL of the driver process (``dossier tune --address`` of a running cluster) in the
    middle of a search, then --continue: nothing recorded is lost or repeated."""
    import shutil

    work = tmp_path / "convnet"
    shutil.copytree(samples_dir / "convnet", work)
    write_tiny_timing(work / "release.toml")
    run = tmp_path / "run"
    address = ray.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "dossier_cli.main", "tune", str(work / "release.toml"), "--out", str(run),
           "--quiet", "--strategy", "fast", "--executor", "ray", "--address", address]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    cache = run / CACHE_NAME
    deadline = time.time() + 180
    while time.time() < deadline:
        if cache.exists() and cache.read_text().count('"kind":"trial"') >= 2:
            break
        time.sleep(0.05)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the search did not get going")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = [json.loads(line) for line in cache.read_text().splitlines()[1:] if line.strip()]
    assert 2 <= len(before) < 5 and all(r["kind"] == "trial" for r in before)
    res = continue_tune(run, executor="ray")
    trials = [t for t in res.cache.trials if t.role != "confirm"]
    routes = [t.route for t in trials]
    assert len(routes) == len(set(routes)) == 5  # nothing duplicated, nothing missing
    assert res.trials_run == 5 - len(before)
    assert [t.model_dump(mode="json") for t in res.cache.trials[: len(before)]] == before
    assert [t.index for t in res.cache.trials] == list(range(len(res.cache.trials)))


def test_a_worker_of_another_stack_is_refused(local_ray, sample, monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    _, spec = sample("convnet", strategy="fast", selection="-intra_op_num_threads=[0|1]")
    real = ray_cluster.stack_facts

    def driver_facts(fp, gpu, stack):  # type: ignore[no-untyped-def]
        return {**real(fp, gpu, stack), "onnxruntime": "0.0.1"}  # patched here, not in workers

    monkeypatch.setattr(ray_cluster, "stack_facts", driver_facts)
    with pytest.raises(TuneError, match=r"refused measure worker \S+ GPU none: its onnxruntime "
                       r"\S+ \(run: 0\.0\.1\)"):
        tune(spec, tmp_path / "run", executor="ray")
    assert not (tmp_path / "run").exists()


def test_mismatch_names_each_differing_fact() -> None:
    run = {"GPU model": "NVIDIA H200", "driver": "570.1", "CUDA": None, "onnxruntime": "1.20"}
    same = {"GPU model": "NVIDIA H200", "driver": "570.1", "CUDA": "12.8", "onnxruntime": "1.20"}
    assert ray_cluster.mismatch(run, same) is None  # a fact the run does not know is not compared
    other = {**same, "GPU model": "NVIDIA H100", "driver": "560.2"}
    assert ray_cluster.mismatch(run, other) == ("GPU model NVIDIA H100 (run: NVIDIA H200), "
                                                "driver 560.2 (run: 570.1)")


def test_unknown_executor_and_a_stray_address_are_refused(sample, tmp_path: Path) -> None:
    from dossier.errors import InputError

    _, spec = sample("convnet", strategy="fast", selection="-intra_op_num_threads=[0|1]")
    with pytest.raises(InputError, match="unknown executor 'dask'"):
        tune(spec, tmp_path / "a", executor="dask")
    with pytest.raises(InputError, match="--address is for --executor ray"):
        tune(spec, tmp_path / "b", address="10.0.0.1:6379")


def test_an_address_nothing_answers_at_fails_fast_with_one_line(sample, tmp_path: Path) -> None:
    """In a fresh process (this one may hold a Ray instance already): exit 4, one line, no
    run folder, long before Ray's own retries would give up."""
    spec_path, _ = sample("convnet", strategy="fast", selection="-intra_op_num_threads=[0|1]")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "dossier_cli.main", "tune", str(spec_path), "--out",
                           str(tmp_path / "run"), "--executor", "ray", "--address",
                           "127.0.0.1:1"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stderr
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and time.monotonic() - t0 < 60
    assert not (tmp_path / "run").exists()


def test_without_ray_the_executor_is_unavailable(sample, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    from dossier.errors import BackendUnavailableError, ExitCode

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as when not installed
    _, spec = sample("convnet", strategy="fast", selection="-intra_op_num_threads=[0|1]")
    with pytest.raises(BackendUnavailableError, match="needs Ray") as exc:
        tune(spec, tmp_path / "run", executor="ray")
    assert exc.value.exit_code is ExitCode.BACKEND_UNAVAILABLE and "dossier[ray]" in exc.value.hint
    assert not (tmp_path / "run").exists()
