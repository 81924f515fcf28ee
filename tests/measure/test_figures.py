"""Figures a reader can act on: per-inference latency from the confirmation, the conditions
each measurement ran under, the cos metric at small scales, external-data ONNX models and
thresholds that cannot reject anything."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
from _records import confirmed, screened
from conftest import cli
from test_explain import SESSION, _header

from dossier.audit import explain_search
from dossier.decision import decide
from dossier.errors import ModelError, SpecError, TuneError
from dossier.formats import figures as fig
from dossier.measure import conditions
from dossier.measure.conditions import Conditions, GpuState, Watch, summarize, wait_for_quiet
from dossier.measure.latency import of_route, per_inference
from dossier.measure.timing import TimingSettings
from dossier.threshold import check_threshold
from dossier.validation import Pair, ValidationSet, loss

SETTINGS = TimingSettings(confirm_top=2, confirm_processes=3, confirm_max_processes=6)


def _search(speedups: dict[str, float], screened_at: dict[str, float]):  # type: ignore[no-untyped-def]
    trials = [screened(0, "-a=x -b=p", 1.0, SETTINGS, role="baseline")]
    trials += [screened(i, r, s, SETTINGS) for i, (r, s) in enumerate(screened_at.items(), 1)]
    return confirmed(trials, SETTINGS, speedups, state_sd=0.05, block_sd=0.01)


# ------------------------------------------------------------------------------------ latency
def test_per_inference_divides_a_pass_by_its_inferences() -> None:
    lat = per_inference([3.0, 3.0, 6.0, 3.0], 3, route="r", source="screening", trial_index=1)
    assert lat is not None
    assert lat.median_ms == pytest.approx(1.0) and lat.p99_ms == pytest.approx(1.97, rel=1e-2)
    # 4 samples of 3 inferences in 15 ms: 800 inferences a second
    assert lat.throughput_per_s == pytest.approx(800.0)
    assert "ms per inference" in lat.text() and "screening only" in lat.text()
    assert per_inference([], 3, route="r", source="screening", trial_index=1) is None


def test_a_confirmed_route_shows_the_confirmation_reading_everywhere() -> None:
    """Screening read the route 3x faster; the confirmation measured it at about 0.85x: the
    latency, the knob effect, the trial table and the head-to-head all show the latter."""
    trials, _ = _search({"-a=y -b=p": 0.85}, {"-a=y -b=p": 3.0})
    confirm = [t for t in trials if t.role == "confirm" and t.route == "-a=y -b=p"][-1]
    lat = of_route(trials, "-a=y -b=p", "-a=x -b=p", 4)
    assert lat is not None and lat.source == "confirmation" and lat.trial_index == confirm.index
    assert lat.median_ms == pytest.approx(float(np.median(confirm.samples_ms or [])) / 4)
    base = of_route(trials, "-a=x -b=p", "-a=x -b=p", 4)
    assert base is not None and base.source == "confirmation"
    never = of_route(trials[:2], "-a=y -b=p", "-a=x -b=p", 4)
    assert never is not None and never.source == "screening"

    e = explain_search(_header(), trials, SESSION, decide(trials, SETTINGS))
    (effect,) = [k for k in e.knob_effects if k.knob == "a"]
    assert effect.source == "confirmation" and effect.speedup < 1.0
    assert effect.screened_speedup == pytest.approx(3.0, rel=0.1)
    assert f"screening read {effect.screened_speedup:.3f}x" in fig.knob_effect_source(effect)
    fact = next(t for t in e.trials if t.index == 1)
    assert fact.confirmed_speedup is not None and fact.confirmed_speedup < 1.0
    assert fact.latency is not None and fact.latency.source == "screening"
    assert e.baseline_latency is not None and e.baseline_latency.source == "confirmation"
    h = e.head_to_head
    assert h is not None and h.candidate.per_inference is not None
    assert "ms per inference" in " ".join(v for _, v in fig.head_to_head_rows(h))


def test_the_html_charts_take_the_confirmed_reading() -> None:
    pytest.importorskip("plotly")
    from dossier.formats.report import shown_speedup

    trials, _ = _search({"-a=y -b=p": 0.85}, {"-a=y -b=p": 3.0})
    e = explain_search(_header(), trials, SESSION, decide(trials, SETTINGS))
    fact = next(t for t in e.trials if t.index == 1)
    assert shown_speedup(fact) == fact.confirmed_speedup and shown_speedup(fact) < 1.0


# --------------------------------------------------------------------------------- conditions
def _cond(other: float | None, *, cores: int = 4, gpus: list[GpuState] | None = None) -> Conditions:
    return Conditions(wall_s=2.0, cores=cores, load_1m=1.0, other_cpu_s=other, steal_s=0.0,
                      cpu_mhz=None, gpus=gpus or [])


def test_busy_is_other_processes_on_a_share_of_the_cores_or_a_gpu() -> None:
    assert _cond(1.0).other_cores == pytest.approx(0.5) and not _cond(1.0).busy()
    assert _cond(2.0).busy()  # 1 of 4 cores: the 25% share
    assert not _cond(None).busy()
    assert _cond(0.0, gpus=[GpuState(index=0, sm_clock_mhz=1980, mem_clock_mhz=None,
                                     other_processes=1)]).busy()
    s = summarize([_cond(1.0), None, _cond(4.0)])
    assert s is not None and (s.measurements, s.busy) == (2, 1)
    assert "1 on a busy host" in s.text() and summarize([None]) is None
    rows = fig.conditions_rows(s, "confirmation")
    assert rows[-1][0] == "busy host" and "quiet_host" in rows[-1][1]


def test_a_watch_counts_other_processes_not_its_own_children(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    before = conditions._own_cpu()
    subprocess.run([sys.executable, "-c", "sum(range(20_000_000))"], check=True)
    assert conditions._own_cpu() - before > 0.05  # a child's CPU time is dossier's own
    host = iter([(100.0, 1.0), (103.0, 1.5)])  # the host's busy and steal seconds
    own = iter([10.0, 11.0])
    monkeypatch.setattr(conditions, "_host_cpu", lambda: next(host))
    monkeypatch.setattr(conditions, "_own_cpu", lambda: next(own))
    got = Watch().stop()
    assert got.other_cpu_s == pytest.approx(2.0) and got.steal_s == pytest.approx(0.5)


def test_quiet_host_refuses_or_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    busy = [_cond(8.0), _cond(8.0), _cond(0.0)]
    monkeypatch.setattr(conditions.Watch, "stop", lambda self: busy.pop(0))
    assert wait_for_quiet("off", 0.25, 0) is None
    with pytest.raises(TuneError, match="the host is busy"):
        wait_for_quiet("refuse", 0.25, 60, sleep=lambda s: None)
    quiet = wait_for_quiet("wait", 0.25, 60, sleep=lambda s: None)  # busy once, then quiet
    assert quiet is not None and not quiet.busy() and busy == []


# ---------------------------------------------------------------------------------------- cos
def test_cos_is_scale_free_and_handles_a_true_zero() -> None:
    rng = np.random.default_rng(0)
    ref = rng.normal(size=1000) * 1e-9  # logits of a random-init network
    out = ref * (1 + 1e-6 * rng.normal(size=1000))
    small = loss("cos", out, ref)
    assert small is not None and small < 1e-9  # was 1.0: the norms' product is below 1e-12
    assert loss("cos", out * 1e9, ref * 1e9) == pytest.approx(small, abs=1e-12)
    assert loss("cos", np.zeros(4), np.zeros(4)) == 0.0
    assert loss("cos", np.zeros(4), np.ones(4)) == 1.0
    assert loss("cos", -ref, ref) == pytest.approx(2.0)


# ------------------------------------------------------------------------------ threshold
def _vset(scale: float) -> ValidationSet:
    ref = {"y": np.full((2, 3), scale, dtype=np.float32)}
    return ValidationSet(Path("v"), (Pair("pair-000", {"x": np.ones(2)}, ref),))


@pytest.mark.parametrize(("metric", "threshold"), [("cos", 2.0), ("cos", 2.5), ("l0", 1.5)])
def test_a_threshold_above_the_metrics_range_is_refused(metric: str, threshold: float) -> None:
    with pytest.raises(SpecError, match="cannot reject anything"):
        check_threshold(metric, threshold, _vset(1.0))


def test_a_threshold_above_the_references_scale_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="dossier.threshold"):
        check_threshold("linf", 1e-4, _vset(1.0))
        assert not caplog.records
        check_threshold("linf", 1e-4, _vset(1e-9))
    assert "all-zero output" in caplog.text and "linf" in caplog.text
    check_threshold("cos", 1e-3, _vset(1e-9))  # bounded: the range says it all
    check_threshold("l0", 0.5, _vset(1e-9))


# ------------------------------------------------------------------------ external data
def _external_model(folder: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 4), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    return path


def test_external_data_models_are_read_and_a_missing_data_file_is_one_line(tmp_path: Path) -> None:
    from dossier.backends.onnx_model import onnx_signature

    model = _external_model(tmp_path)
    assert [t.name for t in onnx_signature(model).outputs] == ["y"]
    (tmp_path / "model.onnx.data").unlink()
    with pytest.raises(ModelError, match=r"model\.onnx\.data, which is not beside it") as err:
        onnx_signature(model)
    assert "\n" not in str(err.value)


def test_the_optimizer_check_reads_an_external_data_model(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from dossier.backends import get_backend
    from dossier.routes import Route

    model = _external_model(tmp_path)
    backend = get_backend("onnxruntime")
    graph = backend._optimized_graph(model, Route.parse("-graph_optimization_level=all"))  # type: ignore[attr-defined]
    assert b"MatMul" in graph


# ------------------------------------------------------------------------------ smaller items
def test_an_aa_reading_whose_interval_excludes_one_is_not_called_no_difference() -> None:
    from dossier.trial import Reading

    def reading(lo: float, hi: float) -> Reading:
        return Reading(trial_index=0, procedure="screening", speedup=1.005, speedup_ci_low=lo,
                       speedup_ci_high=hi, p_value=0.01, rounds=16, significant=False)

    assert "no difference" in fig.aa_text(reading(0.99, 1.02))
    apart = fig.aa_text(reading(1.001, 1.008))
    assert "no difference" not in apart and "excludes 1.0" in apart


def test_the_latency_axis_is_per_inference_and_keeps_its_title() -> None:
    pytest.importorskip("plotly")
    from dossier.formats.report import latency_axis

    axis = latency_axis([[0.2, 0.3, 0.25], [0.21, 0.35]])
    assert axis["title_text"].startswith("ms per inference") and axis["automargin"] is True


def test_knobs_names_the_contention_sensitive_ones() -> None:
    pytest.importorskip("onnxruntime")
    table = cli("knobs", "intra_op_num_threads", columns=200).stdout
    assert "[contention]" in table
    data = json.loads(cli("knobs", "--json").stdout)
    assert {"intra_op_num_threads", "intra_op_allow_spinning",
            "execution_mode"} <= set(data["contention_knobs"])
    assert "graph_optimization_level" not in data["contention_knobs"]


def test_diff_shows_latency_and_conditions(tmp_path: Path) -> None:
    """Two bundles of one search, one of them recorded on a busy host: diff names both the
    latency per inference and the conditions."""
    import shutil

    from test_formats import GOLDEN

    from dossier.audit import diff_bundles
    from dossier.bundle import open_bundle

    with open_bundle(GOLDEN) as a, open_bundle(GOLDEN) as b:
        same = diff_bundles(a, b)
    assert not [c for c in same.changes if c.section in ("latency", "conditions")]
    copy = tmp_path / GOLDEN.name
    shutil.copytree(GOLDEN, copy)
    cache = copy / "tuning-cache.jsonl"
    lines = cache.read_text().splitlines()
    import json

    busy = _cond(4.0).model_dump(mode="json")
    out = []
    for line in lines:
        rec = json.loads(line)
        if rec.get("kind") == "trial":
            rec["conditions"] = [busy]
            rec["samples_ms"] = [x * 2 for x in rec.get("samples_ms") or []] or None
        out.append(json.dumps(rec))
    cache.write_text("\n".join(out) + "\n")
    with open_bundle(GOLDEN) as a, open_bundle(copy) as b:
        d = diff_bundles(a, b)
    fields = {(c.section, c.field) for c in d.changes}
    assert ("conditions", "busy") in fields and ("latency", "shipped median_ms") in fields
    assert d.b.busy and d.a.busy is None and "busy host" in (d.b.conditions or "")


def test_inspect_and_explain_say_when_a_bundle_was_edited(tmp_path: Path) -> None:
    import shutil

    from conftest import cli
    from test_formats import GOLDEN

    assert "edited" not in cli("inspect", GOLDEN).stderr
    copy = tmp_path / GOLDEN.name
    shutil.copytree(GOLDEN, copy)
    cache = copy / "tuning-cache.jsonl"
    cache.write_text(cache.read_text().replace('"worst_loss":', '"worst_loss": ', 1))
    for command in ("inspect", "explain"):
        r = cli(command, copy)
        assert r.exit_code == 0 and r.stdout
        assert "note: tuning-cache.jsonl does not match the manifest's file table" in r.stderr
    manifest = copy / "manifest.json"
    manifest.write_text(manifest.read_text().replace("Small conv net", "Small conv-net", 1))
    assert "manifest.json no longer matches its dossier id" in cli("inspect", copy).stderr


def test_validation_create_reads_an_external_data_model_and_records_no_host_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``validation create --model`` with an external-data model; the provenance (shipped in
    every bundle) names files, not the tuning host's folders, and a reference function's
    framework versions beside numpy's."""
    import json

    from conftest import cli

    model = _external_model(tmp_path)
    np.savez(tmp_path / "a.npz", x=np.ones((1, 4), np.float32))
    r = cli("validation", "create", tmp_path / "set", "-i", tmp_path / "a.npz", "--reference",
            "onnxruntime-cpu", "--model", model)
    assert r.exit_code == 0, r.output
    prov = json.loads((tmp_path / "set" / "provenance.json").read_text())
    assert prov["model"]["file"] == "model.onnx" and prov["inputs"][0]["file"] == "a.npz"
    assert str(tmp_path) not in json.dumps(prov)

    (tmp_path / "figref.py").write_text(
        "import scipy.special\n"
        "def y(inputs):\n"
        "    return {'y': scipy.special.expit(inputs['x']) * 0 + inputs['x'].sum()}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    r = cli("validation", "create", tmp_path / "set2", "-i", tmp_path / "a.npz", "--reference",
            "figref:y")
    assert r.exit_code == 0, r.output
    versions = json.loads((tmp_path / "set2" / "provenance.json").read_text())["versions"]
    assert set(versions) >= {"numpy", "scipy"}
    (tmp_path / "model.onnx.data").unlink()
    r = cli("validation", "create", tmp_path / "set3", "-i", tmp_path / "a.npz", "--reference",
            "onnxruntime-cpu", "--model", model)
    assert r.exit_code == 3 and "model.onnx.data, which is not beside it" in r.stderr
    assert not (tmp_path / "set3").exists()


def test_a_second_retune_into_one_folder_names_the_bundle(tmp_path: Path) -> None:
    from conftest import cli
    from test_formats import GOLDEN

    out = tmp_path / "out"
    (out / "convnet-2.dossier").mkdir(parents=True)
    (out / ".runs" / "convnet-2").mkdir(parents=True)
    (out / ".runs" / "convnet-2" / "tuning-cache.jsonl").write_text("{}\n")
    r = cli("retune", GOLDEN, "--out", out)
    assert r.exit_code == 7 and "convnet-2.dossier exists already" in r.stderr
    assert "work folder" not in r.stderr


def test_gpu_clocks_and_other_gpu_processes_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """With NVML: each GPU's clocks, and the compute processes on it that are not dossier's."""
    import os
    import sys
    import types

    class Proc:
        def __init__(self, pid: int) -> None:
            self.pid = pid

    nv = types.SimpleNamespace(
        NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetClockInfo=lambda h, which: {1: 1980, 2: 3201}[which],
        nvmlDeviceGetComputeRunningProcesses=lambda h: [Proc(os.getpid()), Proc(2 ** 22 + 7)])
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    (gpu,) = conditions.gpu_states()
    assert (gpu.sm_clock_mhz, gpu.mem_clock_mhz, gpu.other_processes) == (1980, 3201, 1)
    c = Conditions(wall_s=1.0, cores=16, load_1m=0.1, other_cpu_s=0.0, steal_s=None,
                   cpu_mhz=None, gpus=[gpu])
    assert c.busy() and "GPU 0 SM 1980 MHz, 1 other process(es)" in c.text()


def test_a_cos_loss_of_one_names_the_zero_output() -> None:
    zero = loss("cos", np.zeros(3), np.ones(3))
    assert zero == 1.0 and "all-zero output" in fig.loss_cause("cos", zero)
    assert fig.loss_cause("cos", 0.5) == "" and fig.loss_cause("linf", 1.0) == ""


def test_the_zero_output_warning_takes_the_largest_reference(
        caplog: pytest.LogCaptureFixture) -> None:
    """An all-zero engine fails when any output's loss reaches the threshold: the warning
    needs the threshold above the loss on every output, and says nothing for all-zero
    references (zeros are the answer there)."""
    from dossier.threshold import zero_output_loss

    ref = {"a": np.full(4, 1e-9, np.float32), "b": np.full(4, 1.0, np.float32)}
    vset = ValidationSet(Path("v"), (Pair("pair-000", {"x": np.ones(2)}, ref),))
    assert zero_output_loss("linf", vset) == pytest.approx(1.0)
    with caplog.at_level(logging.WARNING, logger="dossier.threshold"):
        check_threshold("linf", 1e-4, vset)  # output b rejects an all-zero engine
        check_threshold("linf", 1e-4, _vset(0.0))
        assert not caplog.records
        check_threshold("linf", 2.0, vset)
    assert "1 at most" in caplog.text


def test_report_latency_axis_fits_the_samples_and_routes_wrap_between_knobs(
        convnet_bundle: Path, tmp_path: Path) -> None:
    pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")
    from dossier.formats.report import beyond_axis, latency_axis

    fast = [0.17 + 0.001 * (i % 7) for i in range(100)]
    slow = [0.54 + 0.002 * (i % 5) for i in range(99)] + [50.0]  # one straggler
    axis = latency_axis([fast, slow])
    assert axis["type"] == "log" and 10 ** axis["range"][1] < 2 and 10 ** axis["range"][0] > 0.1
    assert beyond_axis([fast, slow]) == "1 sample(s) beyond the axis: zoom out."
    axis = latency_axis([fast, [x * 1.5 for x in fast]])
    assert axis["type"] == "linear" and 0.1 < axis["range"][0] and axis["range"][1] < 0.3
    page = tmp_path / "r.html"
    assert cli("explain", convnet_bundle, "--html", page).exit_code == 0
    html = page.read_text()
    axis = json.loads(re.search(r'"yaxis":(\{"title":\{"text":"ms per inference[^}]*\},'
                                r'[^}]*\})', html).group(1))  # type: ignore[union-attr]
    low, high = (10 ** v for v in axis["range"]) if axis["type"] == "log" else axis["range"]
    doc = json.loads(cli("explain", convnet_bundle, "--json").stdout)
    pairs = doc["search"]["inferences_per_sample"]  # a trial's median is per sample, the axis per inference
    medians = [t["median_ms"] / pairs for t in doc["trials"] if t.get("median_ms")]
    assert low > 0 and low < min(medians) and max(medians) < high  # not from zero, all shown
    assert axis["type"] == "log" or high < 3 * pairs * max(medians)  # as before: per pass
    assert '<span class="tok">-graph_optimization_level=all</span>' in html
    assert "span.tok{white-space:nowrap}" in html
