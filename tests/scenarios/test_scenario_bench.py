"""bench/scenario.py on tiny settings: it writes the bound before measuring, then every
configuration's metric per repetition side by side, and the decision (figures not asserted)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, subprocess_env

pytestmark = [pytest.mark.bench,
              pytest.mark.skipif(importlib.util.find_spec("mlperf_loadgen") is None,
                                 reason="mlcommons-loadgen is not installed (the [scenario] "
                                        "extra)")]


def test_the_scenario_bench_smoke(tmp_path: Path, samples_dir: Path) -> None:
    out = tmp_path / "scenario.json"
    res = subprocess.run([sys.executable, str(REPO / "bench" / "scenario.py"),
                          str(samples_dir / "tblock" / "release-int8.toml"),
                          "--route=-quantization=dynamic", "--bound-ms", "50", "--smoke",
                          "--out", str(out)], cwd=tmp_path, env=subprocess_env(),
                         capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["command"].startswith("python bench/scenario.py ")
    assert data["bound_chosen_before_measuring"] == {"latency_ms": 50.0, "percentile": 99.0}
    assert "busy" in data["host_note"] and len(data["load_before"]) == 3
    side = data["side_by_side"]
    assert len(side) == 5 and all(len(v["qps_per_repetition"]) == 2 for v in side.values())
    assert data["shipped"] in side and data["decision"]["repetitions"] == 2


def test_the_scenario_bench_runs_the_offline_scenario_with_batches(tmp_path: Path,
                                                                   samples_dir: Path) -> None:
    out = tmp_path / "offline.json"
    res = subprocess.run([sys.executable, str(REPO / "bench" / "scenario.py"),
                          str(samples_dir / "tblock" / "release-int8.toml"),
                          "--route=-quantization=dynamic", "--kind", "offline",
                          "--configs", "1x0x4", "--smoke", "--out", str(out)],
                         cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                         timeout=600, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["bound_chosen_before_measuring"] is None and data["scenario"]["kind"] == "offline"
    side = data["side_by_side"]
    assert "1 sessions x 0 threads, batches of up to 4" in side
    assert all(q > 0 for v in side.values() for q in v["qps_per_repetition"])
