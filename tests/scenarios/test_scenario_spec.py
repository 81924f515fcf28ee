"""``[scenario]`` of a release spec: the default is today's single-stream, and nonsense is
refused up front in one line (exit 3)."""

from __future__ import annotations

from pathlib import Path

import _bundles as h
import pytest
from test_spec import SPEC as BASE

from dossier.errors import ExitCode, SpecError
from dossier.scenario import ScenarioSection, check_bound
from dossier.spec import load_spec


def _spec(tmp_path: Path, scenario: str) -> Path:
    path = tmp_path / "release.toml"
    path.write_text(BASE + "[scenario]\n" + scenario if scenario else BASE)
    return path


def test_the_default_is_single_stream(tmp_path: Path) -> None:
    spec = load_spec(_spec(tmp_path, ""))
    assert spec.scenario.kind == "single-stream" and not spec.scenario.loadgen
    assert spec.scenario.describe() == "single-stream"


def test_a_server_scenario_reads_back(tmp_path: Path) -> None:
    spec = load_spec(_spec(tmp_path, 'kind = "server"\nlatency_ms = 2.5\npercentile = 95\n'
                                     "target_qps = 300\n"))
    s = spec.scenario
    assert (s.kind, s.latency_ms, s.percentile, s.target_qps) == ("server", 2.5, 95, 300)
    assert s.bound_ns == 2_500_000 and s.loadgen
    assert s.describe() == "server: p95 <= 2.5 ms, target 300 QPS"


@pytest.mark.parametrize(("body", "said"), [
    ('kind = "server"\nlatency_ms = 5\ntarget_qps = 0\n', "scenario.target_qps: Input should "
                                                          "be greater than 0"),
    ('kind = "server"\nlatency_ms = 5\ntarget_qps = -3\n', "greater than 0"),
    ('kind = "server"\nlatency_ms = 5\npercentile = 100\n', "scenario.percentile: Input should "
                                                            "be less than 100"),
    ('kind = "server"\nlatency_ms = 5\npercentile = 0\n', "scenario.percentile"),
    ('kind = "server"\nlatency_ms = 0\n', "scenario.latency_ms"),
    ('kind = "server"\nlatency_ms = nan\n', "scenario.latency_ms"),
    ('kind = "server"\n', "needs latency_ms"),
    ('kind = "offline"\nlatency_ms = 5\n', 'latency_ms only applies to kind = "server"'),
    ('target_qps = 10\n', "target_qps only applies"),
    ('kind = "multi"\n', "scenario.kind"),
    ('kind = "server"\nlatency_ms = 5\nlatncy = 3\n', "did you mean latency_ms"),
    ('kind = "server"\nlatency_ms = 5\nduration_s = 1e9\n', "scenario.duration_s"),
])
def test_nonsense_is_refused_in_one_line(tmp_path: Path, body: str, said: str) -> None:
    with pytest.raises(SpecError, match=None) as info:
        load_spec(_spec(tmp_path, body))
    assert said in str(info.value) and "\n" not in str(info.value)
    assert info.value.exit_code == ExitCode.INPUT == 3


def test_the_cli_says_it_in_one_line_with_exit_3(tmp_path: Path) -> None:
    path = _spec(tmp_path, 'kind = "server"\nlatency_ms = 5\npercentile = 120\n')
    res = h.cli("tune", str(path))
    assert res.exit_code == 3
    assert "scenario.percentile" in res.stderr and "Traceback" not in res.stderr


def test_a_bound_below_one_inference_is_refused() -> None:
    server = ScenarioSection(kind="server", latency_ms=1.0)
    check_bound(server, 0.4)  # meetable
    with pytest.raises(SpecError, match=r"latency_ms = 1 ms is below the engine's "
                                        r"single-inference time here \(2\.5 ms\)"):
        check_bound(server, 2.5)
    check_bound(ScenarioSection(kind="offline"), 1e9)  # no bound to meet


def test_the_server_sample_spec_reads_back() -> None:
    spec = load_spec(h.REPO / "samples" / "tblock-server" / "release.toml")
    s = spec.scenario
    assert (s.kind, s.latency_ms, s.percentile) == ("server", 20.0, 99.0)
    assert "-serving_sessions=[1|2]" in spec.tune.selection
    assert spec.model_path().name == "model.onnx" and spec.model_path().parent.name == "tblock"


def test_the_offline_sample_spec_reads_back_and_its_knobs_exist() -> None:
    from dossier.backends import get_backend
    from dossier.routes import Selection

    spec = load_spec(h.REPO / "samples" / "tblock-offline" / "release.toml")
    assert spec.scenario.kind == "offline" and spec.scenario.latency_ms is None
    selection = Selection.parse(spec.tune.selection, get_backend("onnxruntime").knob_database())
    assert {i.knob for i in selection.items} == {"quantization", "serving_batch"}
