"""PyTorch AOTInductor backend: ``torch.export`` + ``aoti_compile_and_package`` into a ``.pt2``.

build = export the model (dynamic dimensions as the signature says) and compile it ahead of time
with the route's ``torch._inductor.config`` values into an AOTInductor package; the route text,
the torch version and the tensor names go into the package metadata. load =
``torch._inductor.aoti_load_package``. Each build runs with ``TORCHINDUCTOR_CACHE_DIR`` set to a
fresh temporary folder that is removed afterwards, so a build never reuses another's kernels
(set :data:`CACHE_ENV` to share one cache folder instead, e.g. in benchmarks that rebuild the
same routes; such builds are warm).

Models
------
``model.path`` is one of:

* an exported program: a file written by ``torch.export.save`` (``*.pt2`` or ``*.ep``). Its
  signature is the ``dossier/signature.json`` extra file when the file has one (see
  :func:`save_exported`), else it is read from the program: input names are the forward
  arguments, dynamic dimensions are named after their symbols, outputs are named by the keys of
  a dict output or ``output_0, output_1, ...`` (``output`` for a single tensor).
* a ``package.module:factory`` reference, importable from the current folder or ``PYTHONPATH``:
  ``factory()`` returns an ``nn.Module`` in eval mode. Its signature comes from the factory's
  ``signature`` attribute, or else from a ``signature`` attribute of the module, either a dict
  or a zero-argument callable returning one::

      def tiny_mlp() -> nn.Module: ...
      tiny_mlp.signature = {
          "inputs": {"x": ("float32", ("batch", 64))},
          "outputs": {"y": ("float32", ("batch", 16))},
      }

  Inputs are passed to ``forward`` positionally, in the dict's order. A dimension that is a
  string is dynamic, and dimensions with the same name are one dimension (``torch.export.Dim``
  with minimum 1); ``None`` is a dynamic dimension torch relates to the others itself
  (``Dim.DYNAMIC``). ``forward`` returns one tensor, a tuple or list in the outputs' order, or a
  dict (a ``ModelOutput`` too) keyed by output name. An optional ``example_inputs`` attribute
  of the factory (a zero-argument callable returning a tuple of tensors) replaces the random
  export inputs (floating inputs ``randn``, integer inputs zeros, dynamic dimensions 2).

  The tuner and the bundle writer identify a model by its file digest, so a ``module:factory``
  reference serves the Python API (:meth:`TorchInductorBackend.build`, ``signature``); a
  release spec names an exported program file.

Knobs
-----
``inductor:<key>`` sets ``torch._inductor.config.<key>`` (a curated list: :data:`INDUCTOR_KEYS`),
with defaults read from the installed torch; values are strings (``true``/``false`` for
booleans, ``default`` for None). ``device``, ``dtype`` (the model and its floating inputs are
cast inside the compiled module; floating outputs are cast back to the signature's dtype, so an
engine takes and returns what the model does) and ``float32_matmul_precision`` (applied while
building and around every run, since aten matmuls read it at run time) complete the route.
A route's ``inductor:<key>`` that is not in the database is passed to inductor as well, so a key
the installed torch lacks fails the build (``BuildError``) instead of being ignored.

Packages are not byte-reproducible (absolute temporary paths and file names derived from them
are embedded); :func:`normalized_digest` hashes a package with those removed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dossier import cxx_runtime, elf
from dossier.backends.interface import (
    Backend,
    BuildError,
    BuildInfo,
    EngineRuntimeError,
    LoadConfig,
    ModelSignature,
    Runner,
    TensorSpec,
)
from dossier.errors import ModelError
from dossier.hashing import digest_bytes, digest_json
from dossier.knobs import Knob, KnobDatabase, KnobPhase
from dossier.routes import Route

KNOB_PREFIX = "inductor:"
CACHE_ENV = "DOSSIER_TORCH_CACHE_DIR"
"""When set, every build uses this inductor cache folder (kept) instead of a fresh one."""
SIGNATURE_MEMBER = "dossier/signature.json"
"""Extra file of an exported program holding its signature (see :func:`save_exported`)."""
EXPORTED_SUFFIXES = (".pt2", ".ep")
TEMP_PREFIX = "dossier-inductor-"
DTYPES = ("float32", "bfloat16", "float16")
PRECISIONS = ("highest", "high", "medium")
META_PREFIX = "dossier."

_NUMERICS = True
INDUCTOR_KEYS: tuple[tuple[str, str, bool], ...] = (
    ("max_autotune", "benchmark GEMM/conv kernel choices while building (builds get much longer: "
     "238 s for ResNet-50 on an H200 against 14 s)", False),
    ("max_autotune_gemm_backends", "kernel families max_autotune chooses GEMMs from (only with "
     "-inductor:max_autotune=true)", False),
    ("epilogue_fusion", "fuse pointwise epilogues into GEMM templates", False),
    ("freezing", "treat weights as constants: constant folding, conv/BN folding, weight "
     "pre-packing and layout changes", False),
    ("layout_optimization", "pick channels-last layouts for convolutions", False),
    ("pattern_matcher", "pattern-based graph rewrites (e.g. attention into SDPA)", False),
    ("coordinate_descent_tuning", "tune Triton kernel block sizes by coordinate descent (longer "
     "builds)", False),
    ("triton.cudagraphs", "CUDA graphs in torch.compile's Python runtime; an AOTInductor package "
     "never captures CUDA graphs, so here it only changes graph partitioning", False),
    ("aggressive_fusion", "fuse nodes even without shared memory accesses", False),
    ("comprehensive_padding", "pad strides for aligned memory accesses", False),
    ("cpp.simdlen", "CPU vector width in bits (default: the widest this CPU has; 1 turns "
     "vectorisation off)", False),
    ("cpp.threads", "CPU threads of the generated kernels (-1: torch.get_num_threads())", False),
    ("cpp.enable_unsafe_math_opt_flag", "compile CPU kernels with -funsafe-math-optimizations",
     _NUMERICS),
    ("cpp.enable_floating_point_contract_flag", "-ffp-contract for CPU kernels (fused "
     "multiply-add contraction)", _NUMERICS),
    ("aot_inductor.precompile_headers", "precompiled headers for the C++ compile. dossier sets "
     "false unless the route says otherwise: with true, every new flag set leaves about 150 MB "
     "in the default torchinductor temp folder, whatever TORCHINDUCTOR_CACHE_DIR says", False),
)
"""(config key, help, changes numerics) of the inductor knobs offered, in display order."""
_OWN_DEFAULTS = {"aot_inductor.precompile_headers": False}
"""Keys whose default is dossier's, not torch's (the backend always sets them)."""


# ------------------------------------------------------------------------------ value mapping
def value_text(value: object) -> str:
    """A config value as a knob value string: ``true``/``false``, ``default`` for None."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "default"
    return str(value)


def parse_value(text: str, default: object) -> object:
    """A knob value string as the config value, typed after the key's default (``default`` ->
    None); for a key unknown here (``default`` is ...), guessed from the text."""
    if isinstance(default, bool) or (default is ... and text in ("true", "false")):
        if text not in ("true", "false"):
            raise BuildError(f"value {text!r} is not true or false")
        return text == "true"
    if text == "default":
        return None
    if isinstance(default, int) or default is None or default is ...:
        try:
            return int(text)
        except ValueError:
            if isinstance(default, int) or default is None:
                raise BuildError(f"value {text!r} is not an integer") from None
    return text


def _device_values(cuda: bool) -> tuple[str, ...]:
    return ("cuda", "cpu") if cuda else ("cpu",)


def _key_values(key: str, default: object, cuda: bool) -> tuple[str, ...]:
    d = value_text(default)
    if isinstance(default, bool):
        values: tuple[str, ...] = ("false", "true")
    elif key == "max_autotune_gemm_backends":
        values = ("ATEN", "ATEN,TRITON", "TRITON") if cuda else ("ATEN", "ATEN,CPP", "CPP")
    elif key == "cpp.simdlen":
        values = ("default", "1", "256", "512")
    elif key == "cpp.threads":
        n = os.cpu_count() or 1
        values = ("-1", *(str(t) for t in (1, 2, 4, 8, 16, 32, 64) if t < n), str(n))
    elif key == "cpp.enable_floating_point_contract_flag":
        values = ("off", "on", "fast")
    else:
        values = ()
    return (d, *(v for v in dict.fromkeys(values) if v != d))


# ------------------------------------------------------------------------------ signatures
def signature_from_dict(data: Mapping[str, Any], where: str) -> ModelSignature:
    """A :class:`ModelSignature` from the ``{"inputs": {...}, "outputs": {...}}`` convention."""

    def specs(kind: str) -> tuple[TensorSpec, ...]:
        table = data.get(kind)
        if not isinstance(table, Mapping) or not table:
            raise ModelError(f"{where}: the signature has no {kind!r} table of "
                             "name -> (dtype, shape)")
        out = []
        for name, entry in table.items():
            try:
                dtype, shape = entry
                dims = tuple(d if d is None or isinstance(d, (int, str)) else int(d) for d in shape)
                if dtype not in ("bfloat16",):
                    np.dtype(dtype)  # raises TypeError for a name numpy does not know
            except (TypeError, ValueError) as exc:
                raise ModelError(f"{where}: signature entry {kind}.{name} = {entry!r} is not "
                                 f"(dtype, shape) ({exc})") from None
            out.append(TensorSpec(str(name), str(dtype), dims))
        return tuple(out)

    return ModelSignature(specs("inputs"), specs("outputs"))


def signature_to_dict(sig: ModelSignature) -> dict[str, Any]:
    """The inverse of :func:`signature_from_dict` (JSON-ready)."""
    return {kind: {t.name: [t.dtype, list(t.shape)] for t in specs}
            for kind, specs in (("inputs", sig.inputs), ("outputs", sig.outputs))}


def _torch_dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def is_model_reference(model: Path | str) -> bool:
    """True for ``package.module:factory`` (not an existing file)."""
    text = str(model)
    if Path(text).exists() or text.count(":") != 1:
        return False
    module, factory = text.split(":")
    return bool(re.fullmatch(r"[A-Za-z_][\w.]*", module)) and factory.isidentifier()


def load_factory(ref: str) -> tuple[Callable[[], Any], Any]:
    """Import ``package.module:factory``; (factory, module). ModelError when it cannot."""
    module_name, attr = ref.split(":")
    cwd = os.getcwd()
    if cwd not in sys.path:  # resolve like `python -m` does
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is a model error for the user
        raise ModelError(f"cannot import module {module_name!r} of model {ref} "
                         f"({type(exc).__name__}: {exc})",
                         hint="run from the folder that holds the package, or set PYTHONPATH") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ModelError(f"model {ref}: module {module_name} has no callable {attr!r}")
    return factory, module


def factory_signature(ref: str) -> ModelSignature:
    """The signature a ``module:factory`` declares (factory attribute, else module attribute)."""
    factory, module = load_factory(ref)
    raw = getattr(factory, "signature", None)
    if raw is None:
        raw = getattr(module, "signature", None)
    if callable(raw):
        raw = raw()
    if not isinstance(raw, Mapping):
        raise ModelError(f"model {ref} declares no signature",
                         hint="give the factory a `signature` dict {inputs: {name: (dtype, shape)}, "
                              "outputs: {...}} (see dossier.backends.torch_inductor)")
    return signature_from_dict(raw, ref)


def _check_not_package(path: Path) -> None:
    with contextlib.suppress(zipfile.BadZipFile, OSError), zipfile.ZipFile(path) as z:
        if any("data/aotinductor/" in n for n in z.namelist()):
            raise ModelError(f"{path} is an AOTInductor package (a built engine), not an "
                             "exported program", hint="give the torch.export.save file")


def load_exported(path: Path) -> tuple[Any, dict[str, Any] | None]:
    """``torch.export.load`` a file; (program, signature dict from its extra file or None)."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model {path} does not exist")
    _check_not_package(path)
    extra = {SIGNATURE_MEMBER: ""}
    try:
        ep = torch.export.load(str(path), extra_files=extra)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad archive
        raise ModelError(f"model {path} is not a readable exported program "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
                         ) from exc
    sig = None
    if extra.get(SIGNATURE_MEMBER):
        try:
            sig = json.loads(extra[SIGNATURE_MEMBER])
        except json.JSONDecodeError as exc:
            raise ModelError(f"{path}: {SIGNATURE_MEMBER} is not valid JSON ({exc})") from exc
    return ep, sig


def exported_signature(ep: Any, where: str) -> ModelSignature:
    """The signature of an exported program read from the program itself."""
    import torch

    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    inputs = []
    for name in ep.graph_signature.user_inputs:
        val = placeholders[name].meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise ModelError(f"{where}: input {name!r} is not a tensor")
        dims = tuple(int(d) if isinstance(d, int) else str(d) for d in val.shape)
        inputs.append(TensorSpec(name, _torch_dtype_name(val.dtype), dims))
    out_spec = ep.call_spec.out_spec
    output_node = next(n for n in ep.graph.nodes if n.op == "output")
    user_outs = output_node.args[0][-len(ep.graph_signature.user_outputs):] \
        if ep.graph_signature.user_outputs else []
    if out_spec is not None and out_spec.type is dict:
        names = [str(k) for k in out_spec.context]
    elif len(user_outs) == 1 and (out_spec is None or out_spec.num_children == 0):
        names = ["output"]
    else:
        names = [f"output_{i}" for i in range(len(user_outs))]
    outputs = []
    for name, node in zip(names, user_outs):
        val = node.meta.get("val") if hasattr(node, "meta") else None
        if isinstance(val, torch.Tensor):
            dims = tuple(int(d) if isinstance(d, int) else str(d) for d in val.shape)
            outputs.append(TensorSpec(name, _torch_dtype_name(val.dtype), dims))
    return ModelSignature(tuple(inputs), tuple(outputs))


def save_exported(ep: Any, path: Path, signature: ModelSignature | None = None) -> None:
    """``torch.export.save`` with the signature stored as the ``dossier/signature.json`` extra
    file (input and output names, dtypes and dynamic dimensions survive the round trip)."""
    import torch

    extra = {SIGNATURE_MEMBER: json.dumps(signature_to_dict(signature))} if signature else None
    torch.export.save(ep, str(path), extra_files=extra)


# ------------------------------------------------------------------------------ module prep
def program_float_dtypes(ep: Any) -> set[Any]:
    """The dtypes of an exported program's floating weights, buffers and constants."""
    import torch

    tensors = [*ep.state_dict.values(), *ep.constants.values()]
    return {t.dtype for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point()}


def _program_devices(ep: Any) -> set[str]:
    """Device types of an exported program's inputs, weights and buffers (from the graph)."""
    import torch

    vals = [n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"]
    return {v.device.type for v in vals if isinstance(v, torch.Tensor)}


def _as_declared(ep: Any, sig: ModelSignature) -> bool:
    """True when a program takes and returns exactly what ``sig`` says, outputs flat."""
    spec = ep.call_spec.out_spec
    if spec is not None and spec.num_leaves != max(spec.num_children, 1):
        return False  # nested outputs
    try:
        own = exported_signature(ep, "program")
    except ModelError:
        return False
    same = [(t.dtype, len(t.shape)) for t in own.inputs] == [(t.dtype, len(t.shape))
                                                           for t in sig.inputs]
    return same and [t.dtype for t in own.outputs] == [t.dtype for t in sig.outputs]


def _drop_dtype_asserts(gm: Any) -> None:
    """Remove the input dtype assertions torch.export puts into a program's graph: casting the
    program to another dtype is what the dtype knob asks for. (Dtypes the program baked into
    its operations stay; a program traced in float32 may then fail to build in another dtype:
    export the model in the dtype it should compute in.)"""
    import torch

    target = getattr(torch.ops.aten, "_assert_tensor_metadata", None)
    if target is None:
        return
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is target.default and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()


@dataclass(frozen=True)
class BuildPlan:
    """What a route means for one build."""

    device: str
    dtype: str
    precision: str
    configs: dict[str, object]
    """``inductor_configs`` for ``aoti_compile_and_package`` (metadata not included)."""


@functools.cache
def _wrapper_class() -> type:
    """nn.Module that casts floating inputs to the compute dtype and returns a flat tuple of
    outputs in the signature's order, cast back to their reference dtypes."""
    import torch

    class Wrapped(torch.nn.Module):
        def __init__(self, inner: Any, dtype: Any, out_names: Sequence[str],
                     out_dtypes: Sequence[Any]) -> None:
            super().__init__()
            self.inner = inner
            self.compute_dtype = dtype
            self.out_names = list(out_names)
            self.out_dtypes = list(out_dtypes)

        def forward(self, *args: Any) -> tuple[Any, ...]:
            if self.compute_dtype is not None:
                args = tuple(a.to(self.compute_dtype) if a.is_floating_point() else a
                             for a in args)
            out = self.inner(*args)
            if isinstance(out, Mapping):
                flat = [out[n] for n in self.out_names]
            elif isinstance(out, (tuple, list)):
                flat = list(out)[: len(self.out_names)]
            else:
                flat = [out]
            return tuple(o.to(d) if o.is_floating_point() and d is not None else o
                         for o, d in zip(flat, self.out_dtypes))

    return Wrapped


def wrap_module(inner: Any, dtype: str, sig: ModelSignature, cast: bool = True) -> Any:
    """``inner`` cast to ``dtype`` inside a module that takes what ``sig`` says and returns a
    flat tuple in ``sig``'s output order: floating inputs are cast to ``dtype`` inside, floating
    outputs back to their signature dtypes. What :meth:`TorchInductorBackend.build` exports.
    ``cast=False`` leaves ``inner`` and the inputs as they are (outputs are still cast back)."""
    import torch

    compute = getattr(torch, dtype)
    out_dtypes = [getattr(torch, t.dtype, None) for t in sig.outputs]
    if cast:
        inner = inner.to(dtype=compute)
    wrapped = _wrapper_class()(inner, compute if cast else None, [t.name for t in sig.outputs],
                               out_dtypes)
    wrapped.training = False  # not .eval(): an exported program's module refuses train/eval
    return wrapped


def example_inputs(sig: ModelSignature, device: str, factory: Any = None) -> tuple[Any, ...]:
    """Export inputs: the factory's ``example_inputs()`` if it has one, else random floating
    inputs, zero integer inputs, dynamic dimensions 2 (so export does not specialise them)."""
    import torch

    custom = getattr(factory, "example_inputs", None)
    if callable(custom):
        return tuple(t.to(device) for t in custom())
    gen = torch.Generator().manual_seed(0)
    out = []
    for spec in sig.inputs:
        shape = [d if isinstance(d, int) else 2 for d in spec.shape]
        dtype = getattr(torch, spec.dtype)
        if dtype.is_floating_point:
            t = torch.randn(shape, generator=gen).to(dtype)
        else:
            t = torch.zeros(shape, dtype=dtype)
        out.append(t.to(device))
    return tuple(out)


def dynamic_shapes(sig: ModelSignature, varargs: bool = False) -> tuple | None:
    """``torch.export`` dynamic shapes for ``sig``'s inputs: one shared ``Dim(name, min=1)`` per
    dimension name, ``Dim.DYNAMIC`` for None; None when every dimension is fixed. ``varargs``:
    for a ``forward(*args)`` module (the per-input specs nested in one tuple)."""
    import torch

    named: dict[str, Any] = {}
    per_input = []
    dynamic = False
    for spec in sig.inputs:
        axes: dict[int, Any] = {}
        for axis, d in enumerate(spec.shape):
            if d is None:
                axes[axis] = torch.export.Dim.DYNAMIC
            elif isinstance(d, str):
                ident = re.sub(r"\W", "_", d) or "dim"
                if not ident[0].isalpha():
                    ident = "d_" + ident
                named.setdefault(d, torch.export.Dim(ident, min=1))
                axes[axis] = named[d]
        dynamic = dynamic or bool(axes)
        per_input.append(axes)
    if not dynamic:
        return None
    return (tuple(per_input),) if varargs else tuple(per_input)


def _short(exc: BaseException, limit: int = 400) -> str:
    """One line about ``exc``: a compiler's ``error:`` line when there is one."""
    text = f"{type(exc).__name__}: {exc}"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error:" in ln and "Error:" not in ln[:30]]
    line = errors[0] if errors else (lines[0] if lines else type(exc).__name__)
    if errors and lines and lines[0] != line:
        line = f"{lines[0][:120]} ... {line}"
    return line[:limit]


NATIVE_BUILD_ERRORS = ("torch._inductor.exc.InductorError", "torch._inductor.exc.CppCompileError",
                       "torch._inductor.exc.CUDACompileError",
                       "torch._dynamo.exc.BackendCompilerFailed", "torch._dynamo.exc.UserError",
                       "AttributeError (unknown config key)", "RuntimeError", "TypeError")
"""Native errors seen from export and compile; every one (any Exception) becomes a BuildError."""


def map_build_error(exc: BaseException, stage: str) -> BuildError:
    """The BuildError for a native error raised while ``stage`` (export or compile) ran."""
    if isinstance(exc, AttributeError) and "does not exist" in str(exc):
        return BuildError(f"{stage} failed: unknown inductor config key ({exc}); this torch does "
                          "not have it")
    return BuildError(f"{stage} failed: {_short(exc)}")


@contextlib.contextmanager
def _build_cache() -> Iterator[Path]:
    """TORCHINDUCTOR_CACHE_DIR = a fresh folder (removed afterwards) or CACHE_ENV's (kept)."""
    shared = os.environ.get(CACHE_ENV)
    folder = Path(shared) if shared else Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    folder.mkdir(parents=True, exist_ok=True)
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    clear = _clear_caches()
    clear()
    try:
        yield folder
    finally:
        clear()
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
        if not shared:
            shutil.rmtree(folder, ignore_errors=True)


def _clear_caches() -> Callable[[], None]:
    try:
        from torch._inductor.utils import clear_caches
    except ImportError:  # older torch: nothing in memory to forget
        return lambda: None
    return clear_caches


@contextlib.contextmanager
def matmul_precision(value: str) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(value)`` for the duration, restored afterwards."""
    import torch

    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(value)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def package_metadata(engine: Path) -> dict[str, str]:
    """The AOTI metadata of a package (AOTI_* keys and dossier's), read from the zip."""
    try:
        with zipfile.ZipFile(engine) as z:
            names = sorted(n for n in z.namelist() if n.endswith("_metadata.json")
                           and "data/aotinductor/" in n)
            if not names:
                raise EngineRuntimeError(f"{engine} holds no AOTInductor model metadata")
            wrapper = [n for n in names if n.endswith("wrapper_metadata.json")] or names
            data = json.loads(z.read(wrapper[0]))
    except (OSError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
        raise EngineRuntimeError(f"{engine} is not a readable AOTInductor package ({exc})") from exc
    return {str(k): str(v) for k, v in data.items()}


def _cxx_facts(engine: Path, cxx: object) -> dict[str, str]:
    """Build facts about the C++ compiler and how the package links libstdc++ (with the line a
    user needs to load it when it carries its own copy)."""
    plan = cxx_runtime.choose()
    info = cxx_runtime.probe(cxx[0]) if isinstance(cxx, (tuple, list)) and cxx else plan.compiler
    facts = {}
    if info is not None:
        facts.update(cxx=info.version, cxx_path=info.path)
    link = cxx_runtime.package_linkage(engine)
    if link is not None:
        facts["libstdcxx"] = link.libstdcxx
        if link.libstdcxx == cxx_runtime.STATIC:
            facts["load_hint"] = cxx_runtime.load_hint(engine.name, cxx_runtime.system_libstdcxx())
    return facts


class _PackageModel:
    """A loaded package called with positional tensors (what ``AOTICompiledModel`` does,
    without importing ``torch._inductor``: 1-3 s of every fresh process)."""

    def __init__(self, loader: Any) -> None:
        from torch.utils import _pytree

        self._loader = loader
        self._out_spec = _pytree.treespec_loads(loader.get_call_spec()[1])
        self._unflatten = _pytree.tree_unflatten

    def __call__(self, *args: Any) -> Any:
        return self._unflatten(self._loader.run(list(args)), self._out_spec)


def load_package(engine: Path, *, cuda: bool, single_threaded: bool) -> Any:
    """``aoti_load_package`` without its CPU probe for a CUDA package.

    ``aoti_load_package`` compares the package's device facts with this host's, which calls
    ``pick_vec_isa()``: it compiles and runs a test program per CPU instruction set (35 s on an
    H200 host, in every fresh process) only to log a warning. A CUDA package has no CPU kernels
    and dossier compares hosts itself (the fingerprint), so a CUDA package is loaded by the
    package loader directly. CPU packages (whose ISA matters) and torch versions without that
    loader go through ``aoti_load_package``.
    """
    import torch

    loader = getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None)
    if cuda and loader is not None and hasattr(loader, "run"):
        try:
            return _PackageModel(loader(str(engine), "model", single_threaded, 1, -1))
        except TypeError:  # another signature in this torch: the public entry point
            pass
    return torch._inductor.aoti_load_package(str(engine), run_single_threaded=single_threaded)


# ------------------------------------------------------------------------------ identity
_TEMP_PATH = re.compile(rb"[^\s\x00\"'<>|;,=]*" + TEMP_PREFIX.encode() + rb"[A-Za-z0-9_]{8}")
_CODE_HASH = re.compile(rb"(?<![A-Za-z0-9])c[a-z0-9]{51}(?![A-Za-z0-9])")
_SKIP_SECTIONS = (".debug", ".nv_debug", ".note.gnu.build-id", ".gnu_debuglink")
_HOST_MACHINES = {62, 183, 3, 40}  # x86-64, AArch64, i386, ARM
_SERIALIZATION_ID = ".data/serialization_id"


def _normalize(data: bytes) -> bytes:
    return _CODE_HASH.sub(b"<hash>", _TEMP_PATH.sub(b"<tmp>", data))


def _elf_digest(data: bytes) -> str | None:
    """Digest of an ELF file's sections minus debug info and build id; None if not ELF64 LE."""
    if not elf.is_elf64le(data):
        return None
    try:
        host = elf.machine(data) in _HOST_MACHINES
        parts = []
        for sec in elf.sections(data):
            if sec.name.startswith(_SKIP_SECTIONS):
                continue
            if host and sec.name in (".symtab", ".strtab"):
                continue  # the static symbol table is not loaded; local names carry file hashes
            nobits = sec.kind == elf.SHT_NOBITS
            parts.append([sec.name, sec.kind, sec.size if nobits else None,
                          digest_bytes(_normalize(sec.body(data)))])
    except elf.ElfError:
        return None
    return digest_json(parts)


def normalized_digest(pt2: Path) -> str:
    """xxh3-128 identity of an AOTInductor package that does not depend on where it was built.

    Hashes every zip member with the archive's root folder (the package file's stem), the
    temporary build folder and the code hashes inductor derives from it replaced by placeholders,
    ``.data/serialization_id`` dropped, and, in ELF members (the model ``.so``, CUDA kernel
    binaries), debug sections, the build id and the host static symbol table left out. Two
    builds of the same route on one host give the same digest; their bytes differ.
    """
    parts = []
    try:
        with zipfile.ZipFile(pt2) as z:
            for info in z.infolist():
                if info.is_dir():
                    continue
                name = info.filename.split("/", 1)[1] if "/" in info.filename else info.filename
                data = z.read(info)
                if name == _SERIALIZATION_ID:
                    data = b""
                digest = _elf_digest(data) or digest_bytes(_normalize(data))
                parts.append([_normalize(name.encode()).decode("utf-8", "replace"), digest])
    except (OSError, zipfile.BadZipFile) as exc:
        raise EngineRuntimeError(f"{pt2} is not a readable AOTInductor package ({exc})") from exc
    return digest_json(sorted(parts))


# ------------------------------------------------------------------------------ runner
@dataclass(frozen=True)
class _Graph:
    """One CUDA graph captured over a call on static input buffers (knob cuda_graph=on)."""

    graph: Any
    inputs: tuple[Any, ...]
    """The static input buffers the graph reads: new inputs are copied into them."""
    outputs: tuple[Any, ...]
    """The static outputs the graph writes (overwritten by every replay)."""


@dataclass(frozen=True)
class _Prepared:
    args: tuple[Any, ...]
    """The inputs on the engine's device, in argument order."""
    graph: _Graph | None = None
    """The graph of these inputs' shapes (one per shape, shared by inputs of equal shapes)."""


def _flat(out: Any) -> list[Any]:
    if isinstance(out, Mapping):
        return list(out.values())
    return list(out) if isinstance(out, (tuple, list)) else [out]


class TorchInductorRunner(Runner):
    """A loaded AOTInductor package.

    With ``cuda_graph`` the package (loaded with ``run_single_threaded=True``, whose model
    container does not synchronize on events) is warmed up on a side stream and captured into a
    CUDA graph over static input buffers, one graph per distinct set of input shapes. A call
    copies its inputs into the buffers, replays the graph and copies the outputs out (the
    static outputs are overwritten by the next replay): :meth:`run` and :meth:`timed` both do
    all three, so accuracy is checked on replayed outputs and the timing includes the copies.
    """

    def __init__(self, compiled: Any, device: str, inputs: Sequence[str],
                 outputs: Sequence[str], precision: str, cuda_graph: bool = False) -> None:
        import torch

        self._torch = torch
        self._graphs = cuda_graph and device.startswith("cuda")
        self._captured: dict[tuple[Any, ...], _Graph] = {}
        self._compiled = compiled
        self._device = device
        self._inputs = list(inputs)
        self._outputs = list(outputs)
        self._precision = precision
        self._cuda = device.startswith("cuda")
        if self._cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    @property
    def device(self) -> str:
        """Where the engine runs (``cpu`` or ``cuda``)."""
        return self._device

    @property
    def graphs(self) -> int:
        """CUDA graphs captured so far (one per distinct set of input shapes)."""
        return len(self._captured)

    def _apply_precision(self) -> None:
        # aten matmuls read the flag when they run, and several engines share one process
        if self._torch.get_float32_matmul_precision() != self._precision:
            self._torch.set_float32_matmul_precision(self._precision)

    def prepare(self, inputs: Mapping[str, np.ndarray]) -> _Prepared:
        """Inputs as tensors on the engine's device, in the engine's argument order (once); with
        CUDA graphs, the graph of their shapes (captured on first sight of the shapes)."""
        if isinstance(inputs, _Prepared):
            return inputs
        missing = [n for n in self._inputs if n not in inputs]
        if missing:
            raise EngineRuntimeError(f"inputs {missing} are missing (the engine takes "
                                     f"{self._inputs})")
        torch = self._torch
        args = tuple(torch.from_numpy(np.ascontiguousarray(inputs[n])).to(self._device)
                     for n in self._inputs)
        if self._cuda:
            torch.cuda.synchronize()
        if not self._graphs:
            return _Prepared(args)
        key = tuple((tuple(a.shape), a.dtype) for a in args)
        if key not in self._captured:
            self._captured[key] = self._capture(args)
        return _Prepared(args, self._captured[key])

    def _capture(self, args: tuple[Any, ...]) -> _Graph:
        """Warm up on a side stream (as torch.cuda.graph requires), then capture one call on
        static copies of ``args``."""
        torch = self._torch
        self._apply_precision()
        static = tuple(a.clone() for a in args)
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    self._call(static)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self._call(static)
            torch.cuda.synchronize()
        except EngineRuntimeError as exc:
            raise EngineRuntimeError(f"CUDA graph capture failed: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - capture refused by the runtime
            raise EngineRuntimeError(f"CUDA graph capture failed: {_short(exc)}") from exc
        return _Graph(graph, static, tuple(_flat(out)))

    def _call(self, args: tuple[Any, ...]) -> Any:
        try:
            return self._compiled(*args)
        except Exception as exc:  # noqa: BLE001 - the AOTI runtime raises RuntimeError and more
            raise EngineRuntimeError(_short(exc)) from exc

    def _execute(self, ready: _Prepared) -> Any:
        """One call: direct, or copy in, replay, copy out."""
        g = ready.graph
        if g is None:
            return self._call(ready.args)
        for static, new in zip(g.inputs, ready.args):
            static.copy_(new, non_blocking=True)
        g.graph.replay()
        return tuple(o.clone() for o in g.outputs)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        prepared = self.prepare(inputs)
        self._apply_precision()
        out = self._execute(prepared)
        if isinstance(out, Mapping):
            try:
                flat = [out[n] for n in self._outputs]
            except KeyError as exc:
                raise EngineRuntimeError(f"the engine returned no output {exc}") from None
        else:
            flat = _flat(out)
        if len(flat) != len(self._outputs):
            raise EngineRuntimeError(f"the engine returned {len(flat)} outputs, its metadata "
                                     f"names {len(self._outputs)}")
        result = {}
        for name, t in zip(self._outputs, flat):
            t = t.detach()
            if t.dtype in (self._torch.bfloat16,):
                t = t.float()
            result[name] = t.cpu().numpy()
        return result

    def timed(self, prepared: object) -> float:
        """Latency of one run in ms: CUDA events (then a sync) on a GPU, perf_counter_ns on CPU.
        With CUDA graphs the copies into the static inputs and out of the static outputs are
        inside the timed region."""
        ready = self.prepare(prepared)  # type: ignore[arg-type]
        self._apply_precision()
        if self._cuda:
            self._start.record()
            self._execute(ready)
            self._end.record()
            self._end.synchronize()
            return float(self._start.elapsed_time(self._end))
        t0 = time.perf_counter_ns()
        self._execute(ready)
        return (time.perf_counter_ns() - t0) / 1e6

    def close(self) -> None:
        self._captured.clear()
        self._compiled = None


# ------------------------------------------------------------------------------ backend
class TorchInductorBackend(Backend):
    """PyTorch AOTInductor (CPU or CUDA)."""

    name = "torch-inductor"
    engine_suffix = ".pt2"
    separate_build = True
    build_cores = 4
    build_memory_mb = 4096
    requirement = "pip install 'dossier[torch]' (torch >= 2.6)"

    def available(self) -> bool:
        return importlib.util.find_spec("torch") is not None

    @functools.cache  # noqa: B019 - one database per backend instance and process
    def knob_database(self) -> KnobDatabase:
        self.require()
        import torch
        from torch._inductor import config

        cuda = bool(torch.cuda.is_available())
        current = config.get_config_copy()
        knobs = [
            Knob(name="device", values=_device_values(cuda), default="cuda" if cuda else "cpu",
                 help="where the package runs; a CPU package is compiled with -march=native"),
            Knob(name="dtype", values=DTYPES, default="float32", changes_numerics=True,
                 help="compute dtype: the model and its floating inputs are cast inside the "
                      "engine, floating outputs cast back to the signature's dtype"),
            Knob(name="float32_matmul_precision", values=PRECISIONS,
                 default=torch.get_float32_matmul_precision(), changes_numerics=True,
                 help="torch.set_float32_matmul_precision while building and running: high "
                      "allows TF32 on GPUs, medium bf16"),
            Knob(name="cuda_graph", values=("off", "on") if cuda else ("off",), default="off",
                 phase=KnobPhase.LOAD,
                 help="replay the package's kernels as a CUDA graph over static input buffers, "
                      "one graph per input shape (removes per-kernel launch overhead; the copies "
                      "in and out are part of each call; trtexec's default)"),
        ]
        for key, text, numerics in INDUCTOR_KEYS:
            if key not in current:
                continue
            default = _OWN_DEFAULTS.get(key, current[key])
            knobs.append(Knob(name=KNOB_PREFIX + key, values=_key_values(key, default, cuda),
                              default=value_text(default), phase=KnobPhase.BUILD, help=text,
                              changes_numerics=numerics))
        return KnobDatabase(backend=self.name, tuner_version=f"torch {torch.__version__}",
                            knobs=tuple(knobs))

    def stack(self) -> dict[str, str]:
        import torch

        out: dict[str, str] = {"torch": str(torch.__version__)}
        if torch.version.cuda:
            out["torch_cuda"] = str(torch.version.cuda)
            if torch.cuda.is_available():
                out["cudnn"] = str(torch.backends.cudnn.version())
        if importlib.util.find_spec("triton") is not None:
            from importlib import metadata

            with contextlib.suppress(metadata.PackageNotFoundError):
                out["triton"] = metadata.version("triton")
        info = cxx_runtime.choose().compiler
        if info is not None:
            out["cxx"] = info.text()
        return out

    # ---------------------------------------------------------------------------- model
    def signature(self, model: Path) -> ModelSignature:
        self.require()
        if is_model_reference(model):
            return factory_signature(str(model))
        path = Path(model)
        if path.suffix not in EXPORTED_SUFFIXES:
            raise ModelError(f"model {model} is neither an exported program (*.pt2, *.ep) nor a "
                             "module:factory reference")
        ep, sig = load_exported(path)
        if sig is not None:
            return signature_from_dict(sig, str(path))
        return exported_signature(ep, str(path))

    def plan(self, route: Route) -> BuildPlan:
        """What ``route`` means: device, dtype, precision and the inductor configs to set."""
        import torch
        from torch._inductor import config

        db = self.knob_database()
        known = {k.name for k in db.knobs}
        for name in route.as_dict():
            if name not in known and not name.startswith(KNOB_PREFIX):
                raise BuildError(f"unknown knob -{name} for backend {self.name}")
        eff = {**route.effective(db), **route.as_dict()}
        if eff["device"] == "cuda" and not torch.cuda.is_available():
            raise BuildError("device cuda requested, but torch sees no CUDA device here")
        current = config.get_config_copy()
        configs: dict[str, object] = {}
        defaults = {k.name: k.default for k in db.knobs}
        for name, text in eff.items():
            if not name.startswith(KNOB_PREFIX):
                continue
            key = name[len(KNOB_PREFIX):]
            if key in _OWN_DEFAULTS and key in current:
                configs[key] = parse_value(text, _OWN_DEFAULTS[key])
            elif text != defaults.get(name):
                configs[key] = parse_value(text, current.get(key, ...))
        return BuildPlan(device=eff["device"], dtype=eff["dtype"],
                         precision=eff["float32_matmul_precision"], configs=configs)

    def _program(self, model: Path, plan: BuildPlan) -> tuple[ModelSignature, Any, str]:
        """(signature, the exported program to compile, how it was obtained).

        A saved program that already computes in the route's dtype on the route's device and
        returns what its signature says is compiled as saved; anything else is wrapped (see
        :func:`wrap_module`) and exported again."""
        import torch

        compute = getattr(torch, plan.dtype)
        if is_model_reference(model):
            sig = factory_signature(str(model))
            factory, _ = load_factory(str(model))
            inner = factory()
            if not isinstance(inner, torch.nn.Module):
                raise BuildError(f"factory {model} returned {type(inner).__name__}, not an "
                                 "nn.Module")
            module = wrap_module(inner.eval().to(device=plan.device), plan.dtype, sig)
            args = example_inputs(sig, plan.device, factory)
        else:
            ep, raw = load_exported(Path(model))
            sig = signature_from_dict(raw, str(model)) if raw else exported_signature(ep, str(model))
            cast = program_float_dtypes(ep) != {compute}
            if not cast and _program_devices(ep) <= {plan.device} and _as_declared(ep, sig):
                return sig, ep, "as saved"
            inner = ep.module()
            if cast:
                _drop_dtype_asserts(inner)
            module = wrap_module(inner.to(device=plan.device), plan.dtype, sig, cast)
            args = example_inputs(sig, plan.device)
        with torch.no_grad():
            ep = torch.export.export(module, args, dynamic_shapes=dynamic_shapes(sig, varargs=True))
        return sig, ep, "re-exported"

    def build(self, model: Path, route: Route, engine: Path) -> BuildInfo:
        self.require()
        import torch

        plan = self.plan(route)
        engine = Path(engine)
        engine.parent.mkdir(parents=True, exist_ok=True)
        engine.unlink(missing_ok=True)
        with _build_cache(), matmul_precision(plan.precision):
            stage = "export"
            try:
                sig, ep, how = self._program(model, plan)
                stage = "compile"
                metadata = {
                    META_PREFIX + "route": route.text(),
                    META_PREFIX + "torch": str(torch.__version__),
                    META_PREFIX + "inputs": json.dumps([t.name for t in sig.inputs]),
                    META_PREFIX + "outputs": json.dumps([t.name for t in sig.outputs]),
                    META_PREFIX + "device": plan.device,
                    META_PREFIX + "dtype": plan.dtype,
                    META_PREFIX + "float32_matmul_precision": plan.precision,
                }
                configs = {**plan.configs, "aot_inductor.metadata": metadata}
                cxx = cxx_runtime.choose()
                if cxx.override and "cpp.cxx" not in configs:
                    # the first g++ on PATH embeds libstdc++: its packages crash on load
                    configs["cpp.cxx"] = (cxx.override,)
                if plan.device == "cuda" and "aot_inductor.embed_kernel_binary" in \
                        torch._inductor.config.get_config_copy():
                    # kernels inside the .so: the package must not need the build's cache
                    configs.setdefault("aot_inductor.embed_kernel_binary", True)
                torch._inductor.aoti_compile_and_package(ep, package_path=str(engine),
                                                         inductor_configs=configs)
            except (BuildError, MemoryError, KeyboardInterrupt):
                raise
            except ModelError as exc:
                raise BuildError(str(exc)) from exc
            except Exception as exc:  # noqa: BLE001 - see NATIVE_BUILD_ERRORS
                raise map_build_error(exc, stage) from exc
        if not engine.is_file():
            raise BuildError("aoti_compile_and_package wrote no package")
        meta = package_metadata(engine)
        facts = {"device": plan.device, "dtype": plan.dtype, "program": how,
                 "float32_matmul_precision": plan.precision, "torch": str(torch.__version__),
                 "cpu_package": str(plan.device == "cpu").lower(),
                 "march_native": str(plan.device == "cpu").lower(),
                 "normalized_digest": normalized_digest(engine)}
        facts.update(_cxx_facts(engine, configs.get("cpp.cxx")))
        for key in ("AOTI_DEVICE_KEY", "AOTI_CPU_ISA", "AOTI_COMPUTE_CAPABILITY", "AOTI_PLATFORM",
                    "AOTI_MACHINE"):
            if key in meta:
                facts[key.lower()] = meta[key]
        return BuildInfo(facts)

    def load(self, engine: Path, route: Route) -> Runner:
        """Load as :meth:`production_load` says a deployment should."""
        self.require()
        import torch

        meta = package_metadata(Path(engine))
        if all(META_PREFIX + k in meta for k in ("device", "float32_matmul_precision")):
            # the package says what it is: no knob database (which imports torch._inductor)
            eff = {"cuda_graph": "off", **route.as_dict()}
        else:
            eff = route.effective(self.knob_database())
        device = meta.get("AOTI_DEVICE_KEY") or meta.get(META_PREFIX + "device") or eff["device"]
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise EngineRuntimeError("the package was built for CUDA, and torch sees no CUDA "
                                     "device here")
        try:
            inputs = json.loads(meta[META_PREFIX + "inputs"])
            outputs = json.loads(meta[META_PREFIX + "outputs"])
        except (KeyError, json.JSONDecodeError) as exc:
            raise EngineRuntimeError(f"{engine} was not built by dossier (no tensor names in its "
                                     "metadata)") from exc
        key = META_PREFIX + "float32_matmul_precision"
        precision = meta[key] if key in meta else eff["float32_matmul_precision"]
        graphs = eff.get("cuda_graph") == "on" and device.startswith("cuda")
        link = cxx_runtime.package_linkage(Path(engine))
        if link is not None and link.libstdcxx == cxx_runtime.STATIC \
                and not cxx_runtime.preloaded():
            raise EngineRuntimeError(cxx_runtime.load_hint(Path(engine).name,
                                                           cxx_runtime.system_libstdcxx())
                                     + " (loading it without would crash this process)")
        try:
            compiled = load_package(Path(engine), cuda=device.startswith("cuda"),
                                    single_threaded=graphs)
        except Exception as exc:  # noqa: BLE001 - a corrupt package, a missing ISA, a driver
            raise EngineRuntimeError(f"cannot load {Path(engine).name}: {_short(exc)}") from exc
        return TorchInductorRunner(compiled, "cuda" if device.startswith("cuda") else "cpu",
                                   inputs, outputs, precision, cuda_graph=graphs)

    def loader_env(self, engine: Path) -> dict[str, str]:
        """The system libstdc++ preloaded when the package carries its own copy."""
        return cxx_runtime.loader_env(Path(engine))

    def production_load(self, route: Route, db: KnobDatabase) -> LoadConfig:
        eff = route.effective(db)
        if eff.get("cuda_graph") == "on" and str(eff.get("device", "")).startswith("cuda"):
            return LoadConfig(
                call="torch._inductor.aoti_load_package(ENGINE, run_single_threaded=True), "
                     "then one CUDA graph per input shape over static buffers",
                options={"run_single_threaded": "True"},
                note="what dossier timed: the package captured in a CUDA graph (warmed up on a "
                     "side stream, captured over static inputs, replayed); each call copies the "
                     "inputs in and the outputs out; capture one graph per input shape",
                snippet=_GRAPH_SNIPPET)
        return LoadConfig(call="torch._inductor.aoti_load_package(ENGINE)",
                          note="the loader call dossier times the package with; run it in the "
                               "process that serves requests",
                          snippet="import torch\n\nmodel = torch._inductor.aoti_load_package(ENGINE)")

    def engine_facts(self, route: Route, db: KnobDatabase) -> dict[str, bool]:
        device = route.effective(db).get("device", "cpu")
        return {"cpu_package": device == "cpu", "march_native": device == "cpu"}


_GRAPH_SNIPPET = """import torch

model = torch._inductor.aoti_load_package(ENGINE, run_single_threaded=True)
static_in = [x.clone() for x in example_inputs]  # CUDA tensors of one input shape
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        model(*static_in)  # warm up outside the capture
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    static_out = model(*static_in)


def run(*inputs):
    for s, x in zip(static_in, inputs):
        s.copy_(x)
    graph.replay()
    return [o.clone() for o in static_out]"""
"""How to load and call a package shipped with ``-cuda_graph=on`` (what the backend times)."""
