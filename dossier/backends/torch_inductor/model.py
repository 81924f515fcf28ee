"""What a torch-inductor model is, and how it is prepared for export.

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
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import json
import os
import re
import sys
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dossier.backends.interface import (
    ModelSignature,
    TensorSpec,
)
from dossier.errors import ModelError

SIGNATURE_MEMBER = "dossier/signature.json"
"""Extra file of an exported program holding its signature (see :func:`save_exported`)."""
EXPORTED_SUFFIXES = (".pt2", ".ep")


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


def program_devices(ep: Any) -> set[str]:
    """Device types of an exported program's inputs, weights and buffers (from the graph)."""
    import torch

    vals = [n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"]
    return {v.device.type for v in vals if isinstance(v, torch.Tensor)}


def as_declared(ep: Any, sig: ModelSignature) -> bool:
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


def drop_dtype_asserts(gm: Any) -> None:
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


def dynamic_shapes(sig: ModelSignature, varargs: bool = False) -> tuple[Any, ...] | None:
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


