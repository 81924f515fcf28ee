"""Tests for dossier.verify.policy: verdict rules, default policies, policy files, diff."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dossier.backends import backend_names, default_policy, get_backend, requirement_findings
from dossier.errors import ExitCode, InputError, SpecError
from dossier.fingerprint import Fingerprint, GpuInfo, collect
from dossier.verify.policy import (
    Finding,
    Policy,
    Rule,
    Verdict,
    diff,
    diff_fields,
    load_policy,
    overall,
    worst,
)

VALID, SUBOPTIMAL, INVALID = Verdict.VALID, Verdict.SUBOPTIMAL, Verdict.INVALID
BACKENDS = ("onnxruntime", "torch-inductor", "tensorrt")
"""The backends dossier ships a verify policy for."""


def test_every_user_backend_has_a_policy_and_only_tensorrt_has_requirements() -> None:
    """The registry offers exactly the shipped backends (the test backend is hidden), each
    contributes its own rules through the backend, and only TensorRT requires a GPU."""
    assert backend_names() == sorted(BACKENDS)
    assert "faulty" in backend_names(include_tests=True)
    bare = collect(include_gpu=False)
    for name in BACKENDS:
        own = get_backend(name).policy_rules()
        assert own and set(own) <= set(default_policy(name).rules)
        needs = {f.field for f in requirement_findings(name, bare)}
        assert needs == ({"requires.gpu", "requires.tensorrt"} if name == "tensorrt" else set())
    assert requirement_findings("no-such-backend", bare) == []


@functools.cache
def _host() -> Fingerprint:
    return collect(include_gpu=False)


def _h200() -> Fingerprint:
    gpu = GpuInfo(index=0, name="NVIDIA H200", uuid="GPU-aaaa", compute_capability="9.0",
                  memory_total_mib=143771, sm_count=132, driver_version="580.159.04",
                  cuda_driver_version="13.0", mig_mode="disabled", power_limit_w=700.0)
    return _host().model_copy(update={"gpus": [gpu], "cuda_runtime": "13.0.96",
                                      "packages": {**_host().packages, "torch": "2.9.0",
                                                   "tensorrt": "11.1.0"}})


def _with_gpu(fp: Fingerprint, **changes: object) -> Fingerprint:
    gpus = [fp.gpus[0].model_copy(update=changes), *fp.gpus[1:]]
    return fp.model_copy(update={"gpus": gpus})


def _with_cpu(fp: Fingerprint, **changes: object) -> Fingerprint:
    return fp.model_copy(update={"cpu": fp.cpu.model_copy(update=changes)})


def _finding(findings: list[Finding], field: str) -> Finding:
    return next(f for f in findings if f.field == field)


def test_worst_and_ordering() -> None:
    assert worst([VALID, SUBOPTIMAL, VALID]) is SUBOPTIMAL
    assert worst([SUBOPTIMAL, INVALID, VALID]) is INVALID
    assert worst(iter([VALID])) is VALID
    assert [v.severity for v in Verdict] == [0, 1, 2]
    assert [v.exit_code for v in Verdict] == [ExitCode.OK, ExitCode.SUBOPTIMAL, ExitCode.INVALID]
    with pytest.raises(ValueError):
        worst([])
    with pytest.raises(ValueError):
        overall([])


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_fingerprint_is_valid(backend: str) -> None:
    for fp in (_host(), _h200()):
        findings = diff(fp, fp, default_policy(backend))
        assert findings
        assert overall(findings) is VALID
        assert all(f.reason == "unchanged" and not f.changed for f in findings)
        assert not any(f.field == "collected_at" for f in findings)


def test_collected_at_and_hostname_do_not_matter() -> None:
    other = _host().model_copy(update={"collected_at": "1999-01-01T00:00:00+00:00",
                                       "hostname": "elsewhere"})
    findings = diff(_host(), other, default_policy("onnxruntime"))
    assert overall(findings) is VALID
    assert _finding(findings, "hostname").changed
    assert not any(f.field == "collected_at" for f in findings)


@pytest.mark.parametrize("backend", ["torch-inductor", "tensorrt"])
def test_other_gpu_model_same_architecture_is_suboptimal(backend: str) -> None:
    h100 = _with_gpu(_h200(), name="NVIDIA H100 80GB HBM3", uuid="GPU-bbbb")
    findings = diff(_h200(), h100, default_policy(backend))
    assert overall(findings) is SUBOPTIMAL
    assert findings[0].field == "gpu[0].name"
    assert findings[0].verdict is SUBOPTIMAL
    assert findings[0].reason.endswith(".")
    assert _finding(findings, "gpu[0].uuid").verdict is VALID


@pytest.mark.parametrize("backend", ["torch-inductor", "tensorrt"])
def test_other_architecture_is_invalid(backend: str) -> None:
    a100 = _with_gpu(_h200(), name="NVIDIA A100-SXM4-80GB", compute_capability="8.0")
    findings = diff(_h200(), a100, default_policy(backend))
    assert overall(findings) is INVALID
    assert findings[0].field == "gpu[0].compute_capability"
    assert (findings[0].bundle_value, findings[0].host_value) == ("9.0", "8.0")
    assert _finding(findings, "gpu[0].name").verdict is SUBOPTIMAL


def test_tensorrt_hardware_compatible_plan_is_suboptimal() -> None:
    a100 = _with_gpu(_h200(), name="NVIDIA A100-SXM4-80GB", compute_capability="8.0")
    findings = diff(_h200(), a100, default_policy("tensorrt"), {"hardware_compatible": True})
    assert overall(findings) is SUBOPTIMAL
    assert _finding(findings, "gpu[0].compute_capability").verdict is SUBOPTIMAL


def test_tensorrt_version_change() -> None:
    newer = _h200().model_copy(update={"packages": {**_h200().packages, "tensorrt": "11.2.0"}})
    policy = default_policy("tensorrt")
    assert overall(diff(_h200(), newer, policy)) is INVALID
    assert overall(diff(_h200(), newer, policy, {"version_compatible": True})) is SUBOPTIMAL
    flat = {"engine.tensorrt_version": "11.1.0.5"}
    assert overall(diff_fields(flat, {"engine.tensorrt_version": "11.2.0.1"}, policy)) is INVALID


def test_onnxruntime_version_change_is_invalid() -> None:
    other = _host().model_copy(update={"packages": {**_host().packages, "onnxruntime": "0.0.1"}})
    findings = diff(_host(), other, default_policy("onnxruntime"))
    assert overall(findings) is INVALID
    assert findings[0].field == "packages.onnxruntime"


def test_package_missing_on_one_side_is_a_change() -> None:
    packages = {k: v for k, v in _host().packages.items() if k != "onnxruntime"}
    bundle = _host().model_copy(update={"packages": {**packages, "onnxruntime": "1.32.0"}})
    findings = diff(bundle, _host().model_copy(update={"packages": packages}),
                    default_policy("onnxruntime"))
    first = findings[0]
    assert (first.field, first.verdict) == ("packages.onnxruntime", INVALID)
    assert first.host_value is None


def test_openvino_packages_decide_for_openvino_routes_only() -> None:
    """onnxruntime-openvino is ONNX Runtime: a change is INVALID for every route. The plug-in
    compiles an OpenVINO route: a change is INVALID for one, VALID for a CPU-provider route."""
    policy = default_policy("onnxruntime")
    plain = {k: v for k, v in _host().packages.items()
             if k not in ("onnxruntime-ep-openvino", "onnxruntime-openvino")}
    host = _host().model_copy(update={"packages": plain})  # the same on a host with either
    plugin = host.model_copy(update={"packages": {**plain, "onnxruntime-ep-openvino": "1.8.1"}})
    assert overall(diff(plugin, host, policy, {"openvino": True})) is INVALID
    findings = diff(plugin, host, policy, {"openvino": False})
    assert _finding(findings, "packages.onnxruntime-ep-openvino").verdict is VALID
    assert overall(findings) is VALID
    built_in = host.model_copy(update={"packages": {**plain, "onnxruntime-openvino": "1.24.1"}})
    assert overall(diff(built_in, host, policy, {"openvino": False})) is INVALID


def test_cpu_isa_change_depends_on_layout_optimization() -> None:
    bundle = _with_cpu(_host(), isa_flags=["avx", "avx2", "avx512f", "fma"])
    host = _with_cpu(_host(), isa_flags=["avx", "avx2", "fma"])
    policy = default_policy("onnxruntime")
    assert overall(diff(bundle, host, policy, {"layout_optimized": True})) is INVALID
    findings = diff(bundle, host, policy, {"layout_optimized": False})
    assert overall(findings) is SUBOPTIMAL
    assert "instruction set" in findings[0].reason
    assert overall(diff(bundle, host, policy)) is SUBOPTIMAL  # a missing fact counts as false


def test_inductor_cpu_package() -> None:
    bundle = _with_cpu(_h200(), isa_flags=["avx", "avx2", "avx512f"])
    host = _with_cpu(_host(), isa_flags=["avx", "avx2"])  # and no GPU at all
    policy = default_policy("torch-inductor")
    assert overall(diff(bundle, host, policy, {"cpu_package": True})) is INVALID  # ISA
    same_isa = _with_cpu(_host(), isa_flags=bundle.cpu.isa_flags)
    findings = diff(bundle, same_isa, policy, {"cpu_package": True})
    assert _finding(findings, "gpu.count").verdict is VALID
    assert _finding(findings, "cuda_runtime").verdict is VALID
    # a GPU package on a host without GPU cannot run
    findings = diff(bundle, same_isa, policy)
    assert overall(findings) is INVALID
    assert _finding(findings, "gpu.count").verdict is INVALID
    assert _finding(findings, "cpu.isa_flags").verdict is VALID


def test_gpu_count_change() -> None:
    two = _h200().model_copy(update={"gpus": [*_h200().gpus,
                                              _h200().gpus[0].model_copy(update={"index": 1})]})
    for backend in ("torch-inductor", "tensorrt"):
        findings = diff(_h200(), two, default_policy(backend))
        assert overall(findings) is VALID
        assert _finding(findings, "gpu.count").changed
        assert not any(f.field.startswith("gpu[1]") for f in findings)
        no_gpu = _h200().model_copy(update={"gpus": []})
        lost = diff(_h200(), no_gpu, default_policy(backend))
        assert _finding(lost, "gpu.count").verdict is INVALID
    assert overall(diff(_h200(), _host(), default_policy("onnxruntime"))) is VALID


def test_findings_are_sorted_worst_then_changed_first() -> None:
    host = _with_gpu(_h200(), name="NVIDIA A100-SXM4-80GB", compute_capability="8.0",
                     uuid="GPU-cccc")
    findings = diff(_h200(), host, default_policy("tensorrt"))
    keys = [(-f.verdict.severity, not f.changed) for f in findings]
    assert keys == sorted(keys)
    assert [f.field for f in findings if f.changed][-1] == "gpu[0].uuid"
    assert len({f.field for f in findings}) == len(findings)


def test_rule_semantics() -> None:
    rule = Rule(pattern="gpu[*].name", verdict="invalid", reason="Because.")
    assert rule.verdict is INVALID
    assert rule.matches("gpu[0].name") and rule.matches("gpu[12].name")
    assert not rule.matches("gpu0.name") and not rule.matches("gpu[0].name_x")
    assert Rule(pattern="python.*", verdict=VALID, reason="x").matches("python.version")
    fall_through = Rule(pattern="a", verdict=INVALID, reason="x", when="f")
    assert fall_through.decide({}) is None
    assert fall_through.decide({"f": True}) == (INVALID, "x")
    catch_all = Rule(pattern="*", verdict=SUBOPTIMAL, reason="y")
    policy = Policy(rules=(fall_through, catch_all), default=INVALID)
    assert policy.evaluate("a", {}) == (SUBOPTIMAL, "y")
    assert Policy(default=SUBOPTIMAL).evaluate("z", {})[0] is SUBOPTIMAL
    with pytest.raises(ValueError, match="needs 'when'"):
        Rule(pattern="a", verdict=INVALID, reason="x", otherwise=VALID)


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_policies_have_reasons(backend: str) -> None:
    for rule in default_policy(backend).rules:
        for reason in (rule.reason, rule.otherwise_reason):
            assert reason is None or (reason[0].isupper() and reason.endswith(".")), reason


def test_unknown_backend() -> None:
    with pytest.raises(InputError, match="tensorflow"):
        default_policy("tensorflow")


def test_policy_file_override(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('default = "suboptimal"\n\n[[rule]]\npattern = "packages.onnxruntime"\n'
                    'verdict = "SUBOPTIMAL"\nreason = "We ship the ORT version with the engine."\n')
    base = default_policy("onnxruntime")
    policy = load_policy(path, base)
    assert policy.rules[0].pattern == "packages.onnxruntime"
    assert policy.rules[1:] == base.rules
    assert policy.default is SUBOPTIMAL
    other = _host().model_copy(update={"packages": {**_host().packages, "onnxruntime": "0.0.1"}})
    findings = diff(_host(), other, policy)
    assert overall(findings) is SUBOPTIMAL
    assert findings[0].reason == "We ship the ORT version with the engine."


def test_empty_policy_file_keeps_base(tmp_path: Path) -> None:
    path = tmp_path / "empty.toml"
    path.write_text("")
    assert load_policy(path, default_policy("tensorrt")) == default_policy("tensorrt")


@pytest.mark.parametrize(("text", "message"), [
    ("[[rule]\npattern = 'x'", "not valid TOML"),
    ("[[rule]]\npattern = 'x'\nverdict = 'FINE'\nreason = 'r'\n", "rule[0].verdict"),
    ("[[rule]]\npattern = 'x'\nverdict = 'VALID'\nreason = 'r'\ncolour = 'red'\n",
     "unknown key 'rule[0].colour'"),
    ("[[rule]]\npattern = 'x'\nverdict = 'VALID'\n", "missing key 'rule[0].reason'"),
    ("defaults = 'VALID'\n", "unknown key 'defaults'"),
    ("default = 'MAYBE'\n", "default"),
    ("rule = 3\n", "rule"),
    ("[[rule]]\npattern = 'x'\nverdict = 'VALID'\nreason = 'r'\notherwise = 'INVALID'\n",
     "needs 'when'"),
])
def test_malformed_policy_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(SpecError, match="policy.toml") as info:
        load_policy(path, default_policy("onnxruntime"))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_unreadable_policy_files(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read"):
        load_policy(tmp_path / "missing.toml", Policy())
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(SpecError, match="UTF-8"):
        load_policy(binary, Policy())


_toml_like = st.lists(st.sampled_from([
    "[[rule]]\n", "[rule]\n", "pattern = 'gpu*'\n", "verdict = 'INVALID'\n", "verdict = 1\n",
    "reason = 'r'\n", "when = 'x'\n", "otherwise = 'VALID'\n", "default = 'SUBOPTIMAL'\n",
    "default = [1, 2]\n", "x = 1979-05-27\n", "rule = []\n", "= \n", "[[", "\"\"\"", "\n",
])).map("".join)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(), _toml_like))
def test_load_policy_never_raises_anything_else(tmp_path: Path, text: str) -> None:
    path = tmp_path / "fuzz.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        policy = load_policy(path, Policy())
    except SpecError as exc:
        assert "\n" not in str(exc)
    else:
        assert isinstance(policy, Policy)
