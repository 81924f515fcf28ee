"""verify on the tuning host, a real environment change, accuracy re-check, re-timing, retune."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import TINY_TIMING, cli

from dossier.bundle import open_bundle, write_bundle
from dossier.errors import ExitCode, IntegrityError
from dossier.fingerprint import collect
from dossier.measure.latency import RouteLatency
from dossier.retune import retune
from dossier.spec import load_spec
from dossier.tuner import tune
from dossier.verify import verify_bundle
from dossier.verify.host import moved_engine
from dossier.verify.policy import Verdict


@pytest.fixture(scope="module")
def tuned(samples_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small convnet bundle tuned on this host (model included), made once."""
    root = tmp_path_factory.mktemp("verify")
    shutil.copytree(samples_dir / "convnet", root / "sample")
    spec = load_spec(root / "sample" / "release.toml", {
        "strategy": "fast",
        "selection": "-intra_op_num_threads=[0|1] -optimizer:NchwcTransformer=[on|off]"})
    tune(spec.model_copy(update={"timing": TINY_TIMING}), root / "run")
    return write_bundle(root / "run", root / "out").path


@pytest.fixture()
def bundle(tuned: Path, tmp_path: Path) -> Path:
    """A private copy of that bundle (a test may damage it)."""
    return Path(shutil.copytree(tuned, tmp_path / "out" / tuned.name, symlinks=True))


def test_same_host_same_environment_is_valid(bundle: Path) -> None:
    with open_bundle(bundle) as b:
        report = verify_bundle(b)
    assert report.verdict is Verdict.VALID, report.reasons
    assert report.findings and not report.reasons


def test_recheck_passes_here_and_fails_with_a_stricter_threshold(bundle: Path) -> None:
    with open_bundle(bundle) as b:
        ok = verify_bundle(b, do_recheck=True)
        recorded = ok.recheck.recorded_worst_loss
        strict = verify_bundle(b, do_recheck=True, threshold=recorded / 2)
    assert ok.recheck.passed and ok.verdict is Verdict.VALID
    assert ok.recheck.worst_loss == pytest.approx(recorded, rel=0, abs=0)  # same engine, same CPU
    assert not strict.recheck.passed and strict.verdict is Verdict.INVALID
    assert "output 'logits'" in strict.recheck.failure and "pair-" in strict.recheck.failure
    assert strict.reasons[0].startswith("accuracy re-check failed")


def test_rebench_times_shipped_and_baseline_here(bundle: Path) -> None:
    with open_bundle(bundle) as b:
        report = verify_bundle(b, do_rebench=True)
    rb = report.rebench
    assert rb is not None and rb.shipped.n > 0 and rb.baseline.n > 0
    assert rb.recorded_shipped is not None
    # the same per-inference figure as inspect's, here and as recorded, and the conditions
    assert rb.latency is not None and rb.recorded_latency is not None
    assert rb.latency.inferences_per_sample == rb.recorded_latency.inferences_per_sample > 0
    assert "ms per inference here" in rb.reason and "recorded" in rb.reason
    assert rb.baseline_latency is not None and rb.recorded_baseline_latency is not None
    assert rb.baseline_latency.median_ms == pytest.approx(
        rb.baseline.median_ms / rb.baseline_latency.inferences_per_sample)
    said = f"the baseline {rb.baseline_latency.median_ms:.4g} ms per inference here"
    assert (said in rb.reason) == (rb.comparison is not None)  # said once when it ships
    assert (rb.moved is None) == ("moved:" not in rb.reason)
    assert rb.conditions is not None and rb.conditions.measurements >= 2
    assert report.verdict in (Verdict.VALID, Verdict.SUBOPTIMAL)
    assert (report.verdict is Verdict.SUBOPTIMAL) == rb.regression


def test_integrity_comes_before_anything_else(bundle: Path) -> None:
    engine = next((bundle / "engine").iterdir())
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0xFF
    engine.write_bytes(bytes(data))
    with open_bundle(bundle) as b, pytest.raises(IntegrityError, match=engine.name):
        verify_bundle(b, do_recheck=True)


def test_another_architecture_and_another_cpu(bundle: Path) -> None:
    here = collect()
    flags = here.cpu.isa_flags
    # a target without the widest instructions this host has (AVX-512 where there is any)
    dropped = [f for f in flags if f.startswith("avx512")] or flags[-1:]
    if not dropped:
        pytest.skip("this CPU reports no instruction-set flag to take away")
    with open_bundle(bundle) as b:
        other_isa = here.model_copy(update={"cpu": here.cpu.model_copy(
            update={"isa_flags": [f for f in flags if f not in dropped]})})
        r = verify_bundle(b, host=other_isa)
        assert r.verdict is Verdict.INVALID  # the shipped route is optimized at level all (NCHWc)
        assert any(f.field == "cpu.isa_flags" and f.verdict is Verdict.INVALID for f in r.findings)
        other_cpu = here.model_copy(update={"cpu": here.cpu.model_copy(update={"model": "Other"})})
        r = verify_bundle(b, host=other_cpu)
        assert r.verdict is Verdict.SUBOPTIMAL and "cpu.model" in r.reasons[0]


def test_retune_writes_the_next_version_with_its_parent(bundle: Path, tmp_path: Path) -> None:
    with open_bundle(bundle) as b:
        v1 = b.manifest
    done = retune(bundle, tmp_path / "out")
    with open_bundle(done.bundle.path) as b:
        v2 = b.manifest
        header = b.tuning_cache().header
    assert (v2.release, v2.release_version, v2.parent) == (v1.release, 2, v1.dossier_id)
    assert header.warm_start == done.warm_start and header.parent == v1.dossier_id
    assert done.warm_start and v1.summary.baseline_route not in done.warm_start
    trials = [t for t in done.tune.cache.trials if t.role != "confirm"]
    # warm-start routes are measured right after the baseline
    assert [t.route for t in trials[1:1 + len(done.warm_start)]] == done.warm_start


def test_retune_refuses_a_different_model(bundle: Path, tmp_path: Path) -> None:
    from dossier.errors import InputError

    other = tmp_path / "other.onnx"
    other.write_bytes((bundle / "model" / "model.onnx").read_bytes() + b" ")
    with pytest.raises(InputError, match="is not the bundle's model"):
        retune(bundle, tmp_path / "out2", model=other)


@pytest.mark.slow
def test_real_environment_change_is_invalid(bundle: Path, tmp_path: Path) -> None:
    """A second real virtual environment with another onnxruntime version verifies the bundle
    made here: INVALID, naming packages.onnxruntime. Needs PyPI (pip install onnxruntime)."""
    env = tmp_path / "venv-b"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    py = env / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "onnxruntime==1.31.1"],
                   check=True)
    site_b = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            check=True, capture_output=True, text=True).stdout.strip()
    # everything else (dossier, numpy, pyarrow, ...) from this environment, after env B's own:
    # as a site directory, so that its own .pth files (the editable install's dossier_cli) run
    (Path(site_b) / "zz-dossier-deps.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"
        + str(Path(__file__).resolve().parents[2]) + "\n")
    out = subprocess.run([str(py), "-m", "dossier_cli.main", "verify", str(bundle), "--json"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    assert out.returncode == 11, out.stderr  # ExitCode.INVALID
    report = json.loads(out.stdout)
    changed = {f["field"]: f for f in report["findings"] if f["bundle_value"] != f["host_value"]}
    assert changed["packages.onnxruntime"]["host_value"] == "1.31.1"
    assert changed["packages.onnxruntime"]["verdict"] == "INVALID"
    assert report["verdict"] == "INVALID"


def test_verify_cli_exit_codes_and_json(bundle: Path, runner, tmp_path: Path) -> None:
    from dossier_cli.main import app

    r = runner.invoke(app, ["verify", str(bundle), "--json", "--recheck"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["verdict"] == "VALID" and data["recheck"]["passed"]
    r = runner.invoke(app, ["verify", str(bundle), "--recheck", "--threshold", "1e-12"])
    assert r.exit_code == 11 and "accuracy re-check failed" in r.stdout
    # a fleet host's fingerprint with another CPU model: SUBOPTIMAL, exit 10
    fp = json.loads((bundle / "fingerprint.json").read_text())
    fp["cpu"]["model"] = "Some Other CPU"
    (tmp_path / "host.json").write_text(json.dumps(fp))
    r = runner.invoke(app, ["verify", str(bundle), "--host-fingerprint", str(tmp_path / "host.json")])
    assert r.exit_code == 10 and "cpu.model" in r.stdout
    policy = tmp_path / "policy.toml"
    policy.write_text('[[rule]]\npattern = "cpu.model"\nverdict = "VALID"\nreason = "we do not care"\n')
    r = runner.invoke(app, ["verify", str(bundle), "--host-fingerprint", str(tmp_path / "host.json"),
                            "--policy", str(policy)])
    assert r.exit_code == 0, r.output


def test_retune_cli(bundle: Path, runner, tmp_path: Path) -> None:
    from dossier_cli.main import app

    r = runner.invoke(app, ["retune", str(bundle), "--out", str(tmp_path / "o"), "--json", "-q"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["version"] == 2 and data["parent"]
    r = runner.invoke(app, ["inspect", data["bundle"], "--json"])
    assert json.loads(r.stdout)["parent"] == data["parent"]


# ------------------------------------------------------- the CLI's verify and retune, by path
def test_retune_with_a_relative_out(convnet_bundle: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = cli("retune", convnet_bundle, "--out", "releases/", "--top", "1", "--quiet")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "releases" / "convnet-convnet-2.dossier" / "manifest.json").is_file()


def test_a_failed_retune_leaves_nothing(convnet_bundle: Path, tmp_path: Path,
                                        monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("other.onnx").write_bytes(b"not the model")
    r = cli("retune", convnet_bundle, "--out", "releases", "--model", "other.onnx")
    assert r.exit_code == ExitCode.INPUT and "is not the bundle's model" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.onnx"]


@pytest.mark.parametrize("threshold", ["-1", "nan", "0", "inf"])
def test_verify_refuses_a_threshold_that_is_not_above_zero(convnet_bundle: Path,
                                                            threshold: str) -> None:
    r = cli("verify", convnet_bundle, "--recheck", "--threshold", threshold)
    assert r.exit_code == ExitCode.INPUT, r.output
    assert r.output.startswith(f"error: --threshold {float(threshold)}: must be a number above 0")
    assert len(r.output.strip().splitlines()) == 1 and "pydantic" not in r.output


def test_verify_threshold_needs_recheck_and_must_be_stricter(convnet_bundle: Path) -> None:
    r = cli("verify", convnet_bundle, "--threshold", "1e-5")
    assert r.exit_code == ExitCode.USAGE and "--threshold applies to --recheck" in r.output
    recorded = json.loads(cli("inspect", convnet_bundle, "--json").stdout)["threshold"]
    r = cli("verify", convnet_bundle, "--recheck", "--threshold", recorded * 10)
    assert r.exit_code == ExitCode.INPUT
    assert f"is looser than the bundle's {recorded:g}" in r.output
    r = cli("verify", convnet_bundle, "--recheck", "--threshold", recorded)  # as strict: checked
    assert r.exit_code == 0, r.output
    assert "accuracy re-check passed: worst linf loss" in r.output


def test_verify_of_another_hosts_fingerprint_names_it(convnet_bundle: Path) -> None:
    r = cli("verify", convnet_bundle, "--host-fingerprint", convnet_bundle / "fingerprint.json",
            columns=300)
    assert r.exit_code == 0, r.output
    host = convnet_bundle / "fingerprint.json"
    assert f"on the host of {host}" in " ".join(r.output.split())
    assert "on this host" not in r.output


def _latency(ms: float) -> RouteLatency:
    return RouteLatency(route="-a=b", source="confirmation", trial_index=0,
                        inferences_per_sample=1, n=10, median_ms=ms, p90_ms=ms, p99_ms=ms,
                        throughput_per_s=1.0)


def test_a_rebench_says_which_engine_moved_against_its_record() -> None:
    """The two-speed regime of a 2-thread CPU engine: the baseline ran at 0.62 ms when tuned
    and 0.40 here, the int8 engine held, and the speedup fell from 1.98x to 1.28x."""
    said = moved_engine(_latency(0.31), _latency(0.30), _latency(0.40), _latency(0.62))
    assert said is not None and said.startswith("the baseline moved: 35% faster here")
    assert "the shipped engine 3% slower" in said and "moved with the baseline" in said
    shipped = moved_engine(_latency(0.45), _latency(0.30), _latency(0.61), _latency(0.62))
    assert shipped is not None and shipped.startswith("the shipped engine moved: 50% slower")
    assert moved_engine(_latency(0.32), _latency(0.30), _latency(0.60), _latency(0.62)) is None
    assert moved_engine(None, _latency(0.30), _latency(0.40), _latency(0.62)) is None
    assert moved_engine(_latency(0.3), _latency(0.3), _latency(0.4), _latency(0.0)) is None
