"""Reading an ONNX model's inputs and outputs, for every backend that compiles ONNX files.

Only needs the ``onnx`` package (a core dependency), never a compiler, so a host without
TensorRT can still say what a TensorRT bundle's model expects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dossier.backends.interface import ModelSignature, TensorSpec
from dossier.errors import ModelError
from dossier.onnx_graph import external_tensors


def check_external_data(model: Path, proto: Any = None) -> None:
    """Raise ModelError when an external data file the ONNX model ``model`` (``proto``: the
    model read without its external data) names is not a file beside it (a missing
    ``model.onnx.data``)."""
    if proto is None:
        import onnx

        proto = onnx.load(str(model), load_external_data=False)
    named = {location for _, location in external_tensors(proto) if location}
    missing = sorted(x for x in named if not (Path(model).parent / x).is_file())
    if missing:
        raise ModelError(f"model {model} keeps its weights in {', '.join(missing)}, which "
                         f"{'is' if len(missing) == 1 else 'are'} not beside it",
                         hint="copy the external data file(s) next to the model, under the "
                              "name(s) the model gives")


def onnx_signature(model: Path) -> ModelSignature:
    """The graph inputs (initializers excluded) and outputs of the ONNX file ``model``.

    Dimensions are ints when fixed, the symbolic name (``dim_param``) or None when dynamic.
    External weights are not loaded, but each external data file the model names must be
    beside it (``torch.onnx.export`` writes ``model.onnx`` and ``model.onnx.data``). Raises
    ModelError when the file is missing, unreadable, has no outputs or lacks external data.
    """
    import onnx
    from onnx import helper

    if not Path(model).is_file():
        raise ModelError(f"model {model} does not exist")
    try:
        proto = onnx.load(str(model), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, ValueError, OSError...
        raise ModelError(f"model {model} is not a readable ONNX file ({exc})") from exc
    if not proto.graph.output:
        raise ModelError(f"model {model} is not a valid ONNX model (its graph has no outputs)")
    check_external_data(Path(model), proto)
    inits = {i.name for i in proto.graph.initializer}

    def spec(v: Any) -> TensorSpec:
        t = v.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                     for d in t.shape.dim)
        try:
            dtype = str(np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelError(f"model {model}: tensor {v.name!r} has an element type "
                             f"({t.elem_type}) numpy cannot represent") from exc
        return TensorSpec(v.name, dtype, dims)

    return ModelSignature(tuple(spec(v) for v in proto.graph.input if v.name not in inits),
                          tuple(spec(v) for v in proto.graph.output))
