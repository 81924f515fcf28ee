"""Making a validation set: pairs from NumPy files, references from an independent computation.

A pair's inputs come from the user (``.npy``: one array, the model's single input; ``.npz``: one
array per input, by name). Its references come either from the user (the same file kinds, one
per output) or from a **reference computation** named here:

- ``onnxruntime-cpu``: the ONNX model run by ONNX Runtime's CPU provider with every graph
  optimization disabled (``ORT_DISABLE_ALL``), one thread, no memory-pattern or arena tricks:
  the graph as written, operator by operator;
- ``module:function``: a Python function the user supplies, called with float64 copies of the
  floating-point inputs (``fn(inputs: dict[str, ndarray]) -> dict[str, ndarray]``), for example
  a NumPy reimplementation of the model; its floating outputs are kept in float64.

References must not come from the engine under test: an engine compared with its own output
always passes. ``provenance.json`` records how the set was made (the reference computation,
library versions, the model's and the input files' digests).
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import os
import re
import sys
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from tokenize import TokenError
from typing import IO

import numpy as np

from dossier.backends.interface import ModelSignature
from dossier.backends.onnx_model import onnx_signature
from dossier.errors import InputError, ModelError, OutputError, ValidationSetError
from dossier.files import read_small, write_new_folder
from dossier.hashing import digest_file
from dossier.tensors import write_tensors
from dossier.validation import ValidationSet, load_validation_set

MAX_FILE_BYTES = 2 << 30
"""The arrays of one inputs or references file (all of an ``.npz``'s members together), at
most: a larger file is refused before anything is allocated."""
ORT_REFERENCE = "onnxruntime-cpu"
"""The named reference computation: ONNX Runtime, CPU provider, optimizations disabled."""
PROVENANCE = "provenance.json"

Arrays = dict[str, np.ndarray]


def read_pairs(path: Path, single_name: str | None = None) -> list[Arrays]:
    """The pairs' inputs in one file or folder: an ``.npy``/``.npz`` is one pair; a Polygraphy
    inputs file (``polygraphy run --save-inputs FILE``: a JSON list of name -> array feeds) one
    pair per feed; a folder (``--save-inputs DIR``: one such JSON file per iteration) one pair
    per feed of its ``*.json`` files, in the order of their index."""
    return _arrays_of(Path(path), single_name, read_polygraphy_inputs)


def read_reference_pairs(path: Path, single_name: str | None = None) -> list[Arrays]:
    """The pairs' references in one file or folder: an ``.npy``/``.npz`` is one pair; a
    Polygraphy outputs file (``polygraphy run --save-outputs FILE``: RunResults JSON of one
    runner) one pair per iteration; a folder of such files (``--save-outputs DIR``) one pair per
    iteration of its ``*.json`` files, in the order of their index."""
    return _arrays_of(Path(path), single_name, read_polygraphy_outputs)


def _arrays_of(path: Path, single_name: str | None,
               polygraphy: Callable[[Path], list[Arrays]]) -> list[Arrays]:
    """An ``.npy``/``.npz`` as one pair's arrays; a Polygraphy JSON file, or a folder of them
    in the order of their index, through ``polygraphy``."""
    if path.is_dir():
        return [arrays for f in _iteration_files(path) for arrays in polygraphy(f)]
    if path.suffix.lower() == ".json":
        return polygraphy(path)
    return [read_arrays(path, single_name)]


def _iteration_files(folder: Path) -> list[Path]:
    """The ``*.json`` files of a Polygraphy folder, by the numbers in their names (2 before 10)."""
    def index(p: Path) -> list[int | str]:
        return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]

    try:
        files = sorted((p for p in folder.iterdir() if p.suffix.lower() == ".json"
                        and p.is_file()), key=index)
    except OSError as exc:
        raise ValidationSetError(f"{folder}: cannot list the folder ({exc.strerror or exc})") \
            from exc
    if not files:
        raise ValidationSetError(f"{folder}: a folder of Polygraphy files, but it holds no "
                                 ".json file", hint="give the folder polygraphy --save-inputs "
                                 "or --save-outputs wrote, or .npz files")
    return files


def _read_json(path: Path) -> object:
    try:
        return json.loads(read_small(path).decode("utf-8"))
    except FileNotFoundError:
        raise ValidationSetError(f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValidationSetError(f"{path}: not a readable JSON file ({exc})") from exc


def _decode_feed(path: Path, where: str, feed: Mapping[str, object]) -> Arrays:
    """Name -> array, each array as Polygraphy's JSON encoder writes it: ``{"array": base64 of
    numpy.save bytes, "polygraphy_class": "ndarray"}``, possibly inside a lazily loaded array's
    ``{"values": ...}`` (no pickles)."""
    import base64
    import binascii
    import io

    arrays = {}
    for name, enc in feed.items():
        if isinstance(enc, dict) and "array" not in enc and isinstance(enc.get("values"), dict):
            enc = enc["values"]  # a LazyArray (swapped to disk by Polygraphy) holds the array
        if not isinstance(enc, dict) or not isinstance(enc.get("array"), str):
            raise ValidationSetError(f"{path}: {where}, {name!r} is not an encoded array")
        try:
            raw = base64.b64decode(enc["array"].encode(), validate=True)
            check_npy_header(io.BytesIO(raw), len(raw), f"{path}: {where}, {name!r}")
            arr = np.load(io.BytesIO(raw), allow_pickle=False)
        except (binascii.Error, ValueError, OSError, EOFError) as exc:
            raise ValidationSetError(f"{path}: {where}, {name!r}: not a NumPy array "
                                     f"({exc})") from exc
        if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "biuf":
            raise ValidationSetError(f"{path}: {where}, {name!r} is not a numeric tensor")
        arrays[str(name)] = arr
    return arrays


def read_polygraphy_inputs(path: Path) -> list[Arrays]:
    """Polygraphy's input data JSON: a list of feed dicts (or, in a per-iteration file, one
    feed dict) whose arrays are encoded as Polygraphy encodes them (no pickles)."""
    path = Path(path)
    data = _read_json(path)
    if isinstance(data, dict) and data and "lst" not in data and "polygraphy_class" not in data:
        data = [data]  # one iteration's feed
    if not isinstance(data, list) or not data or not all(isinstance(d, dict) and d
                                                         for d in data):
        kind = " (that is a --save-outputs file: give it as --references)" \
            if isinstance(data, dict) and "lst" in data else ""
        raise ValidationSetError(f"{path}: not a Polygraphy inputs file (a JSON list of "
                                 f"name -> array feeds){kind}")
    return [_decode_feed(path, f"feed {i}", feed) for i, feed in enumerate(data)]


def read_polygraphy_outputs(path: Path) -> list[Arrays]:
    """Polygraphy's RunResults JSON (``--save-outputs``): ``{"lst": [[runner, [iteration,
    ...]]]}``, each iteration ``{"outputs": {name: array}, ...}``. One pair per iteration; the
    file must hold the outputs of exactly one runner (the reference)."""
    path = Path(path)
    data = _read_json(path)
    runs = data.get("lst") if isinstance(data, dict) else None
    if not isinstance(runs, list) or not all(isinstance(r, list) and len(r) == 2
                                             and isinstance(r[0], str)
                                             and isinstance(r[1], list) for r in runs):
        raise ValidationSetError(f"{path}: not a Polygraphy outputs file (RunResults JSON, "
                                 "polygraphy run --save-outputs)",
                                 hint="references as .npz files, one per pair, also work")
    if len(runs) != 1:
        names = ", ".join(r[0] for r in runs) or "none"
        raise ValidationSetError(f"{path}: holds the outputs of {len(runs)} runners ({names}); "
                                 "the references are the outputs of one",
                                 hint="save the reference runner's outputs alone, e.g. "
                                 "polygraphy run model.onnx --onnxrt --save-outputs FILE")
    runner, iterations = runs[0]
    pairs = []
    for i, it in enumerate(iterations):
        outputs = it.get("outputs") if isinstance(it, dict) else None
        if not isinstance(outputs, dict) or not outputs:
            raise ValidationSetError(f"{path}: runner {runner!r}, iteration {i} holds no "
                                     "outputs")
        pairs.append(_decode_feed(path, f"runner {runner!r}, iteration {i}", outputs))
    if not pairs:
        raise ValidationSetError(f"{path}: runner {runner!r} has no iterations")
    return pairs


def read_arrays(path: Path, single_name: str | None = None) -> Arrays:
    """The named arrays of a ``.npy`` or ``.npz`` file (no pickles). A ``.npy`` holds one
    array, named ``single_name``; ValidationSetError when the file cannot be used."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".npy", ".npz"):
        raise ValidationSetError(f"{path}: not a .npy, .npz or Polygraphy inputs .json file",
                                 hint="save arrays with numpy.save or numpy.savez")
    try:
        _check_sizes(path, suffix)
        ctx = np.load(path, allow_pickle=False) if suffix == ".npz" else _Single(path)
        with ctx as data:
            arrays = {str(k): np.array(data[k]) for k in data.files}
    except FileNotFoundError:
        raise ValidationSetError(f"{path} does not exist") from None
    except ValidationSetError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:  # pickles, torn files
        raise ValidationSetError(f"{path}: not a readable NumPy file ({exc})") from exc
    if suffix == ".npy":
        if single_name is None:
            raise ValidationSetError(f"{path}: a .npy file holds one unnamed array, but the "
                                     "model has several tensors of that kind",
                                     hint="use an .npz with one array per tensor name")
        arrays = {single_name: arrays["arr_0"]}
    if not arrays:
        raise ValidationSetError(f"{path}: holds no arrays")
    for name, arr in arrays.items():
        if arr.size == 0:
            raise ValidationSetError(f"{path}: array {name!r} has shape {tuple(arr.shape)}: "
                                     "it holds no element (an empty batch)")
        if arr.dtype.kind not in "biuf" or arr.dtype.hasobject:
            raise ValidationSetError(f"{path}: array {name!r} has dtype {arr.dtype}, not a "
                                     "numeric tensor")
    return arrays


def check_npy_header(f: IO[bytes], available: int, where: str) -> None:
    """Read the ``.npy`` header at the start of ``f`` and check, before anything is allocated,
    that its shape and dtype need exactly the ``available`` bytes left after the header (and
    at most :data:`MAX_FILE_BYTES`); ValidationSetError otherwise."""
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    except (ValueError, EOFError, OSError, SyntaxError, RecursionError, TokenError) as exc:
        # a header numpy cannot parse (unbalanced or deep brackets: tokenize's own error)
        why = (f"its header does not parse: {exc.args[0]}" if isinstance(exc, TokenError)
               else (str(exc).splitlines() or [type(exc).__name__])[0])
        raise ValidationSetError(f"{where}: not a readable NumPy file ({why})") from exc
    if dtype.hasobject or dtype.kind not in "biuf":
        raise ValidationSetError(f"{where}: not a readable NumPy file (dtype {dtype} is not a "
                                 "numeric tensor)")
    count = 1
    for dim in shape:
        count *= int(dim)
    need = count * dtype.itemsize  # Python integers: no overflow
    left = available - f.tell()
    if need > MAX_FILE_BYTES:
        raise ValidationSetError(f"{where}: shape {tuple(shape)} of {dtype} needs {need} bytes, "
                                 f"more than the {MAX_FILE_BYTES >> 20} MiB a file may hold")
    if need != left:
        raise ValidationSetError(f"{where}: the header says shape {tuple(shape)} of {dtype} "
                                 f"({need} bytes), the data is {left} bytes; a torn or crafted "
                                 "file")


def _check_sizes(path: Path, suffix: str) -> None:
    """Every array of a ``.npy`` or ``.npz`` checked against its header before it is loaded;
    an ``.npz``'s members bounded (their declared sizes together at most
    :data:`MAX_FILE_BYTES`, each holding one array of exactly its header's size)."""
    if suffix == ".npy":
        with open(path, "rb") as f:
            check_npy_header(f, os.fstat(f.fileno()).st_size, str(path))
        return
    with zipfile.ZipFile(path) as zf:
        members = zf.infolist()
        total = sum(m.file_size for m in members)
        if total > MAX_FILE_BYTES:
            raise ValidationSetError(f"{path}: its members would unpack to {total} bytes, more "
                                     f"than the {MAX_FILE_BYTES >> 20} MiB a file may hold")
        for m in members:
            with zf.open(m) as f:
                check_npy_header(f, m.file_size, f"{path}: {m.filename!r}")


class _Single:
    """A ``.npy`` file with the ``files``/``[]`` interface of an ``.npz``."""

    def __init__(self, path: Path) -> None:
        self.array: np.ndarray = np.load(path, allow_pickle=False)
        self.files = ["arr_0"]

    def __getitem__(self, key: str) -> np.ndarray:
        return self.array

    def __enter__(self) -> _Single:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@dataclass(frozen=True)
class ReferenceComputation:
    """A way to compute reference outputs, and what to record about it."""

    name: str
    run: Callable[[Arrays], Arrays]
    method: str
    versions: dict[str, str]

    def close(self) -> None:
        """Release what the computation holds."""


def ort_reference(model: Path) -> ReferenceComputation:
    """ONNX Runtime's CPU provider with every graph optimization disabled."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise InputError("the onnxruntime-cpu reference needs onnxruntime",
                         hint="pip install onnxruntime") from exc
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.enable_mem_pattern = False
    opts.enable_cpu_mem_arena = False
    try:
        sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise ModelError(f"ONNX Runtime cannot load {model} ({exc})") from exc
    names = [o.name for o in sess.get_outputs()]

    def run(inputs: Arrays) -> Arrays:
        try:
            values = sess.run(names, dict(inputs))
        except Exception as exc:  # noqa: BLE001
            raise ValidationSetError(f"the onnxruntime-cpu reference failed to run ({exc})") \
                from exc
        return {n: np.asarray(v) for n, v in zip(names, values)}

    return ReferenceComputation(
        ORT_REFERENCE, run,
        "ONNX Runtime CPUExecutionProvider, graph optimizations disabled (ORT_DISABLE_ALL), "
        "one thread",
        {"onnxruntime": ort.__version__, "numpy": np.__version__})


def function_reference(ref: str) -> ReferenceComputation:
    """A user's ``module:function``, called with float64 inputs."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr.isidentifier():
        raise InputError(f"reference {ref!r} is neither {ORT_REFERENCE!r} nor module:function")
    cwd = os.getcwd()
    if cwd not in sys.path:  # resolve like `python -m` does
        sys.path.insert(0, cwd)
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InputError(f"cannot import the reference function {ref} ({exc})") from exc
    if not callable(fn):
        raise InputError(f"reference {ref} is not a function")

    def run(inputs: Arrays) -> Arrays:
        wide = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in inputs.items()}
        try:
            result = fn(wide)
        except Exception as exc:  # noqa: BLE001 - the user's code
            raise ValidationSetError(f"the reference function {ref} raised "
                                     f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(result, Mapping):
            raise ValidationSetError(f"the reference function {ref} returned a "
                                     f"{type(result).__name__}, not a dict of output name -> "
                                     "array")
        out = {}
        for k, v in result.items():
            arr = np.asarray(v)
            out[str(k)] = arr.astype(np.float64) if arr.dtype.kind == "f" else arr
        return out

    return ReferenceComputation(ref, run, f"Python function {ref}, float64 inputs and outputs",
                                {"numpy": np.__version__, **_framework_versions()})


FRAMEWORKS = ("torch", "jax", "tensorflow", "scipy", "onnxruntime")
"""Libraries a reference function may compute with: the version of each one loaded in the
process that computes the references (the function's module imported them, or dossier did)
is recorded beside numpy's."""


def _framework_versions() -> dict[str, str]:
    import sys

    return {name: str(getattr(sys.modules[name], "__version__", "unknown"))
            for name in FRAMEWORKS if name in sys.modules}


def reference_computation(name: str, model: Path | None) -> ReferenceComputation:
    """``onnxruntime-cpu`` (needs ``model``) or ``module:function``."""
    if name == ORT_REFERENCE:
        if model is None:
            raise InputError(f"the {ORT_REFERENCE} reference runs the model: give --model")
        return ort_reference(model)
    return function_reference(name)


def create_set(out: Path, inputs: Sequence[Path], *, model: Path | None = None,
               references: Sequence[Path] = (), reference: str | None = None) -> ValidationSet:
    """Write a validation set to the new folder ``out``: one pair per inputs file, its
    references from the matching ``references`` file or computed by ``reference``.

    With ``model`` (an ONNX file), names, dtypes and shapes are checked against it before
    anything is written. The set is staged beside ``out`` and renamed into place, so a failure
    leaves nothing. Raises OutputError when ``out`` exists.
    """
    out = Path(out)
    if out.exists():
        raise OutputError(f"{out} exists already", hint="choose a new folder for the set")
    if not inputs:
        raise InputError("give at least one inputs file (--inputs)")
    if bool(references) == bool(reference):
        raise InputError("give either a references file per inputs file (--references) or a "
                         "reference computation (--reference)")
    sig = onnx_signature(model) if model is not None else None
    one_in = sig.inputs[0].name if sig and len(sig.inputs) == 1 else None
    one_out = sig.outputs[0].name if sig and len(sig.outputs) == 1 else None
    feeds: list[tuple[str, Arrays]] = []
    for f in inputs:
        for x in read_pairs(f, one_in):
            feeds.append((f"pair {len(feeds)} ({Path(f).name})", x))
    supplied = [r for f in references for r in read_reference_pairs(f, one_out)]
    if references and len(supplied) != len(feeds):
        raise InputError(f"{len(feeds)} pair(s) of inputs but {len(supplied)} pair(s) of "
                         f"references (from {len(references)} --references file(s) or "
                         "folder(s)): give the references of every pair, in the same order")
    comp = reference_computation(reference, model) if reference else None
    pairs: list[tuple[Arrays, Arrays]] = []
    for i, (where, x) in enumerate(feeds):
        if sig is not None:
            sig.check_inputs(where, x)
        refs = comp.run(x) if comp else supplied[i]
        _check(where, x, refs, sig)
        pairs.append((x, refs))
    provenance = {
        "method": comp.method if comp else "supplied by the user as NumPy files",
        "reference": comp.name if comp else "files",
        "versions": comp.versions if comp else {},
        "model": _identity(model) if model is not None else None,
        "inputs": [_identity(Path(f)) for f in inputs],
        "references": [_identity(Path(f)) for f in references],
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "tool": "dossier validation create",
        "pairs": [{"name": f"pair-{i:03d}",
                   "inputs": {k: [str(v.dtype), list(v.shape)] for k, v in x.items()},
                   "references": {k: [str(v.dtype), list(v.shape)] for k, v in r.items()}}
                  for i, (x, r) in enumerate(pairs)],
    }
    def fill(stage: Path) -> None:
        for i, (x, refs) in enumerate(pairs):
            pair = stage / f"pair-{i:03d}"
            pair.mkdir()
            write_tensors(pair / "inputs.arrow", x)
            write_tensors(pair / "references.arrow", refs)
        (stage / PROVENANCE).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")

    write_new_folder(out, fill, "validation set")
    return load_validation_set(out)


def _identity(path: Path) -> dict[str, object] | list[dict[str, object]]:
    """A file's name, size and digest; a Polygraphy folder's: those of each of its files."""
    if Path(path).is_dir():
        return [_identity(f) for f in _iteration_files(Path(path))]  # type: ignore[misc]
    digest, size = digest_file(Path(path))
    # the name only: the set ships inside bundles, and the tuning host's folders are its own
    return {"file": Path(path).name, "size": size, "xxh3_128": digest}


def _check(where: str, inputs: Arrays, refs: Arrays, sig: ModelSignature | None) -> None:
    for name, arr in refs.items():
        if arr.size == 0:
            raise ValidationSetError(f"{where}: reference {name!r} has shape "
                                     f"{tuple(arr.shape)}: it holds no element")
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
            raise ValidationSetError(f"{where}: reference {name!r} holds NaN or Inf")
    if sig is not None:
        sig.check_pair(where, inputs, refs)


@dataclass(frozen=True)
class SetSummary:
    """What ``dossier validation show`` prints."""

    path: str
    digest: str
    pairs: list[dict[str, object]]
    provenance: dict[str, object]


def summarize_set(path: Path) -> SetSummary:
    """The pairs of a set with every tensor's dtype and shape, and its provenance."""
    vset = load_validation_set(path)
    pairs: list[dict[str, object]] = [
        {"name": p.name,
         "inputs": {k: [str(v.dtype), list(v.shape)] for k, v in p.inputs.items()},
         "references": {k: [str(v.dtype), list(v.shape)] for k, v in p.references.items()}}
        for p in vset.pairs]
    return SetSummary(str(vset.path), vset.digest(), pairs, vset.provenance)
