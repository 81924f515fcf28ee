"""NumPy array files for ``dossier run``: its inputs read from an ``.npz`` (or, for an engine
of one input, an ``.npy``) as untrusted files (every array's header read and its size checked
before it is unpacked, no pickled objects), its outputs written as an ``.npz`` that never
replaces a file."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dossier.errors import InputError

if TYPE_CHECKING:
    import numpy as np

NPZ_MAX_BYTES = 4 << 30
"""Largest inputs file ``dossier run`` reads."""
UNPACKED_MAX_BYTES = 4 << 30
"""Most bytes ``dossier run`` unpacks from an inputs file (what the arrays hold, whatever the
file's compressed size)."""
HINT_INPUTS = ("save the inputs with numpy.savez(path, name=array, ...), or numpy.save(path, "
                "array) for an engine of one input")


def read_inputs(path: str | os.PathLike[str], names: Sequence[str] | None = None
                ) -> dict[str, np.ndarray]:
    """Named arrays from an ``.npz`` file, or from an ``.npy`` file (one array) for an engine
    of one input: ``names``, the engine's inputs, names it. Untrusted: the file is opened
    without blocking and must be a regular file of at most :data:`NPZ_MAX_BYTES`; no pickled
    objects; every array's header is read and its size checked before it is unpacked, at
    most :data:`UNPACKED_MAX_BYTES` in all. InputError (one line) when it cannot be read."""

    if not str(path):
        raise InputError("no inputs file given (-i is empty)", hint=HINT_INPUTS)
    path = Path(path)
    try:
        with _open_inputs(path) as f:
            if f.read(6) == b"\x93NUMPY":  # one .npy array
                f.seek(0)
                array = _read_npy(f, UNPACKED_MAX_BYTES, path.name)
                if names is None or len(names) != 1:
                    raise InputError(
                        f"{path} is a single .npy array"
                        + (f"; this engine takes {len(names)} inputs {list(names)}"
                           if names is not None else ""), hint=HINT_INPUTS)
                return {names[0]: array}
            f.seek(0)
            return _read_npz(f, path)
    except InputError:
        raise
    except MemoryError as exc:
        raise InputError(f"cannot read inputs {path}: not enough memory to unpack it") from exc
    except (OSError, ValueError, EOFError, SyntaxError, RecursionError, OverflowError,
            TypeError, KeyError) as exc:
        why = getattr(exc, "strerror", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
        raise InputError(f"cannot read inputs {path}: {why}", hint=HINT_INPUTS) from exc
    except Exception as exc:  # zipfile's own errors (BadZipFile, LargeZipFile...)
        raise InputError(f"cannot read inputs {path}: {exc}", hint=HINT_INPUTS) from exc


def _open_inputs(path: Path) -> Any:
    """``path`` opened for reading without blocking: a regular file of at most
    NPZ_MAX_BYTES (InputError otherwise)."""
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    f = open(fd, "rb")  # noqa: SIM115 - returned to the caller
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        f.close()
        raise InputError(f"cannot read inputs {path}: not a regular file", hint=HINT_INPUTS)
    if info.st_size > NPZ_MAX_BYTES:
        f.close()
        raise InputError(f"{path} is larger than {NPZ_MAX_BYTES >> 30} GiB")
    return f


def _read_npy(f: Any, budget: int, what: str) -> np.ndarray:
    """One .npy array from ``f``: its header read and checked (no objects, at most
    ``budget`` bytes) before its data; InputError otherwise."""
    import numpy as np

    fmt = np.lib.format
    version = fmt.read_magic(f)
    shape, fortran, dtype = (fmt.read_array_header_1_0(f) if version == (1, 0)
                             else fmt.read_array_header_2_0(f))
    if dtype.hasobject:
        raise InputError(f"{what} holds Python objects (pickled); refused")
    count = 1
    for d in shape:
        count *= int(d)
    nbytes = count * dtype.itemsize
    if nbytes > budget:
        raise InputError(f"{what} declares an array of {nbytes} bytes {tuple(shape)}, more "
                         f"than the {budget} left to unpack ({UNPACKED_MAX_BYTES >> 30} GiB "
                         "in all)")
    data = f.read(nbytes)
    if len(data) != nbytes:
        raise InputError(f"{what} is truncated: {len(data)} of its {nbytes} bytes")
    array = np.frombuffer(data, dtype=dtype)
    array = array.reshape(shape[::-1]).T if fortran else array.reshape(shape)
    array = np.array(array, copy=True)
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


def _read_npz(f: Any, path: Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz archive, each member's declared size checked against what is
    left of UNPACKED_MAX_BYTES before it is unpacked."""
    import zipfile

    out = {}
    left = UNPACKED_MAX_BYTES
    with zipfile.ZipFile(f) as z:
        members = z.infolist()
        if sum(m.file_size for m in members) > UNPACKED_MAX_BYTES:
            raise InputError(f"{path} unpacks to {sum(m.file_size for m in members)} bytes, "
                             f"more than {UNPACKED_MAX_BYTES >> 30} GiB")
        for m in members:
            if not m.filename.endswith(".npy"):
                raise InputError(f"{path}: member {m.filename!r} is not an .npy array",
                                 hint=HINT_INPUTS)
            with z.open(m) as member:
                array = _read_npy(member, min(left, m.file_size), f"{path}:{m.filename}")
            left -= array.nbytes
            out[m.filename[:-4]] = array
    if not out:
        raise InputError(f"{path} holds no arrays", hint=HINT_INPUTS)
    return out


def write_outputs(path: str | os.PathLike[str], outputs: Mapping[str, np.ndarray]) -> Path:
    """Write named arrays as ``.npz``; an existing file is never overwritten (OutputError),
    and nothing half-written is left (DiskFullError when the disk is full)."""
    import numpy as np

    from dossier.diskfull import output_error
    from dossier.errors import OutputError

    path = Path(path)
    if os.path.lexists(path):
        raise OutputError(f"{path} exists; not overwritten", hint="choose another -o")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "xb") as f:
            np.savez(f, **dict(outputs))  # type: ignore[arg-type]
        os.link(tmp, path)  # fails if the file appeared meanwhile: never overwritten
    except FileExistsError:
        raise OutputError(f"{path} appeared while the outputs were written; not overwritten") \
            from None
    except OSError as exc:
        raise output_error(exc, path.parent, f"writing {path.name}", f"write {path}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return path


__all__ = ["HINT_INPUTS", "NPZ_MAX_BYTES", "UNPACKED_MAX_BYTES", "read_inputs", "write_outputs"]
