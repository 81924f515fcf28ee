"""The Ray executor with two measure workers: a local Ray instance that declares two (logical)
GPUs, so the search runs one measure actor per GPU and measures trials concurrently."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'dossier[ray]')")

from test_ray_executor import _found  # noqa: E402

from dossier.tuner import tune  # noqa: E402


@pytest.fixture(scope="module")
def two_gpu_ray():  # type: ignore[no-untyped-def]
    """Two CPUs and two GPU slots (a Ray resource only: ONNX Runtime runs on the CPU)."""
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)
    yield
    ray.shutdown()


def test_two_measure_workers_find_what_one_host_finds(two_gpu_ray, sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", strategy="fast")  # 5 routes, 4 of them built
    here = tune(spec, tmp_path / "local")
    there = tune(spec, tmp_path / "ray", executor="ray")
    assert _found(here) == _found(there)
    measured = [t.extra["worker_gpu"] for t in there.cache.trials if t.role != "confirm"]
    assert sorted(set(measured)) == ["0", "1"]  # both GPU workers measured trials
    assert [n for n in there.notes if not n.startswith("started at nice")] == []
