"""kill -9 of a release during its scenario stage, end to end: the release started again
continues its search (a search already in OUT/.runs is continued), keeps every trial and
every LoadGen probe that had finished, runs none of them again, and writes the bundle (the
probes' folder goes once the scenario's decision is written: its probes are in it)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import test_scenario_release
from conftest import dossier_command, dossier_run, tiny_spec

from dossier.scenarios.evidence import DECISION, read_decision
from dossier.scenarios.models import Probe

pytestmark = test_scenario_release.pytestmark  # mlcommons-loadgen (the [scenario] extra)


def _lines(path: Path) -> list[str]:
    """The complete lines of ``path`` (a line cut by the kill is not one)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    return text.splitlines()[: text.count("\n")]


def _probes(run: Path) -> dict[Path, list[str]]:
    return {p.relative_to(run): _lines(p) for p in run.rglob("probes.jsonl")}


def test_kill_9_during_the_scenario_stage_loses_no_finished_trial_or_probe(
        tmp_path: Path, samples_dir: Path) -> None:
    folder = tmp_path / "convnet"
    shutil.copytree(samples_dir / "convnet", folder)
    spec = tiny_spec(folder, "served", tune='strategy = "full"\n'
                     'selection = "-serving_sessions=[1|2]"\n', extra=test_scenario_release.SCENARIO)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    deadline = time.monotonic() + 600
    with subprocess.Popen(dossier_command("release", spec, "--out", out),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                          start_new_session=True) as p:
        while not any(_probes(out).values()):
            assert p.poll() is None, "the release ended before its scenario stage had a probe"
            assert time.monotonic() < deadline, "no LoadGen probe finished in 10 minutes"
            time.sleep(0.05)
        os.killpg(p.pid, signal.SIGKILL)  # kill -9: the release and every process it started
        p.wait(timeout=60)
    (run,) = (out / ".runs").iterdir()
    cache_before = _lines(run / "tuning-cache.jsonl")
    probes_before = _probes(run)
    assert any(probes_before.values())

    r = dossier_run("release", spec, "--out", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cache_after = _lines(run / "tuning-cache.jsonl")
    assert cache_after[: len(cache_before)] == cache_before  # every finished record kept as is
    records = [json.loads(ln) for ln in cache_after]
    trials = [(d["index"], d["role"]) for d in records if d.get("kind") == "trial"]
    assert trials and len(set(trials)) == len(trials)  # none measured twice
    # each finished probe was kept and none run again: the decision's probes of that
    # repetition and configuration (scenario/runs/rep-RR/CC) begin with them, timings and all
    decision = read_decision(run / DECISION)
    for name, lines in probes_before.items():
        rep, config = int(name.parts[-3][len("rep-"):]), int(name.parts[-2])
        probes = decision.readings[config].results[rep].probes
        assert list(probes[: len(lines)]) == [Probe.model_validate_json(ln) for ln in lines]
    assert (out / f"{run.name}.dossier").exists()
