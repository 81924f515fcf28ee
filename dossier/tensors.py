"""Named tensors on disk as Arrow IPC files (no pickle).

One file holds a set of named tensors: one column per tensor, one row, each column of Arrow's
``fixed_shape_tensor`` extension type, so the file is readable by any Arrow implementation.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from dossier.errors import ValidationSetError


def write_tensors(path: Path, tensors: Mapping[str, np.ndarray],
                  metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` to ``path`` as one Arrow IPC file."""
    import pyarrow as pa  # imported here: verifying and loading a bundle need no Arrow

    if not tensors:
        raise ValidationSetError(f"{path}: no tensors to write")
    arrays, fields = [], []
    for name, value in tensors.items():
        arr = np.ascontiguousarray(value)
        value_type = pa.from_numpy_dtype(arr.dtype)
        flat = pa.FixedSizeListArray.from_arrays(pa.array(arr.reshape(-1), type=value_type), arr.size)
        tensor_type = pa.fixed_shape_tensor(value_type, list(arr.shape))
        storage = pa.ExtensionArray.from_storage(tensor_type, flat)
        arrays.append(storage)
        fields.append(pa.field(name, storage.type))
    schema = pa.schema(fields, metadata={k.encode(): v.encode() for k, v in (metadata or {}).items()})
    table = pa.Table.from_arrays(arrays, schema=schema)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(table)


def read_tensors(path: Path) -> dict[str, np.ndarray]:
    """Read the named tensors of an Arrow IPC file written by :func:`write_tensors`."""
    import pyarrow as pa  # imported here: verifying and loading a bundle need no Arrow

    try:
        with pa.memory_map(str(path), "r") as source:
            table = pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid) as exc:
        raise ValidationSetError(f"{path}: not a readable tensor file ({exc})") from exc
    out: dict[str, np.ndarray] = {}
    for field, column in zip(table.schema, table.columns):
        if not isinstance(field.type, pa.FixedShapeTensorType) or len(column) != 1:
            raise ValidationSetError(f"{path}: column {field.name!r} is not one fixed-shape tensor")
        tensor_type = field.type
        values = column.combine_chunks().storage.flatten().to_numpy(zero_copy_only=False)
        arr = np.asarray(values).reshape(tensor_type.shape)
        out[field.name] = np.array(arr, copy=True)
    return out
