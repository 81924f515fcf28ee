"""The tensors of an ONNX graph that can hold data, and where external ones keep it: what the
backends check before compiling a model and what a bundle digests beside it. Imports ``onnx``
only when called."""

from __future__ import annotations

from typing import Any


def tensors(graph: Any) -> list[Any]:
    """Every tensor of ``graph`` and its subgraphs that can hold data (initializers, sparse
    initializers, tensor attributes)."""
    out = list(graph.initializer)
    for sparse in graph.sparse_initializer:
        out += [sparse.values, sparse.indices]
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                out.append(attr.t)
            out.extend(attr.tensors)
            if attr.HasField("g"):
                out += tensors(attr.g)
            for g in attr.graphs:
                out += tensors(g)
    return out


def external_tensors(proto: Any) -> list[tuple[Any, str]]:
    """Each tensor of the model ``proto`` whose data lies in an external file, with that file's
    location as the model gives it ("" when it gives none)."""
    import onnx

    return [(t, next((e.value for e in t.external_data if e.key == "location"), ""))
            for t in tensors(proto.graph) if t.data_location == onnx.TensorProto.EXTERNAL]
