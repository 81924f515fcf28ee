"""The TensorRT backend against the real TensorRT Python bindings (not only against our fakes).

The listings under tests/assets/tensorrt-api were read by bench/tensorrt_api.py from the
``tensorrt.so`` of the real ``tensorrt-cu13-bindings`` wheels, without loading it. Here every
TensorRT name in the backend's source (``trt.X.Y`` chains, methods of classes deriving from a
TensorRT class, the enum members named through lookup tables) must exist in each listed version.
The names the backend reaches at run time are checked too, in tests/backends/test_tensorrt_backend.py,
where the fakes are seen through :class:`_trt_api.Checked`.
"""

from __future__ import annotations

import ast
import inspect
import json
import typing
from pathlib import Path

import pytest
from _trt_api import ASSETS, Api, Checked, Listing, listings

import dossier.backends.tensorrt.backend as backend_module
from dossier.backends.tensorrt import BINDINGS_CHECKED, MIN_VERSION, BuilderOptions

API = Api()


def test_listings_are_the_claimed_versions():
    found = [v.version for v in listings()]
    assert found == list(BINDINGS_CHECKED)
    oldest = tuple(int(p) for p in found[0].split(".")[:2])
    assert oldest == MIN_VERSION  # the first release with build routes is checked


@pytest.mark.parametrize("version", BINDINGS_CHECKED)
def test_listing_records_its_wheel_and_a_sound_extraction(version):
    data = json.loads((ASSETS / f"{version}.json").read_text())
    assert data["wheel"].startswith(f"tensorrt_cu13_bindings-{version}-")
    assert len(data["wheel_sha256"]) == 64 and len(data["tensorrt_so_sha256"]) == 64
    check = data["ivar_check"]
    # the binding's own docstrings name properties per class (":ivar NAME:"); the extraction
    # placed most of them on the documented class (the rest are listed in the file)
    assert check["found_on_class"] / check["documented_ivars"] > 0.85
    listing = Listing.load(ASSETS / f"{version}.json")
    assert listing.kind("IBuilderConfig", "build_route") == "property"
    assert listing.kind("IBuilderConfig", "all_build_routes") == "property"
    assert listing.kind("Builder", "build_serialized_network") == "method"
    assert listing.returns["Builder.create_builder_config"] == "IBuilderConfig"


def _trt_chains(tree: ast.AST) -> set[tuple[str, ...]]:
    """Every ``trt.A.B...`` attribute chain and its prefixes (``trt`` is the module handle)."""
    chains: set[tuple[str, ...]] = set()
    for node in ast.walk(tree):
        parts: list[str] = []
        cur = node
        while isinstance(cur, ast.Attribute):
            parts.append(cur.attr)
            cur = cur.value
        if isinstance(cur, ast.Name) and cur.id == "trt" and parts:
            chains.add(tuple(reversed(parts)))
    return chains


def _check_chain(chain: tuple[str, ...]) -> None:
    owner: str | None = None
    for name in chain:
        kind = API.kind(owner, name)
        owner = name if owner is None else f"{owner}.{name}"
        if kind not in ("class", "enum"):
            break


def _package_tree() -> ast.Module:
    """Every module of the TensorRT backend's package, as one tree."""
    folder = Path(backend_module.__file__).parent
    return ast.Module(body=[node for path in sorted(folder.glob("*.py"))
                            for node in ast.parse(path.read_text()).body], type_ignores=[])


def test_every_trt_attribute_chain_in_the_backend_exists():
    tree = _package_tree()
    chains = _trt_chains(tree)
    assert {("BuilderFlag", "VERSION_COMPATIBLE"), ("MemoryPoolType", "WORKSPACE"),
            ("ILogger", "Severity", "ERROR"), ("Builder",), ("OnnxParser",),
            ("Runtime",)} <= chains  # the scan sees the backend's names
    for chain in sorted(chains):
        _check_chain(chain)


def test_methods_overriding_a_tensorrt_class_exist_there():
    tree = _package_tree()
    overrides = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) \
                        and base.value.id == "trt":
                    overrides += [(base.attr, f.name) for f in node.body
                                  if isinstance(f, ast.FunctionDef)]
    assert ("ILogger", "log") in overrides
    for owner, name in overrides:
        API.kind(owner, name)


def _literal_values(field: str) -> tuple[str, ...]:
    return typing.get_args(BuilderOptions.model_fields[field].annotation)


class _Config:
    """Accepts whatever the checked wrapper lets through."""

    def set_flag(self, flag: object) -> None: ...
    def clear_flag(self, flag: object) -> None: ...
    def set_memory_pool_limit(self, pool: object, size: int) -> None: ...


class _Module:
    """Enum stand-ins: ``Enum.MEMBER`` gives the text."""

    def __getattr__(self, name: str) -> object:
        return type(name, (), {"__getattr__": lambda self, m, n=name: f"{n}.{m}"})()


@pytest.mark.parametrize("field, enum", [
    ("tiling_optimization_level", "TilingOptimizationLevel"),
    ("hardware_compatibility_level", "HardwareCompatibilityLevel"),
    ("runtime_platform", "RuntimePlatform")])
def test_every_builder_option_value_is_a_real_enum_member(field, enum):
    """The option tables name enum members by string; each value must reach its own real
    member (and every flag and pool the options set is real)."""
    api = Api()
    for value in _literal_values(field):
        opts = BuilderOptions(**{field: value}, workspace_bytes=1, max_aux_streams=1,
                              version_compatible=True, exclude_lean_runtime=True)
        opts.apply(Checked(_Config(), "IBuilderConfig", api, {}),
                   Checked(_Module(), None, api, {}))
    members = {name for owner, name in api.seen if owner == enum}
    assert len(members) == len(_literal_values(field)) >= 2
    assert {("BuilderFlag", "VERSION_COMPATIBLE"), ("BuilderFlag", "EXCLUDE_LEAN_RUNTIME"),
            ("MemoryPoolType", "WORKSPACE")} <= api.seen


def test_checked_refuses_an_invented_name():
    config = Checked(_Config(), "IBuilderConfig", API, {})
    with pytest.raises(AssertionError, match="IBuilderConfig.set_route is not in the TensorRT "
                       "Python bindings 11.1.0.106, 11.4.0.106"):
        config.set_route("-a=1")  # type: ignore[attr-defined]
    with pytest.raises(AssertionError, match="is a method, not a settable property"):
        config.set_flag = 1  # type: ignore[method-assign]


def test_a_name_missing_from_one_version_is_named():
    # IOptimizationProfile.profile_stream appeared after 11.1: using it would break 11.1
    with pytest.raises(AssertionError, match="IOptimizationProfile.profile_stream is not in the "
                       "TensorRT Python bindings 11.1.0.106$"):
        API.kind("IOptimizationProfile", "profile_stream")


def test_listing_from_disk_is_validated(tmp_path):
    good = json.loads((ASSETS / f"{BINDINGS_CHECKED[0]}.json").read_text())
    for broken in ({**good, "format": "other"}, {**good, "classes": {"X": {"a": "field"}}},
                   {**good, "enums": {"E": "A"}}, {**good, "module": "Builder"}, [1]):
        path = tmp_path / f"{BINDINGS_CHECKED[0]}.json"
        path.write_text(json.dumps(broken))
        with pytest.raises(ValueError):
            Listing.load(path)


def test_backend_module_names_the_checked_versions_in_its_doc():
    assert "BINDINGS_CHECKED" in inspect.getdoc(backend_module)


# ---------------------------------------------------------------- the generator's pure parts

def _generator():
    import importlib.util

    path = Path(__file__).parents[2] / "bench" / "tensorrt_api.py"
    spec = importlib.util.spec_from_file_location("tensorrt_api_generator", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_generator_reads_self_type_from_pybind11_template_arguments():
    gen = _generator()
    # as c++filt prints a pybind11 ``initialize<Func, Return, Args...>::types`` symbol
    name = ("pybind11::cpp_function::initialize<tensorrt::lambdas::get_build_route::{lambda("
            "nvinfer1::IBuilderConfig&)#1} const&, std::__cxx11::basic_string<char, "
            "std::char_traits<char>, std::allocator<char> >, nvinfer1::IBuilderConfig const&>"
            "(tensorrt::lambdas::get_build_route::{lambda(nvinfer1::IBuilderConfig&)#1} const&, "
            "std::__cxx11::basic_string<char> (*)(nvinfer1::IBuilderConfig))::types")
    args = gen.template_args(name, "pybind11::cpp_function::initialize")
    assert len(args) == 3
    assert gen.cpp_type(args[2]) == "nvinfer1::IBuilderConfig"
    assert args[1].startswith("std::__cxx11::basic_string<char")
    assert gen.template_args("no template here", "pybind11::cpp_function::initialize") == []


def test_generator_reads_module_names_of_the_wheel_init():
    gen = _generator()
    source = ('from .tensorrt import *\n__version__ = "11.4.0.106"\n_private = 1\n'
              "def nptype(t):\n    pass\nclass Helper:\n    pass\n")
    assert gen.python_names(source) == ["Helper", "__version__", "nptype"]


def test_generator_refuses_what_is_not_an_x86_64_elf():
    gen = _generator()
    with pytest.raises(SystemExit, match="not an x86-64 ELF64"):
        gen.Elf(b"PK\x03\x04" + b"\0" * 64)
