"""dossier.backends.tensorrt: everything that can be checked without TensorRT, and the rest
skipped with a reason where TensorRT is absent.

The knob JSON and plan bytes below follow the documented formats (TensorRT 11.x
``all_build_routes`` and the plan header layout read by trtexec's printPlanVersion); they are
written by hand, not captured from a TensorRT installation.
"""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnx.helper as oh
import pydantic
import pytest
from _trt_api import Api, Checked

from dossier.backends.interface import BuildError, EngineRuntimeError, LoadConfig
from dossier.backends.onnx_model import onnx_signature
from dossier.backends.tensorrt import (
    BuilderOptions,
    InputProfile,
    KnobJsonError,
    PlanHeaderError,
    TensorRTBackend,
    optimization_profile,
    parse_knob_json,
    parse_plan_header,
    read_plan_header,
    set_build_route,
)
from dossier.errors import (
    BackendUnavailableError,
    BundleError,
    DossierError,
    ExitCode,
    InputError,
    SelectionError,
)
from dossier.routes import Route, Selection
from dossier.schema import field_docs

HAVE_TRT = importlib.util.find_spec("tensorrt") is not None
needs_trt = pytest.mark.skipif(not HAVE_TRT, reason="TensorRT not installed")

# Follows the documented all_build_routes format; not captured output.
KNOB_JSON = json.dumps({
    "tuner_version": "2.19.15",
    "tuner_options": [
        {"option": "-conv_use_long_w", "allowed_values": "-conv_use_long_w=[on|off]",
         "default_value": "on", "help": "Convert Conv [N, C, X, 1] to a long-W form"},
        {"option": "-kgen:codegen:cuda_tile", "allowed_values": "-kgen:codegen:cuda_tile=[0|1|2]",
         "default_value": "0", "help": "cuda tile code generation"},
        {"option": "-kgen:tiling", "allowed_values": "-kgen:tiling=[none|auto|aggressive]",
         "default_value": "auto", "help": "kernel generator tiling"},
        {"option": "-peep:max", "allowed_values": "-peep:max=int32_t",
         "default_value": "16", "help": "peephole passes"},
        {"option": "-cask_fusion:num_tactics", "allowed_values": "-cask_fusion:num_tactics=[1|2|...]",
         "default_value": "4", "help": "tactics per fusion"},
    ],
})


def _opt(option: str, allowed: str, default: str, **more: object) -> dict:
    return {"option": option, "allowed_values": allowed, "default_value": default,
            "help": "", **more}


def _db_json(*options: dict, version: str = "2.19.15") -> str:
    return json.dumps({"tuner_version": version, "tuner_options": list(options)})


@pytest.fixture
def db():
    return parse_knob_json(KNOB_JSON)


# ------------------------------------------------------------------------------- knob JSON

def test_bounded_knob(db):
    knob = db.get("conv_use_long_w")
    assert knob.values == ("on", "off")
    assert knob.default == "on"
    assert knob.bounded
    assert knob.help.startswith("Convert Conv")
    assert db.backend == "tensorrt"
    assert db.tuner_version == "2.19.15"
    assert db.names() == ["conv_use_long_w", "kgen:codegen:cuda_tile", "kgen:tiling",
                          "peep:max", "cask_fusion:num_tactics"]


def test_unbounded_type_knob(db):
    knob = db.get("-peep:max")
    assert knob.values is None
    assert knob.value_hint == "int32_t"
    assert knob.default == "16"
    assert knob.allowed_text() == "-peep:max=int32_t"


def test_ellipsis_in_brackets_is_unbounded(db):
    knob = db.get("cask_fusion:num_tactics")
    assert knob.values is None
    assert knob.value_hint == "[1|2|...]"
    assert knob.allowed_text() == "-cask_fusion:num_tactics=[1|2|...]"


def test_namespaced_names_keep_colons(db):
    assert db.get("-kgen:codegen:cuda_tile").values == ("0", "1", "2")


def test_help_may_be_missing_and_extra_fields_are_ignored():
    entry = {"option": "-a", "allowed_values": "-a=[x|y]", "default_value": "x", "since": "11.2"}
    knob = parse_knob_json(_db_json(entry)).get("a")
    assert knob.help == "" and knob.values == ("x", "y")


def test_digest_tracks_defaults():
    a = parse_knob_json(_db_json(_opt("-a", "-a=[x|y]", "x")))
    b = parse_knob_json(_db_json(_opt("-a", "-a=[x|y]", "y")))
    assert a.digest() != b.digest()


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"tuner_options": []}), "tuner_version"),
    (json.dumps({"tuner_version": "1", "tuner_options": {}}), "tuner_options list"),
    (_db_json("-a=[x|y]"), "is not a JSON object"),
    (_db_json({"option": "-a", "default_value": "x"}), "no 'allowed_values'"),
    (_db_json({"allowed_values": "-a=[x]", "default_value": "x"}), "no 'option'"),
    (_db_json({"option": "-a", "allowed_values": "-a=[x]"}), "no 'default_value'"),
    (_db_json(_opt("-a", "-a=[x|y]", 1)), "'default_value' is not a string"),
    (_db_json(_opt("-a", "-a=[x|y]", "x", help=3)), "'help' is not a string"),
    (_db_json(_opt("-a", "-b=[x|y]", "x")), "names knob -b, not -a"),
    (_db_json(_opt("-a", "-a=[x|y]", "z")), "default_value 'z' is not one of"),
    (_db_json(_opt("-a", "-a=[x|y]", "x"), _opt("-a", "-a=[x|y]", "y")), "listed twice"),
    (_db_json(_opt("-a", "-a=[x|x]", "x")), "value 'x' is listed twice"),
    (_db_json(_opt("-a", "-a=[x|]", "x")), "empty or unusable value"),
    (_db_json(_opt("-a", "-a=[]", "x")), "empty or unusable value"),
    (_db_json(_opt("-a", "-a=[x|y", "x")), "unbalanced brackets"),
    (_db_json(_opt("-a", "-a", "x")), "not of the form"),
    (_db_json(_opt("-a", "-a=", "x")), "names no value type"),
    (_db_json(_opt("-a b", "-a b=[x]", "x")), "not a usable knob name"),
    (_db_json(_opt("-", "-=[x]", "x")), "not a usable knob name"),
])
def test_malformed_knob_json(text, message):
    with pytest.raises(KnobJsonError, match=message) as info:
        parse_knob_json(text)
    assert isinstance(info.value, InputError)
    assert info.value.exit_code is ExitCode.INPUT
    assert "all_build_routes" in info.value.diagnostics()


@pytest.mark.parametrize("text", ["", "  \n"])
def test_empty_knob_json_means_tuner_unavailable(text):
    with pytest.raises(BackendUnavailableError, match="not available on this platform") as info:
        parse_knob_json(text)
    assert "RTX" in info.value.diagnostics() and "Windows" in info.value.diagnostics()


# ------------------------------------------------------------------------ selections on the DB

def test_selection_parses_against_trt_db(db):
    sel = Selection.parse("-kgen:tiling=[none|aggressive] -peep:max=32 -conv_use_long_w=off", db)
    assert [(i.knob, i.values, i.pinned) for i in sel.items] == [
        ("kgen:tiling", ("none", "aggressive"), False), ("peep:max", ("32",), True),
        ("conv_use_long_w", ("off",), True)]
    assert sel.baseline(db).text() == "-conv_use_long_w=off -kgen:tiling=auto -peep:max=32"


@pytest.mark.parametrize("knob", ["peep:max", "cask_fusion:num_tactics"])
def test_unbounded_knob_can_be_pinned_not_swept(db, knob):
    assert Selection.parse(f"-{knob}=7", db).items[0].values == ("7",)
    with pytest.raises(SelectionError, match="unbounded"):
        Selection.parse(f"-{knob}=[1|2]", db)


@pytest.mark.parametrize("text, message", [
    ("-conv_use_long=[on|off]", "unknown knob -conv_use_long"),
    ("-conv_use_long_w=[on|maybe]", "'maybe' is not allowed"),
    ("-kgen:codegen:cuda_tile=3", "'3' is not allowed"),
    ("-kgen:tiling=none -kgen:tiling=auto", "appears twice"),
    ("-kgen:tiling=[none|none]", "listed twice"),
    ("", "empty"),
])
def test_selection_errors_on_trt_db(db, text, message):
    with pytest.raises(SelectionError, match=message):
        Selection.parse(text, db)


def test_unknown_knob_suggests_close_names(db):
    with pytest.raises(SelectionError) as info:
        Selection.parse("-kgen:codegen:cuda_til=1", db)
    assert "-kgen:codegen:cuda_tile" in info.value.diagnostics()


# ------------------------------------------------------------------------------- plan header

def _plan(tag: int = 0x74727466, version: int = 0, trt: tuple[int, int, int, int] = (11, 1, 0, 106),
          tail: bytes = b"\x00" * 64) -> bytes:
    """Bytes laid out as the documented plan header (tag u32 LE at 0, serialization version u32
    at 4, TensorRT major/minor/patch/build at 24..27); not a captured plan."""
    return struct.pack("<II", tag, version) + b"\x00" * 16 + bytes(trt) + tail


def test_plan_header_fields():
    h = parse_plan_header(_plan(trt=(11, 4, 0, 106)))
    assert h.tag == 0x74727466
    assert h.serialization_version == 0
    assert h.trt_version == (11, 4, 0, 106)
    assert h.trt_version_text == "11.4.0.106"
    assert h.facts() == {"plan_tag": "0x74727466", "plan_serialization_version": "0",
                         "plan_trt_version": "11.4.0.106"}


def test_plan_tag_is_little_endian_ftrt():
    assert _plan()[:4] == b"ftrt"
    assert parse_plan_header(b"ftrt" + _plan()[4:]).tag == 0x74727466


def test_exactly_28_bytes_are_enough(tmp_path):
    assert parse_plan_header(_plan(tail=b"")).trt_version == (11, 1, 0, 106)
    path = tmp_path / "x.plan"
    path.write_bytes(_plan())
    assert read_plan_header(path).trt_version_text == "11.1.0.106"


@pytest.mark.parametrize("data, message", [
    (b"", "not a TensorRT plan"),
    (b"ftr", "not a TensorRT plan"),
    (b"\x7fELF" + b"\x00" * 60, "tag 0x464c457f"),
    (b"PK\x03\x04" + b"\x00" * 60, "not a TensorRT plan"),
    (_plan()[:27], "truncated"),
    (_plan(version=237), "serialization version 237"),
])
def test_plan_header_errors(data, message):
    with pytest.raises(PlanHeaderError, match=message) as info:
        parse_plan_header(data)
    assert isinstance(info.value, BundleError)
    assert info.value.exit_code is ExitCode.BUNDLE


def test_read_plan_header_missing_file(tmp_path):
    with pytest.raises(PlanHeaderError, match="cannot read"):
        read_plan_header(tmp_path / "absent.plan")


# --------------------------------------------------------------------------- builder options

class FakeEnum:
    """Stands in for a TensorRT enum: attribute access gives 'Enum.MEMBER'."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, member: str) -> str:
        return f"{self._name}.{member}"


API = Api()
"""The names of the real TensorRT bindings (every version listed in tests/assets/tensorrt-api)."""

FAKE_TRT = SimpleNamespace(
    TilingOptimizationLevel=FakeEnum("TilingOptimizationLevel"),
    HardwareCompatibilityLevel=FakeEnum("HardwareCompatibilityLevel"),
    BuilderFlag=FakeEnum("BuilderFlag"), MemoryPoolType=FakeEnum("MemoryPoolType"),
    RuntimePlatform=FakeEnum("RuntimePlatform"))


class FakeConfig:
    """Records what is set on it, like an IBuilderConfig would hold it."""

    def __init__(self) -> None:
        self.flags: set[str] = {"BuilderFlag.VERSION_COMPATIBLE"}  # stale state to be cleared
        self.pools: dict[str, int] = {}
        self.attrs: dict[str, object] = {}

    def __setattr__(self, name: str, value: object) -> None:
        if name in ("flags", "pools", "attrs"):
            object.__setattr__(self, name, value)
        else:
            self.attrs[name] = value

    def set_flag(self, flag: str) -> None:
        self.flags.add(flag)

    def clear_flag(self, flag: str) -> None:
        self.flags.discard(flag)

    def set_memory_pool_limit(self, pool: str, size: int) -> None:
        self.pools[pool] = size


def test_builder_option_defaults_follow_trtexec():
    opts = BuilderOptions()
    assert opts.builder_optimization_level == 3
    assert opts.tiling_optimization_level == "none"
    assert opts.avg_timing_iterations == 8
    doc = " ".join(field_docs(BuilderOptions)["avg_timing_iterations"].split())
    assert "API's default is 1; we follow trtexec's 8" in doc
    assert opts.to_trtexec_args() == [
        "--builderOptimizationLevel=3", "--tilingOptimizationLevel=0", "--avgTiming=8",
        "--hardwareCompatibilityLevel=none"]


def test_builder_options_to_trtexec_args():
    opts = BuilderOptions(builder_optimization_level=5, tiling_optimization_level="moderate",
                          hardware_compatibility_level="ampere_plus", version_compatible=True,
                          exclude_lean_runtime=True, avg_timing_iterations=16,
                          max_aux_streams=0, workspace_bytes=1 << 30,
                          runtime_platform="windows_amd64")
    assert " ".join(opts.to_trtexec_args()) == (
        "--builderOptimizationLevel=5 --tilingOptimizationLevel=2 --avgTiming=16 "
        "--hardwareCompatibilityLevel=ampere+ --versionCompatible --excludeLeanRuntime "
        "--maxAuxStreams=0 --memPoolSize=workspace:1073741824B --runtimePlatform=WindowsAMD64")
    same_cc = BuilderOptions(hardware_compatibility_level="same_compute_capability")
    assert "--hardwareCompatibilityLevel=sameComputeCapability" in same_cc.to_trtexec_args()


def _checked(cfg: FakeConfig) -> tuple[object, object]:
    """The fake module and config as TensorRT 11.x objects: names outside the real bindings
    fail the test (see tests/_trt_api.py)."""
    return Checked(cfg, "IBuilderConfig", API, {}), Checked(FAKE_TRT, None, API, {})


def test_builder_options_apply_defaults_to_fake_config():
    cfg = FakeConfig()
    BuilderOptions().apply(*_checked(cfg))
    assert cfg.attrs == {
        "builder_optimization_level": 3,
        "tiling_optimization_level": "TilingOptimizationLevel.NONE",
        "hardware_compatibility_level": "HardwareCompatibilityLevel.NONE",
        "avg_timing_iterations": 8,
        "runtime_platform": "RuntimePlatform.SAME_AS_BUILD"}
    assert cfg.flags == set()  # the stale VERSION_COMPATIBLE flag is cleared
    assert cfg.pools == {}


def test_builder_options_apply_everything_to_fake_config():
    cfg = FakeConfig()
    BuilderOptions(builder_optimization_level=0, tiling_optimization_level="full",
                   hardware_compatibility_level="same_compute_capability",
                   version_compatible=True, exclude_lean_runtime=True, avg_timing_iterations=1,
                   max_aux_streams=2, workspace_bytes=4096,
                   runtime_platform="windows_amd64").apply(*_checked(cfg))
    assert cfg.attrs == {
        "builder_optimization_level": 0,
        "tiling_optimization_level": "TilingOptimizationLevel.FULL",
        "hardware_compatibility_level": "HardwareCompatibilityLevel.SAME_COMPUTE_CAPABILITY",
        "avg_timing_iterations": 1, "max_aux_streams": 2,
        "runtime_platform": "RuntimePlatform.WINDOWS_AMD64"}
    assert cfg.flags == {"BuilderFlag.VERSION_COMPATIBLE", "BuilderFlag.EXCLUDE_LEAN_RUNTIME"}
    assert cfg.pools == {"MemoryPoolType.WORKSPACE": 4096}


@pytest.mark.parametrize("kwargs", [
    {"builder_optimization_level": 6}, {"builder_optimization_level": -1},
    {"tiling_optimization_level": "max"}, {"hardware_compatibility_level": "ampere+"},
    {"avg_timing_iterations": 0}, {"workspace_bytes": 0}, {"exclude_lean_runtime": True},
    {"fp16": True},
])
def test_builder_options_reject_bad_values(kwargs):
    with pytest.raises(pydantic.ValidationError):
        BuilderOptions(**kwargs)


def test_builder_options_are_frozen():
    with pytest.raises(pydantic.ValidationError):
        BuilderOptions().builder_optimization_level = 4  # type: ignore[misc]


def test_builder_option_facts():
    facts = BuilderOptions(version_compatible=True).facts()
    assert facts["version_compatible"] == "true"
    assert facts["workspace_bytes"] == ""
    assert "--versionCompatible" in facts["trtexec_args"]


# ------------------------------------------------------------------------ optimization profile

def test_profile_min_max_elementwise_opt_heaviest():
    shapes = [({"x": [1, 3, 224, 224], "ids": [1, 128]}, 1.0),
              ({"x": [8, 3, 160, 256], "ids": [8, 64]}, 5.0),
              ({"x": [4, 3, 320, 192], "ids": [4, 512]}, 2.0)]
    prof = optimization_profile(shapes)
    assert list(prof) == ["x", "ids"]
    assert prof["x"] == InputProfile(min=(1, 3, 160, 192), opt=(8, 3, 160, 256),
                                     max=(8, 3, 320, 256))
    assert prof["ids"] == InputProfile(min=(1, 64), opt=(8, 64), max=(8, 512))


def test_profile_tie_goes_to_first_and_single_entry_is_static():
    prof = optimization_profile([({"x": [2, 4]}, 1), ({"x": [6, 4]}, 1)])
    assert prof["x"].opt == (2, 4)
    one = optimization_profile([({"x": (1, 4)}, 3.0)])
    assert one["x"] == InputProfile((1, 4), (1, 4), (1, 4))


def test_profile_accepts_spec_shape_entries():
    entries = [SimpleNamespace(inputs={"x": [1, 8]}, weight=0.25),
               SimpleNamespace(inputs={"x": [4, 8]}, weight=0.75)]
    assert optimization_profile(entries)["x"] == InputProfile((1, 8), (4, 8), (4, 8))


@pytest.mark.parametrize("shapes, message", [
    ([], "empty"),
    ([({"x": [1]}, 1), ({"y": [1]}, 1)], "names inputs"),
    ([({"x": [1, 2]}, 1), ({"x": [1]}, 1)], "rank"),
    ([({"x": [-1, 2]}, 1)], "integers >= 0"),
    ([({"x": [1.5]}, 1)], "integers >= 0"),
    ([({"x": "12"}, 1)], "integers >= 0"),
    ([({"x": [1]}, -1)], "weight"),
    ([({"x": [1]}, float("nan"))], "weight"),
    ([({}, 1)], "names no inputs"),
    ([42], "not \\(\\{input: shape\\}, weight\\)"),
])
def test_profile_errors(shapes, message):
    with pytest.raises(InputError, match=message):
        optimization_profile(shapes)


# ------------------------------------------------------------------------------- build route

class RouteConfig:
    """A config whose build_route setter behaves like TensorRT's, with a chosen read-back."""

    def __init__(self, accept: bool, echo: str | None = None) -> None:
        self._accept, self._echo, self._route = accept, echo, ""

    @property
    def build_route(self) -> str:
        return self._echo if self._echo is not None else self._route

    @build_route.setter
    def build_route(self, value: str) -> None:
        if self._accept:  # a rejected route leaves the previous one (the bool is discarded)
            self._route = value


def test_build_route_read_back_accepts():
    cfg = RouteConfig(accept=True)
    set_build_route(cfg, Route.parse("-kgen:tiling=none -conv_use_long_w=off"))
    assert cfg.build_route == "-conv_use_long_w=off -kgen:tiling=none"


def test_build_route_read_back_ignores_token_order():
    route = Route.parse("-a=1 -b=2")
    set_build_route(RouteConfig(accept=True, echo="-b=2  -a=1"), route)


def test_build_route_rejected_silently_is_a_build_error():
    with pytest.raises(BuildError, match="did not accept build route '-a=1'.*read back ''"):
        set_build_route(RouteConfig(accept=False), Route.parse("-a=1"))


def test_build_route_logged_error_is_a_build_error():
    errors: list[str] = ["old error"]

    class Logging(RouteConfig):
        @RouteConfig.build_route.setter  # type: ignore[attr-defined]
        def build_route(self, value: str) -> None:
            self._route = value
            errors.append("unknown knob -a")

    with pytest.raises(BuildError, match="TensorRT logged: unknown knob -a"):
        set_build_route(Logging(accept=True), Route.parse("-a=1"), errors)
    set_build_route(RouteConfig(accept=True), Route.parse("-a=1"), ["old error"])


# --------------------------------------------------------------------- backend without TensorRT

def test_backend_identity():
    backend = TensorRTBackend()
    assert backend.name == "tensorrt"
    assert backend.engine_suffix == ".plan"
    assert "pip install tensorrt" in backend.requirement
    assert "cuda-python" in backend.requirement
    assert "11.1" in backend.requirement


def test_engine_facts_follow_builder_options(db):
    assert TensorRTBackend().engine_facts(Route.of({}), db) == {
        "version_compatible": False, "hardware_compatible": False}
    opts = BuilderOptions(version_compatible=True, hardware_compatibility_level="ampere_plus")
    assert TensorRTBackend(opts).engine_facts(Route.of({}), db) == {
        "version_compatible": True, "hardware_compatible": True}


@pytest.mark.skipif(HAVE_TRT, reason="TensorRT is installed here")
def test_unavailable_without_tensorrt():
    backend = TensorRTBackend()
    assert backend.available() is False
    with pytest.raises(BackendUnavailableError) as info:
        backend.require()
    assert "pip install tensorrt" in str(info.value)
    assert "cuda-python" in str(info.value)
    assert info.value.exit_code is ExitCode.BACKEND_UNAVAILABLE
    for call in (backend.knob_database,
                 lambda: backend.build(Path("m.onnx"), Route.of({}), Path("e.plan")),
                 lambda: backend.load(Path("e.plan"), Route.of({}))):
        with pytest.raises(BackendUnavailableError):
            call()


def test_module_does_not_import_tensorrt():
    import sys

    assert "tensorrt" not in sys.modules or HAVE_TRT


def _onnx_model(path: Path, batch: int | str = "N") -> Path:
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [batch, 4])
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [batch, 4])
    graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8),
              str(path))
    return path


def test_signature_reads_onnx_without_tensorrt(tmp_path):
    sig = TensorRTBackend().signature(_onnx_model(tmp_path / "m.onnx"))
    assert [(t.name, t.dtype, t.shape) for t in sig.inputs] == [("x", "float32", ("N", 4))]
    assert [t.name for t in sig.outputs] == ["y"]
    assert sig == onnx_signature(tmp_path / "m.onnx")


def test_signature_errors_are_model_errors(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    for path in (bad, tmp_path / "absent.onnx"):
        with pytest.raises(DossierError):
            TensorRTBackend().signature(path)


# ------------------------------------------------------------------------ with TensorRT (skipped)

@needs_trt
def test_live_knob_database_parses():
    db = TensorRTBackend().knob_database()
    assert db.backend == "tensorrt" and db.knobs


@needs_trt
def test_build_and_run_default_route(tmp_path):
    backend = TensorRTBackend(shapes=[({"x": [1, 4]}, 1.0), ({"x": [8, 4]}, 3.0)])
    engine = tmp_path / "relu.plan"
    info = backend.build(_onnx_model(tmp_path / "m.onnx"), Route.of({}), engine)
    assert parse_plan_header(engine.read_bytes()).tag == 0x74727466
    assert info.facts["version_compatible"] == "false"
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4)
    with backend.load(engine, Route.of({})) as runner:
        np.testing.assert_array_equal(runner.run({"x": x})["y"], np.maximum(x, 0))
        assert runner.timed(runner.prepare({"x": x})) > 0


@needs_trt
def test_unknown_route_knob_fails_the_build(tmp_path):
    with pytest.raises(BuildError):
        TensorRTBackend().build(_onnx_model(tmp_path / "m.onnx", batch=2),
                                Route.of({"no_such_knob_anywhere": "1"}), tmp_path / "e.plan")


# ------------------------------------------------------------------------------- glue (fakes)
# A stand-in `tensorrt` module and cuda-python runtime that record the calls they get. They check
# the sequence and arguments of this backend's calls against the documented 11.x API; they say
# nothing about what TensorRT would do, and no result below stands for a TensorRT result.

class _Severity:
    INTERNAL_ERROR, ERROR, WARNING, INFO = "internal_error", "error", "warning", "info"


class _FakeILogger:
    Severity = _Severity

    def __init__(self) -> None:
        pass


class _FakeTensor:
    def __init__(self, name: str, shape: tuple[int, ...]) -> None:
        self.name, self.shape = name, shape


class _FakeNetwork:
    def __init__(self, inputs: list[_FakeTensor]) -> None:
        self._inputs = inputs
        self.num_inputs = len(inputs)

    def get_input(self, i: int) -> _FakeTensor:
        return self._inputs[i]


class _FakeBuildConfig(FakeConfig):
    """An IBuilderConfig whose build_route setter drops routes naming knobs outside ``known``
    (a subset of what its all_build_routes lists, so the read-back check is exercised)."""

    def __init__(self, known: set[str], logger: _FakeILogger) -> None:
        super().__init__()
        self.attrs["_known"], self.attrs["_logger"] = known, logger
        self.attrs["build_route"] = ""
        self.attrs["profiles"] = []

    def __getattr__(self, name: str) -> object:
        return self.attrs[name]

    def __setattr__(self, name: str, value: object) -> None:
        if name == "build_route":
            knobs = {t[1:].split("=")[0] for t in str(value).split()}
            if knobs - self.attrs["_known"]:
                self.attrs["_logger"].log(_Severity.ERROR, f"unknown knob(s) {sorted(knobs)}")
                return
        super().__setattr__(name, value)

    def add_optimization_profile(self, profile: object) -> int:
        self.attrs["profiles"].append(profile)
        return len(self.attrs["profiles"]) - 1


class _FakeProfile:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple] = {}

    def set_shape(self, name: str, lo: tuple, opt: tuple, hi: tuple) -> None:
        self.shapes[name] = (lo, opt, hi)


class FakeTRT:
    """The parts of the `tensorrt` module this backend uses."""

    __version__ = "11.4.0.106"
    ILogger = _FakeILogger
    TilingOptimizationLevel = FakeEnum("TilingOptimizationLevel")
    HardwareCompatibilityLevel = FakeEnum("HardwareCompatibilityLevel")
    BuilderFlag = FakeEnum("BuilderFlag")
    MemoryPoolType = FakeEnum("MemoryPoolType")
    RuntimePlatform = FakeEnum("RuntimePlatform")
    TensorIOMode = SimpleNamespace(INPUT="input", OUTPUT="output")

    def __init__(self, inputs: list[_FakeTensor], *, parse_ok: bool = True,
                 plan: bytes | None = b"", engine_ok: bool = True, knobs: str = KNOB_JSON) -> None:
        self.inputs, self.parse_ok, self.engine_ok, self.knobs = inputs, parse_ok, engine_ok, knobs
        self.plan = _plan() if plan == b"" else plan
        self.configs: list[_FakeBuildConfig] = []
        self.builds = 0
        self.deserialized: list[bytes] = []
        self.host_code: list[bool] = []  # engine_host_code_allowed at each deserialization
        fake = self

        class Builder:
            def __init__(self, logger: _FakeILogger) -> None:
                self.logger = logger

            def create_network(self, flags: int) -> _FakeNetwork:
                assert flags == 0  # strongly typed is the only mode in 11.x
                return _FakeNetwork(fake.inputs)

            def create_builder_config(self) -> _FakeBuildConfig:
                fake.configs.append(_FakeBuildConfig({"kgen:tiling"}, self.logger))
                fake.configs[-1].attrs["all_build_routes"] = fake.knobs
                return fake.configs[-1]

            def create_optimization_profile(self) -> _FakeProfile:
                return _FakeProfile()

            def build_serialized_network(self, network: object, config: object) -> object:
                fake.builds += 1
                if fake.plan is None:
                    self.logger.log(_Severity.ERROR, "no implementation for node Relu")
                    return None
                return memoryview(fake.plan)  # IHostMemory supports the buffer protocol

        class OnnxParser:
            def __init__(self, network: object, logger: object) -> None:
                self.num_errors = 0 if fake.parse_ok else 1

            def parse_from_file(self, path: str) -> bool:
                return fake.parse_ok

            def get_error(self, i: int) -> str:
                return "node 0 (Relu): unsupported"

        class Runtime:
            def __init__(self, logger: _FakeILogger) -> None:
                self.logger = logger
                self.engine_host_code_allowed = False

            def deserialize_cuda_engine(self, data: bytes) -> object:
                fake.deserialized.append(data)
                fake.host_code.append(self.engine_host_code_allowed)
                if not fake.engine_ok:
                    self.logger.log(_Severity.ERROR, "Version tag does not match")
                    return None
                return _FakeEngine()

        self.Builder, self.OnnxParser, self.Runtime = Builder, OnnxParser, Runtime

    @staticmethod
    def nptype(dtype: str) -> type:
        return {"float": np.float32}[dtype]


class _FakeDevice:
    """cuda-python's runtime over host memory: pointers index byte arrays."""

    cudaError_t = SimpleNamespace(cudaSuccess=0)
    cudaMemcpyKind = SimpleNamespace(cudaMemcpyHostToDevice="h2d", cudaMemcpyDeviceToHost="d2h")

    def __init__(self) -> None:
        self.mem: dict[int, bytearray] = {}
        self.calls: list[str] = []
        self._next = 0x1000

    def cudaMalloc(self, n: int) -> tuple[int, int]:
        self._next += 0x1000
        self.mem[self._next] = bytearray(n)
        return 0, self._next

    def cudaFree(self, ptr: int) -> tuple[int]:
        del self.mem[ptr]
        return (0,)

    def cudaMemcpy(self, dst: int, src: int, n: int, kind: str) -> tuple[int]:
        import ctypes

        self.calls.append(kind)
        if kind == "h2d":
            self.mem[dst][:n] = ctypes.string_at(src, n)
        else:
            ctypes.memmove(dst, bytes(self.mem[src][:n]), n)
        return (0,)

    def cudaStreamCreate(self) -> tuple[int, int]:
        return 0, 7

    def cudaEventCreate(self) -> tuple[int, str]:
        self._next += 1
        return 0, f"event{self._next}"

    def cudaEventRecord(self, event: str, stream: int) -> tuple[int]:
        self.calls.append(f"record {event} on {stream}")
        return (0,)

    def cudaEventSynchronize(self, event: str) -> tuple[int]:
        self.calls.append(f"sync {event}")
        return (0,)

    def cudaEventElapsedTime(self, a: str, b: str) -> tuple[int, float]:
        return 0, 0.25

    def cudaStreamSynchronize(self, stream: int) -> tuple[int]:
        self.calls.append("stream sync")
        return (0,)

    def cudaEventDestroy(self, event: str) -> tuple[int]:
        return (0,)

    def cudaStreamDestroy(self, stream: int) -> tuple[int]:
        return (0,)


DEVICE = _FakeDevice()


class _FakeContext:
    """Computes y = relu(x) on the fake device when executed."""

    def __init__(self) -> None:
        self.shapes: dict[str, tuple] = {}
        self.addresses: dict[str, int] = {}

    def set_input_shape(self, name: str, shape: tuple) -> bool:
        self.shapes[name] = tuple(shape)
        return len(shape) == 2 and shape[1] == 4 and 1 <= shape[0] <= 8

    def get_tensor_shape(self, name: str) -> tuple:
        return self.shapes["x"]

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        self.addresses[name] = ptr
        return True

    def execute_async_v3(self, stream: int) -> bool:
        DEVICE.calls.append(f"execute on {stream}")
        x = np.frombuffer(bytes(DEVICE.mem[self.addresses["x"]]), dtype=np.float32)
        DEVICE.mem[self.addresses["y"]][:] = np.maximum(x, 0).tobytes()
        return True


class _FakeEngine:
    num_io_tensors = 2

    def get_tensor_name(self, i: int) -> str:
        return ["x", "y"][i]

    def get_tensor_mode(self, name: str) -> str:
        return "input" if name == "x" else "output"

    def get_tensor_dtype(self, name: str) -> str:
        return "float"

    def create_execution_context(self) -> _FakeContext:
        return _FakeContext()


FAKE_KINDS: dict[type, str] = {
    _FakeBuildConfig: "IBuilderConfig", _FakeNetwork: "INetworkDefinition",
    _FakeTensor: "ITensor", _FakeProfile: "IOptimizationProfile", _FakeEngine: "ICudaEngine",
    _FakeContext: "IExecutionContext"}
"""The TensorRT class each fake object stands for."""


@pytest.fixture
def fake_backend(monkeypatch):  # type: ignore[no-untyped-def]
    """A TensorRTBackend wired to the fakes, seen through :class:`Checked`: every TensorRT name
    the backend uses must exist in the real bindings of every listed version."""
    from dossier.backends.tensorrt import backend as module
    from dossier.backends.tensorrt import runner

    monkeypatch.setattr(runner, "cudart", lambda: DEVICE)

    def make(fake: FakeTRT, **kwargs: object) -> TensorRTBackend:
        backend = TensorRTBackend(**kwargs)  # type: ignore[arg-type]
        checked = Checked(fake, None, API, FAKE_KINDS)

        def trt() -> object:
            if backend._logger is None:
                backend._logger = module._make_logger(checked)
            return checked

        monkeypatch.setattr(backend, "_trt", trt)
        monkeypatch.setattr(backend, "require", lambda: None)  # the fakes stand in for TensorRT
        return backend

    return make


def test_glue_knob_database(fake_backend):
    db = fake_backend(FakeTRT([])).knob_database()
    assert db.names()[0] == "conv_use_long_w"


def test_glue_build_sets_options_route_profile_and_writes_plan(fake_backend, tmp_path):
    fake = FakeTRT([_FakeTensor("x", (-1, 4))])
    opts = BuilderOptions(version_compatible=True, builder_optimization_level=5)
    backend = fake_backend(fake, options=opts, shapes=[({"x": [1, 4]}, 1), ({"x": [8, 4]}, 3)])
    engine = tmp_path / "e.plan"
    info = backend.build(tmp_path / "m.onnx", Route.parse("-kgen:tiling=none"), engine)
    cfg = fake.configs[-1].attrs
    assert cfg["build_route"] == "-kgen:tiling=none"
    assert cfg["builder_optimization_level"] == 5 and cfg["avg_timing_iterations"] == 8
    assert "BuilderFlag.VERSION_COMPATIBLE" in fake.configs[-1].flags
    assert cfg["profiles"][0].shapes == {"x": ((1, 4), (8, 4), (8, 4))}
    assert engine.read_bytes() == fake.plan
    assert info.facts["plan_trt_version"] == "11.1.0.106"
    assert info.facts["version_compatible"] == "true"
    assert info.facts["hardware_compatibility_level"] == "none"
    assert info.facts["build_route"] == "-kgen:tiling=none"
    assert json.loads(info.facts["optimization_profile"]) == {"x": [[1, 4], [8, 4], [8, 4]]}


def test_glue_build_failures(fake_backend, tmp_path):
    model, engine = tmp_path / "m.onnx", tmp_path / "e.plan"
    static = [_FakeTensor("x", (2, 4))]
    with pytest.raises(BuildError, match="did not accept build route.*unknown knob"):
        fake_backend(FakeTRT(static)).build(model, Route.parse("-conv_use_long_w=off"), engine)
    with pytest.raises(BuildError, match="ONNX parser rejected m.onnx: node 0"):
        fake_backend(FakeTRT(static, parse_ok=False)).build(model, Route.of({}), engine)
    with pytest.raises(BuildError, match="could not build route.*no implementation"):
        fake_backend(FakeTRT(static, plan=None)).build(model, Route.of({}), engine)
    with pytest.raises(BuildError, match="dynamic dimensions and no shape distribution"):
        fake_backend(FakeTRT([_FakeTensor("x", (-1, 4))])).build(model, Route.of({}), engine)
    with pytest.raises(BuildError, match="unknown: \\['z'\\]"):
        fake_backend(FakeTRT(static), shapes=[({"z": [1]}, 1)]).build(model, Route.of({}), engine)
    assert not engine.exists()


def test_glue_build_with_unknown_plan_layout_still_succeeds(fake_backend, tmp_path):
    fake = FakeTRT([_FakeTensor("x", (2, 4))], plan=_plan(version=9))
    info = fake_backend(fake).build(tmp_path / "m.onnx", Route.of({}), tmp_path / "e.plan")
    assert "serialization version 9" in info.facts["plan_header_error"]


def test_glue_load_run_and_event_timing(fake_backend, tmp_path):
    engine = tmp_path / "e.plan"
    engine.write_bytes(_plan())
    fake = FakeTRT([])
    runner = fake_backend(fake, options=BuilderOptions(version_compatible=True)).load(
        engine, Route.of({}))
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(runner.run({"x": x})["y"], np.maximum(x, 0))
    DEVICE.calls.clear()
    prepared = runner.prepare({"x": x})
    assert DEVICE.calls == ["h2d"]  # inputs are copied once, at prepare
    DEVICE.calls.clear()
    assert runner.timed(prepared) == 0.25
    assert runner.timed(prepared) == 0.25
    start, end = runner._start, runner._end  # type: ignore[attr-defined]
    one = [f"record {start} on 7", "execute on 7", f"record {end} on 7", f"sync {end}"]
    assert DEVICE.calls == one + one  # no copies while timing; events bracket the enqueue
    with pytest.raises(EngineRuntimeError, match="float64"):
        runner.run({"x": x.astype(np.float64)})
    with pytest.raises(EngineRuntimeError, match="outside the engine's optimization profile"):
        runner.run({"x": np.zeros((9, 4), np.float32)})
    runner.close()
    assert DEVICE.mem == {}  # every device buffer is freed


def test_glue_load_failures(fake_backend, tmp_path):
    engine = tmp_path / "e.plan"
    engine.write_bytes(_plan(trt=(11, 1, 0, 106)))
    with pytest.raises(EngineRuntimeError, match="TensorRT 11.4.0.106 could not deserialize e.plan "
                       "\\(the plan was built by TensorRT 11.1.0.106\\): Version tag"):
        fake_backend(FakeTRT([], engine_ok=False)).load(engine, Route.of({}))
    with pytest.raises(EngineRuntimeError, match="cannot read engine"):
        fake_backend(FakeTRT([])).load(tmp_path / "absent.plan", Route.of({}))
    cross = BuilderOptions(runtime_platform="windows_amd64")
    with pytest.raises(EngineRuntimeError, match="windows_amd64"):
        fake_backend(FakeTRT([]), options=cross).load(engine, Route.of({}))


def test_production_load_records_what_the_load_needs(db):
    """The manifest's load entry says what deserializing the plan takes: host code allowed for
    a version-compatible engine, the runtime platform of a cross-built one."""
    plain = TensorRTBackend().production_load(Route.of({}), db)
    assert plain.options == {} and "engine_host_code_allowed" not in plain.snippet
    vc = TensorRTBackend(BuilderOptions(version_compatible=True)).production_load(
        Route.of({}), db)
    assert vc.options == {"engine_host_code_allowed": "True"}
    assert "runtime.engine_host_code_allowed = True" in vc.snippet
    cross = TensorRTBackend(BuilderOptions(runtime_platform="windows_amd64")).production_load(
        Route.of({}), db)
    assert cross.options == {"runtime_platform": "windows_amd64"}
    assert "loads only there" in cross.note


def test_glue_a_shipped_plan_loads_as_its_manifest_entry_records(fake_backend, tmp_path, db):
    """``load_shipped`` takes host code and runtime platform from the recorded entry, not from
    the instance's builder options (left at their defaults here: nothing configured it)."""
    engine = tmp_path / "e.plan"
    engine.write_bytes(_plan())
    recorded = TensorRTBackend(BuilderOptions(version_compatible=True)).production_load(
        Route.of({}), db)
    fake = FakeTRT([])
    backend = fake_backend(fake)
    assert backend.options == BuilderOptions()
    backend.load_shipped(engine, Route.of({}), recorded, {}).close()
    backend.load_shipped(engine, Route.of({}), LoadConfig(call="c"), {}).close()
    # a load recorded with default options (a trial recorded before runs recorded loads): the
    # engine's build facts still say it is version compatible
    backend.load_shipped(engine, Route.of({}), LoadConfig(call="c"),
                         {"version_compatible": "true"}).close()
    assert fake.host_code == [True, False, True]
    cross = LoadConfig(call="c", options={"runtime_platform": "windows_amd64"})
    for load, facts in ((cross, {}), (LoadConfig(call="c"), {"runtime_platform": "windows_amd64"})):
        with pytest.raises(EngineRuntimeError, match="runtime platform windows_amd64"):
            backend.load_shipped(engine, Route.of({}), load, facts)
    with pytest.raises(EngineRuntimeError, match="cannot read engine"):
        backend.load_shipped(tmp_path / "absent.plan", Route.of({}), recorded, {})
    assert len(fake.deserialized) == 3
    # no recorded load (a bundle older than format 1.1): the options the caller configured
    configured = fake_backend(fake, options=BuilderOptions(version_compatible=True))
    configured.load_shipped(engine, Route.of({}), None, {}).close()
    fake_backend(fake).load_shipped(engine, Route.of({}), None,
                                    {"version_compatible": "true"}).close()
    assert fake.host_code[3:] == [True, False]


# ------------------------------------------------------- what the real docstrings promise (glue)

@pytest.mark.parametrize("call", ["knob_database", "build"])
def test_glue_empty_all_build_routes_is_a_one_line_refusal(fake_backend, tmp_path, call):
    """An empty all_build_routes means the tuner is disabled (TensorRT-RTX, Windows, a build
    without it): refused in one line naming that cause, and nothing is built."""
    fake = FakeTRT([_FakeTensor("x", (2, 4))], knobs="")
    backend = fake_backend(fake)
    with pytest.raises(BackendUnavailableError) as info:
        if call == "knob_database":
            backend.knob_database()
        else:
            backend.build(tmp_path / "m.onnx", Route.of({}), tmp_path / "e.plan")
    message = str(info.value)
    assert "\n" not in message
    assert "all_build_routes is empty" in message
    assert all(cause in message for cause in ("TensorRT-RTX", "Windows", "without the tuner"))
    assert info.value.exit_code is ExitCode.BACKEND_UNAVAILABLE
    assert fake.builds == 0 and not (tmp_path / "e.plan").exists()


@pytest.mark.parametrize("route, message", [
    ("-no_such_knob=1", "knob -no_such_knob is not in IBuilderConfig.all_build_routes "
                        "\\(tuner 2.19.15, 5 knobs\\)"),
    ("-kgen:tiling=bogus", "value 'bogus' of -kgen:tiling is not in IBuilderConfig."
                           "all_build_routes \\(-kgen:tiling=\\[none\\|auto\\|aggressive\\]\\)"),
])
def test_glue_route_outside_all_build_routes_is_refused_before_building(
        fake_backend, tmp_path, monkeypatch, route, message):
    monkeypatch.delenv("TRT_INTERNAL_OPTIONS", raising=False)
    fake = FakeTRT([_FakeTensor("x", (2, 4))])
    with pytest.raises(BuildError, match=message + ".*refused before building") as info:
        fake_backend(fake).build(tmp_path / "m.onnx", Route.parse(route), tmp_path / "e.plan")
    assert "TRT_INTERNAL_OPTIONS" not in str(info.value)
    assert fake.builds == 0  # TensorRT was never asked to build
    assert fake.configs[-1].attrs["build_route"] == ""  # nor was the route set


def test_glue_refusal_says_the_whitelist_bypass_is_not_followed(fake_backend, tmp_path,
                                                                monkeypatch):
    monkeypatch.setenv("TRT_INTERNAL_OPTIONS", "bypass_build_route_whitelist=1")
    with pytest.raises(BuildError, match="TRT_INTERNAL_OPTIONS is set, and dossier does not "
                       "follow its whitelist bypass"):
        fake_backend(FakeTRT([_FakeTensor("x", (2, 4))])).build(
            tmp_path / "m.onnx", Route.parse("-no_such_knob=1"), tmp_path / "e.plan")


@pytest.mark.parametrize("value", [None, "", "bypass_build_route_whitelist=1"])
def test_glue_engine_facts_record_trt_internal_options(fake_backend, tmp_path, monkeypatch,
                                                       value):
    if value is None:
        monkeypatch.delenv("TRT_INTERNAL_OPTIONS", raising=False)
    else:
        monkeypatch.setenv("TRT_INTERNAL_OPTIONS", value)
    info = fake_backend(FakeTRT([_FakeTensor("x", (2, 4))])).build(
        tmp_path / "m.onnx", Route.parse("-kgen:tiling=none"), tmp_path / "e.plan")
    assert info.facts["trt_internal_options_set"] == ("false" if value is None else "true")
    assert info.facts["trt_internal_options"] == (value or "")


@pytest.mark.parametrize("value", [None, "bypass_build_route_whitelist=1"])
def test_fingerprint_records_trt_internal_options(monkeypatch, value):
    from dossier.fingerprint import collect, flatten

    if value is None:
        monkeypatch.delenv("TRT_INTERNAL_OPTIONS", raising=False)
    else:
        monkeypatch.setenv("TRT_INTERNAL_OPTIONS", value)
    fp = collect(include_gpu=False)
    assert fp.trt_internal_options == value
    assert flatten(fp)["trt_internal_options"] == value


# --------------------------------------------------- the fakes against the real bindings

def test_glue_reaches_the_core_tensorrt_names_through_the_check(fake_backend, tmp_path):
    """The backend's code paths run through :class:`Checked`, so these names were each found in
    every listed TensorRT version (a name missing from one fails where it is used)."""
    engine = tmp_path / "e.plan"
    fake = FakeTRT([_FakeTensor("x", (-1, 4))])
    backend = fake_backend(fake, options=BuilderOptions(version_compatible=True,
                                                        workspace_bytes=1 << 20),
                           shapes=[({"x": [1, 4]}, 1), ({"x": [8, 4]}, 3)])
    backend.knob_database()
    backend.build(tmp_path / "m.onnx", Route.parse("-kgen:tiling=none"), engine)
    with backend.load(engine, Route.of({})) as runner:
        x = np.ones((2, 4), np.float32)
        runner.timed(runner.prepare({"x": x}))
    assert {("IBuilderConfig", "all_build_routes"), ("IBuilderConfig", "build_route"),
            ("Builder", "build_serialized_network"), ("OnnxParser", "parse_from_file"),
            ("Runtime", "deserialize_cuda_engine"), ("IExecutionContext", "execute_async_v3"),
            ("IBuilderConfig", "set_memory_pool_limit"), ("MemoryPoolType", "WORKSPACE"),
            ("ILogger.Severity", "ERROR"), ("tensorrt", "nptype")} <= API.seen


_TEST_STATE = {"inputs", "parse_ok", "engine_ok", "knobs", "plan", "configs", "deserialized",
               "host_code", "builds", "logger", "flags", "pools", "attrs", "shapes", "addresses"}
"""Attributes the fakes keep for the tests themselves, not parts of the TensorRT API."""


def _fake_api(obj: object) -> set[str]:
    names = {n for n in dir(obj) if not n.startswith("_")}
    return names - _TEST_STATE


def test_fakes_define_only_real_tensorrt_names():
    """A fake can no longer invent an API: each public name on a fake is a member of the
    TensorRT class it stands for, in every listed version."""
    fake = FakeTRT([_FakeTensor("x", (2, 4))])
    logger = _FakeILogger()
    builder = fake.Builder(logger)
    objects = [(fake, None), (builder, "Builder"),
               (fake.OnnxParser(None, logger), "OnnxParser"), (fake.Runtime(logger), "Runtime"),
               (builder.create_builder_config(), "IBuilderConfig"),
               (builder.create_network(0), "INetworkDefinition"),
               (_FakeTensor("x", (1,)), "ITensor"),
               (builder.create_optimization_profile(), "IOptimizationProfile"),
               (_FakeEngine(), "ICudaEngine"), (_FakeContext(), "IExecutionContext"),
               (logger, "ILogger"), (_Severity, "ILogger.Severity"),
               (FakeTRT.TensorIOMode, "TensorIOMode")]
    checked = 0
    for obj, owner in objects:
        for name in sorted(_fake_api(obj)):
            API.kind(owner, name)
            checked += 1
    config = builder.create_builder_config()  # the properties it holds as attributes
    for name in sorted(set(config.attrs) - {"_known", "_logger", "profiles"}):
        API.kind("IBuilderConfig", name)
        checked += 1
    assert checked > 30
