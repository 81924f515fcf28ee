"""Every benchmark of bench/ whose figures the documentation quotes runs, on tiny settings
(``--smoke``): a script that no longer runs fails here, not when someone re-derives a figure.
Each writes its results file with the command, date and host that produced it.

Not here: bench/h200/ (GPU; ``bench/h200/run.sh smoke`` is tested in test_torch_inductor.py
with --run-slow), bench/calibration.py, aa_check.py and bias_check.py (minutes of timing by
design); trial_prestart.py's and bench/suite's smokes build two AOTInductor packages each, so they run with --run-slow. bench/tensorrt_api.py needs a TensorRT bindings wheel and capstone, which CI does not
have: its pure parts are tested in test_tensorrt_api.py, and here it must at least start.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, subprocess_env

pytestmark = pytest.mark.bench


def _run(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(argv, cwd=tmp_path, env=subprocess_env(**env),
                         capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, (res.stdout[-2000:], res.stderr[-3000:])
    return res


def _script(name: str, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    _run([sys.executable, str(REPO / "bench" / name), "--smoke", "--out", str(out), *args],
         tmp_path)
    data = json.loads(out.read_text())
    made = data["provenance"]
    assert made["command"].startswith(f"python bench/{name} --smoke")
    assert made["date"].endswith("Z") and made["host"]["cpus"] >= 1
    assert made["host"]["machine"] and data["smoke"] is True
    return data


def test_bundle_bench(tmp_path: Path) -> None:
    if not shutil.which("sha256sum"):
        pytest.skip("sha256sum is not installed")
    data = _script("bundle_bench.py", tmp_path)
    verify = data["verify"]
    for key in ("xxh3_check_integrity", "whole_command", "sha256sum_engine"):
        assert verify[key]["n"] == 3 and verify[key]["median_s"] > 0
    assert verify["speedup_median"] > 0 and verify["whole_command_speedup_median"] > 0
    assert data["memory"]["bundle"]["peak_mib"] > 0


def test_load_parity(tmp_path: Path) -> None:
    data = _script("load_parity.py", tmp_path, "--sample", "convnet")
    (r,) = data["results"]
    assert r["backend"] == "onnxruntime" and r["loaded"] == "per block"
    assert r["rounds"] == 4 and r["samples_per_engine"] == 40 and r["load_s_median"] > 0
    lo, hi = r["ratio_ci95"]
    assert 0 < lo <= r["ratio_served_to_tuner"] <= hi


def test_orchestration(tmp_path: Path) -> None:
    data = _script("orchestration.py", tmp_path)
    assert data["samples"] == ["convnet"]
    phases = data["phases"]
    assert {"startup", "setup", "build", "load", "validate", "time", "parent"} <= set(phases)
    overhead = data["overhead_besides_build_and_time"]
    assert overhead["n"] == phases["trial"]["n"] >= 2 and overhead["median_s"] > 0
    assert overhead["median_s"] < phases["trial"]["median_s"]
    assert isinstance(data["goal_met"], bool)


@pytest.mark.slow
def test_trial_prestart(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    data = _script("trial_prestart.py", tmp_path)
    assert data["engines_built_in_counted_searches"] == 0  # both ways from the build cache
    on, off = data["on"], data["off"]
    assert on["trials_per_search"] == off["trials_per_search"] == 2
    assert "standby" in on["phases_after_the_first_trial"]
    assert "standby" not in off["phases_after_the_first_trial"]
    assert on["search_wall"]["n"] == off["search_wall"]["n"] == 1


def test_cli_start(tmp_path: Path) -> None:
    data = _script("cli_start.py", tmp_path)
    commands = data["commands"]
    assert commands["dossier --help"]["n"] == 2 and commands["python -c pass"]["median_s"] > 0
    assert set(data["heavy_imported"]) == {"dossier --help", "dossier verify --help",
                                           "dossier verify GOLDEN --integrity-only"}


def test_verify_speed(tmp_path: Path) -> None:
    data = _script("verify_speed.py", tmp_path)
    assert data["whole_command"]["n"] == 2 and data["signed"]["n"] == 2
    assert data["rchar"]["ratio_to_bundle"] > 0.9  # every byte of the bundle is read


def test_tensorrt_api_starts(tmp_path: Path) -> None:
    res = _run([sys.executable, str(REPO / "bench" / "tensorrt_api.py"), "--help"], tmp_path)
    assert "--out" in res.stdout


@pytest.mark.ray
def test_ray_one_gpu_recipe(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    out = tmp_path / "out"
    _run(["bash", str(REPO / "bench" / "ray" / "one_gpu.sh")], tmp_path, SMOKE="1",
         EXECUTORS="ray", OUT=str(out), WORK=str(tmp_path / "work"),
         PYTHON=sys.executable, PATH=os.environ.get("PATH", ""))
    data = json.loads((out / "ray-one-gpu.json").read_text())
    assert data["smoke"] is True and data["provenance"]["command"].startswith("SMOKE=1 ")
    run = data["runs"]["ray-1"]
    assert run["trials"] == 2 and set(run["outcomes"].values()) == {"ok"}


@pytest.mark.slow
def test_suite_tiny_cpu(tmp_path: Path) -> None:
    """bench/suite end to end on a tiny GPT-2 on the CPU: specs, a release (two AOTInductor
    builds), the served engine timed beside eager and torch.compile, and the summary table; the
    pinned CUDA-graph release asked for is skipped with its reason (a CPU has no CUDA graph)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "out"
    _run(["bash", str(REPO / "bench" / "suite" / "run.sh"), "gpt2_b2"], tmp_path, OUT=str(out),
         BENCH_TAG="t", BENCH_WORK=str(tmp_path / "work"), BENCH_DEVICE="cpu", BENCH_TINY="1",
         DEADLINE_S="900", SUITE_MODES="eager,default", SUITE_ROUNDS="3", SUITE_PIN="gpt2_b2",
         PYTHON=sys.executable)
    records = json.loads((out / "suite-t.json").read_text())["steps"]
    steps = {s["step"]: s for s in records if s["step"] != "release"}
    releases = {s["spec"]: s for s in records if s["step"] == "release"}
    assert steps["specs"]["ok"] and steps["specs"]["tiny"]
    assert "release-cg.toml" not in steps["specs"]["spec_files"]
    cg = releases["release-cg.toml"]
    assert not cg["ok"] and "no CUDA graph" in cg["skipped"]
    release = releases["release.toml"]
    assert release["ok"] and release["builds"] == 2 and release["bundle"].endswith(".dossier")
    compare = steps["compare"]
    assert compare["ok"], compare.get("error")
    assert set(compare["contenders"]) == {"dossier", "eager", "default"}
    assert all(c["admissible"] for c in compare["contenders"].values())
    assert compare["served_route"] == release["shipped_route"]
    final = compare["final"]
    assert final["ms_per_call"]["dossier"]["n"] == 3 * 50 and final["best_compile_mode"] == "default"
    assert final["served_over_best_compile"] == final["served_over"]["default"]
    table = subprocess.run([sys.executable, str(REPO / "bench" / "suite" / "summarize.py"),
                            str(out / "suite-t.json"), "--out-json", str(tmp_path / "s.json"),
                            "--out-md", str(tmp_path / "s.md")], capture_output=True, text=True,
                           check=True).stdout
    assert "| gpt2_b2 |" in table and "not run" in table  # reduce-overhead, max-autotune


@pytest.mark.slow
def test_suite_one_route_releases_together_cpu(tmp_path: Path) -> None:
    """bench/suite with SUITE_ONLY_BASE and SUITE_TOGETHER on the CPU: two tiny configurations'
    default-route specs released alone and at once (one build each, no fast release), each
    bundle then served as dossier-base beside eager in its own comparison, the profile pass
    splitting each timed call (the served engine's package run inside it), and the summary
    marking the rows as dossier-base's."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "out"
    _run(["bash", str(REPO / "bench" / "suite" / "run.sh"), "gpt2_b2,bert_base_b2"], tmp_path,
         OUT=str(out), BENCH_TAG="u", BENCH_WORK=str(tmp_path / "work"), BENCH_DEVICE="cpu",
         BENCH_TINY="1", DEADLINE_S="900", SUITE_MODES="eager", SUITE_ROUNDS="3",
         SUITE_ONLY_BASE="gpt2_b2,bert_base_b2", SUITE_TOGETHER="1", PYTHON=sys.executable)
    records = json.loads((out / "suite-u.json").read_text())["steps"]
    releases = [s for s in records if s["step"] == "release"]
    assert [r["spec"] for r in releases] == ["release-base.toml"] * 2
    for r in releases:
        assert r["ok"] and r["builds"] == 1 and r["routes_measured"] == 1, r
        assert r["beside"] and r["beside"][0].startswith("release-") and r["config"] not in \
            r["beside"][0]
    compares = [s for s in records if s["step"] == "compare"]
    assert [c["config"] for c in compares] == ["gpt2_b2", "bert_base_b2"]
    for c in compares:
        assert c["ok"] and c["spec"] == "release-base.toml", c.get("error")
        assert set(c["contenders"]) == {"dossier-base", "eager"}
        assert "served_over" not in c["final"] and "best_compile_mode" not in c["final"]
        assert c["final"]["served_base_over"]["eager"]["rounds"] == 3
        split = c["profile"]["dossier-base"]["split"]
        assert split["calls"] == 20 and split["host_call_ms"] > 0, split
        assert 0 < split["container_ms"] <= split["host_call_ms"], split
        assert c["profile"]["eager"]["split"]["container_ms"] == 0
    table = subprocess.run([sys.executable, str(REPO / "bench" / "suite" / "summarize.py"),
                            str(out / "suite-u.json"), "--out-json", str(tmp_path / "s.json"),
                            "--out-md", str(tmp_path / "s.md")], capture_output=True, text=True,
                           check=True).stdout
    assert "(dossier-base)" in table and "no fast release recorded" in table
    assert "| gpt2_b2 | dossier-base |" in table  # the split's rows
