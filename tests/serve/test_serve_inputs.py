"""Inputs to a loaded engine (``Engine.__call__``, ``dossier run -i``, ``read_inputs`` of
``dossier/npz.py``): arrays of the other byte order give the same outputs, a single ``.npy``
is read for a one-input engine, and a crafted ``.npy`` or ``.npz`` (a header claiming 2**40
rows, deep nesting, a truncated or pickled array, a zip bomb), a wrong shape or a ragged list
is one line and exit 3, or dossier's own exception.

Every case here failed before its fix except the guards named in docs/reliability.md; the
docstrings say how."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from pathlib import Path

import _bundles as h
import numpy as np
import pytest
from _hostile import _pair

import dossier
from dossier.errors import EngineFailedError, ExitCode, InputError


def test_inputs_of_the_other_byte_order_give_the_same_outputs(bundle: Path, host: Path,
                                                              tmp_path: Path) -> None:
    """Before: ``>f4`` inputs gave NaN or garbage outputs, exit 0 (Engine.__call__, run -i)."""
    engine = dossier.load(bundle, host=host)
    pair = _pair(bundle)
    x = pair.inputs["x"]
    swapped = x.astype(x.dtype.newbyteorder(">"))
    np.testing.assert_array_equal(engine(x=swapped)["logits"], engine(x=x)["logits"])
    np.savez(tmp_path / "big.npz", x=swapped)
    res = h.cli("run", bundle, "--host-fingerprint", host, "-i", tmp_path / "big.npz", "--check")
    assert res.exit_code == 0, h.said(res)


def test_a_dict_of_native_arrays_takes_the_short_path_and_keeps_every_check(
        bundle: Path, host: Path) -> None:
    """``engine({"x": x})`` (the common call) runs the runner's native call with the feed
    checked in fewer steps (a served call of tens of microseconds on the CPU pays for every
    step); what it returns and refuses is what the other forms return and refuse."""
    import threading
    import types

    engine = dossier.load(bundle, host=host)
    assert engine._fast is not None  # an ONNX Runtime engine has the short path
    x = _pair(bundle).inputs["x"]
    want = engine(x=x)["logits"]  # keywords: the checked path
    assert engine({"x": x}).keys() == {"logits"}
    np.testing.assert_array_equal(engine({"x": x})["logits"], want)
    np.testing.assert_array_equal(engine(types.MappingProxyType({"x": x}))["logits"], want)
    swapped = x.astype(x.dtype.newbyteorder(">"))  # other byte order: converted first
    np.testing.assert_array_equal(engine({"x": swapped})["logits"], want)
    with pytest.raises(InputError, match=r"unknown \['y'\]"):  # the runtime refuses it first
        engine({"x": x, "y": x})
    with pytest.raises(InputError, match=r"missing \['x'\]"):
        engine({})
    with pytest.raises(InputError, match=r"missing \['x'\]; unknown \['y'\]"):
        engine({"y": x})
    with pytest.raises(InputError, match="refused the inputs"):
        engine({"x": x[..., :5]})  # a fixed dimension no pair has: the runtime refuses it
    got: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: got.extend(
        engine({"x": x})["logits"] for _ in range(20))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 80 and all(np.array_equal(g, want) for g in got)
    engine.close()
    with pytest.raises(EngineFailedError, match="released"):
        engine({"x": x})


def test_run_reads_a_single_npy_for_a_one_input_engine(bundle: Path, host: Path,
                                                       tmp_path: Path) -> None:
    """Before: ``run -i x.npy`` was exit 70 with a traceback."""
    np.save(tmp_path / "x.npy", _pair(bundle).inputs["x"])
    res = h.cli("run", bundle, "--host-fingerprint", host, "-i", tmp_path / "x.npy", "--check")
    assert res.exit_code == 0, h.said(res)
    from dossier.npz import read_inputs

    with pytest.raises(InputError, match="single .npy array; this engine takes 2 inputs"):
        read_inputs(tmp_path / "x.npy", ["a", "b"])


def _npz(path: Path, members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue()


def _nested_header(depth: int) -> bytes:
    text = "{'descr': '<f4', 'fortran_order': False, 'shape': " + "(" * depth + ")" * depth \
        + ", }"
    text += " " * (63 - (len(text) + 10) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode()


CRAFTED: dict[str, Callable[[Path], Path | str]] = {
    "an empty path": lambda tmp: "",
    "a member claiming 2**40 rows": lambda tmp: _npz(tmp / "rows.npz",
                                                     {"x.npy": _header((2**40, 3, 32, 32))}),
    "5000 nested brackets": lambda tmp: _npz(tmp / "nested.npz", {"x.npy": _nested_header(5000)}),
    "a .npy of 5000 nested brackets": lambda tmp: _write(tmp / "nested.npy",
                                                         _nested_header(5000)),
    "a truncated array": lambda tmp: _npz(tmp / "short.npz",
                                          {"x.npy": _header((1, 3, 32, 32)) + b"\0" * 10}),
    "a pickled object array": lambda tmp: _npz(tmp / "obj.npz", {"x.npy": _header((1,), "|O")}),
    "not a zip": lambda tmp: _write(tmp / "junk.npz", b"PK\x03\x04 junk"),
    "a folder": lambda tmp: tmp,
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", list(CRAFTED), ids=list(CRAFTED))
def test_a_crafted_inputs_file_gets_one_line_and_exit_3(bundle: Path, host: Path,
                                                        tmp_path: Path, case: str) -> None:
    """Before: an empty path, an .npz member whose header claims 2**40 rows, headers of 5000
    nested brackets: exit 70 with a traceback."""
    path = CRAFTED[case](tmp_path)
    res = h.cli("run", bundle, "--host-fingerprint", host, "-i", path)
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    assert "Traceback" not in h.said(res) and "error:" in res.stderr


def test_an_npz_bomb_is_refused_before_it_is_unpacked(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the cap was on the compressed size: a 1 MB .npz of 1 GiB of zeros was unpacked
    whole. The cap here is lowered to 1 MiB; the file holds 4 MiB of zeros."""
    import dossier.npz as npz

    monkeypatch.setattr(npz, "UNPACKED_MAX_BYTES", 1 << 20)
    buf = io.BytesIO()
    np.save(buf, np.zeros((1 << 20,), np.float32))
    path = _npz(tmp_path / "bomb.npz", {"x.npy": buf.getvalue()})
    assert path.stat().st_size < 64 << 10
    with pytest.raises(InputError, match="unpacks to"):
        npz.read_inputs(path)


def test_a_wrong_shape_is_exit_3_with_the_runtimes_whole_message(bundle: Path, host: Path,
                                                                  tmp_path: Path) -> None:
    """Before: exit 11 (the INVALID-host code) with the runtime's message cut after its
    first line."""
    np.savez(tmp_path / "wrong.npz", x=np.zeros((1, 3, 16, 16), np.float32))
    res = h.cli("run", bundle, "--host-fingerprint", host, "-i", tmp_path / "wrong.npz")
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    engine = dossier.load(bundle, host=host)
    with pytest.raises(InputError) as exc:
        engine(x=np.zeros((1, 3, 16, 16), np.float32))
    native = exc.value.__cause__.__cause__  # type: ignore[union-attr]
    lines = str(native).strip().splitlines()
    assert len(lines) > 1 and all(x.strip() in str(exc.value) for x in lines), str(exc.value)


def test_no_exception_but_dossiers_leaves_a_call(bundle: Path, host: Path) -> None:
    """Before: a ragged list or an object went through as numpy's or the runtime's own
    exception (the docs promise InputError or EngineFailedError)."""
    engine = dossier.load(bundle, host=host)
    for bad in ([[1.0], [1.0, 2.0]], object(), "text"):
        with pytest.raises((InputError, EngineFailedError)):
            engine(x=bad)
