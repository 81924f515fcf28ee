"""What ``dossier.load`` (and ``verify``'s later steps) use is what was checked: another
process on the host that swaps, relinks or rewrites a bundle folder's files after the checks
(or while they run) changes nothing of what is loaded or judged.

The forged engine has the shipped engine's inputs and outputs but other numbers; a load that
served it would return them."""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _bundles as h
import numpy as np
import pytest
from _figures import figures

import dossier
import dossier.serve as serve
from dossier.errors import DossierError
from dossier.verify.policy import Verdict

ENGINE = "engine/convnet.ort"


@pytest.fixture
def signed(tmp_path: Path) -> dict[str, Any]:
    """A signed copy of the golden bundle, its key, its tuning host's fingerprint (VALID
    here), the shipped engine's outputs on the first pair, and a forged engine."""
    from dossier.trust.signing import generate_key_pair, sign_bundle
    from dossier.validation import load_validation_set

    bundle = h.copy_bundle(h.GOLDEN, tmp_path / "release")
    keys = generate_key_pair(tmp_path / "keys", "release")
    sign_bundle(bundle, keys.private)
    host = tmp_path / "host.json"
    host.write_bytes((bundle / "fingerprint.json").read_bytes())
    pair = load_validation_set(bundle / "validation").pairs[0]
    good = dossier.load(bundle, require_signature=True, trusted_key=keys.public, host=host)
    return {"bundle": bundle, "key": keys.public, "host": host, "inputs": pair.inputs,
            "outputs": good(pair.inputs)["logits"], "forged": _forged(tmp_path / "forged")}


def _forged(folder: Path) -> Path:
    """An ORT-format engine x[N,3,32,32] -> logits[N,10] that is not the shipped one."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    folder.mkdir()
    consts = [helper.make_tensor(n, TensorProto.INT64, [1], [v])
              for n, v in (("start", 0), ("end", 10), ("axis", 1))]
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["x"], ["flat"], axis=1),
         helper.make_node("Slice", ["flat", "start", "end", "axis"], ["logits"])],
        "forged", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, folder / "forged.onnx")
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(folder / "convnet.ort")
    so.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(str(folder / "forged.onnx"), so, providers=["CPUExecutionProvider"])
    return folder / "convnet.ort"


@pytest.fixture
def after_checks(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[], None]], None]:
    """Run an action right after the checks and the verdict, before the engine is loaded."""

    def install(action: Callable[[], None]) -> None:
        judge = serve._apply_verdict

        def judged(*args: Any) -> None:
            action()
            judge(*args)

        monkeypatch.setattr(serve, "_apply_verdict", judged)

    return install


def _load(s: dict[str, Any]) -> Any:
    return dossier.load(s["bundle"], require_signature=True, trusted_key=s["key"], host=s["host"])


def _served(s: dict[str, Any]) -> np.ndarray:
    return np.asarray(_load(s)(s["inputs"])["logits"])


def test_an_engine_swapped_after_the_checks_is_not_served(
        signed: dict[str, Any], after_checks: Callable[[Callable[[], None]], None]) -> None:
    target = signed["bundle"] / ENGINE
    spare = signed["forged"].with_name("spare")
    shutil.copyfile(signed["forged"], spare)
    after_checks(lambda: os.replace(spare, target))
    np.testing.assert_array_equal(_served(signed), signed["outputs"])
    assert target.read_bytes() == signed["forged"].read_bytes()  # the swap happened


def test_an_engine_folder_swapped_for_a_link_after_the_checks_is_not_served(
        signed: dict[str, Any], after_checks: Callable[[Callable[[], None]], None]) -> None:
    folder = signed["bundle"] / "engine"

    def relink() -> None:
        shutil.rmtree(folder)
        folder.symlink_to(signed["forged"].parent, target_is_directory=True)

    after_checks(relink)
    np.testing.assert_array_equal(_served(signed), signed["outputs"])
    assert folder.is_symlink()


def test_a_hard_linked_engine_rewritten_after_the_checks_is_not_served(
        signed: dict[str, Any], after_checks: Callable[[Callable[[], None]], None],
        tmp_path: Path) -> None:
    alias = tmp_path / "alias.ort"
    os.link(signed["bundle"] / ENGINE, alias)

    def rewrite() -> None:
        with open(alias, "r+b") as f:
            f.truncate(0)
            f.write(signed["forged"].read_bytes())

    after_checks(rewrite)
    np.testing.assert_array_equal(_served(signed), signed["outputs"])
    assert (signed["bundle"] / ENGINE).read_bytes() == signed["forged"].read_bytes()


def test_a_fingerprint_swapped_after_integrity_does_not_change_the_verdict(
        signed: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The environment step judges the fingerprint the integrity check read, in place (plain
    verify) and in a loader's private copy alike."""
    from dossier.verify.pipeline import VerifyOptions, _Run, verify

    bundle = signed["bundle"]
    other = json.loads(signed["host"].read_text())
    other["packages"]["onnxruntime"] = "1.31.1"  # an INVALID host for this bundle
    host = tmp_path / "other-host.json"
    host.write_text(json.dumps(other))
    judge = _Run._environment

    def swapped(self: _Run, b: Any) -> Any:
        (bundle / "fingerprint.json").write_text(json.dumps(other))  # now "the same host"
        return judge(self, b)

    monkeypatch.setattr(_Run, "_environment", swapped)
    options = VerifyOptions(host=host, trusted_keys=(signed["key"],), require_signature=True)
    report = verify(bundle, options)
    assert report.verdict is Verdict.INVALID, report.reasons
    (bundle / "fingerprint.json").write_bytes((h.GOLDEN / "fingerprint.json").read_bytes())
    with pytest.raises(dossier.errors.InvalidHostError):
        dossier.load(bundle, require_signature=True, trusted_key=signed["key"], host=host)


@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_the_private_copy_is_owner_only_whatever_the_umask(
        signed: dict[str, Any], tmp_path: Path, umask: int) -> None:
    """A folder copied, or an archive extracted, for a load: its temporary folder 0700, its
    files 0600, under umask 000 too."""
    from dossier.bundle import pack_bundle
    from dossier.verify import VerifyOptions, verified

    archive = pack_bundle(signed["bundle"], tmp_path / "packed")
    work = tmp_path / "work"
    work.mkdir()
    old = os.umask(umask)
    try:
        for source in (signed["bundle"], archive):
            options = VerifyOptions(host=signed["host"], extract=True, workdir=work)
            with verified(source, options) as (bundle, _):
                modes = {p: stat.S_IMODE(p.stat().st_mode)
                         for p in [bundle.path.parent, *bundle.path.rglob("*")]}
            assert modes[next(iter(modes))] == 0o700
            assert all(m & 0o077 == 0 for m in modes.values()), modes
    finally:
        os.umask(old)


def _swapping(target: Path, good: bytes, forged: bytes, stop: threading.Event) -> Iterator[int]:
    """Swap ``target`` between the good and the forged engine with atomic renames."""
    i = 0
    spare = target.with_name(".swap")
    while not stop.is_set():
        spare.write_bytes(forged if i % 2 == 0 else good)
        os.replace(spare, target)
        i += 1
        yield i


RACE_LOADS = int(os.environ.get("DOSSIER_RACE_LOADS", "25"))
"""Loads raced by the swapping writer (the reliability figure was made with 200)."""


def test_a_racing_writer_never_gets_its_engine_served(signed: dict[str, Any]) -> None:
    """A writer swaps the engine file with atomic renames (forged, good, forged ...) while the
    bundle is loaded again and again: each load is refused (a signature or integrity failure)
    or serves the signed engine, never the forged one."""
    target = signed["bundle"] / ENGINE
    good, forged = target.read_bytes(), signed["forged"].read_bytes()
    stop = threading.Event()
    swaps = [0]

    def writer() -> None:
        for n in _swapping(target, good, forged, stop):
            swaps[0] = n
            stop.wait(0.001)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    served = refused = 0
    try:
        for _ in range(RACE_LOADS):
            try:
                out = _served(signed)
            except DossierError:
                refused += 1
                continue
            np.testing.assert_array_equal(out, signed["outputs"])
            served += 1
    finally:
        stop.set()
        thread.join()
    figures("racing_writer", loads=RACE_LOADS, served_signed=served, refused=refused,
            served_forged=0, swaps=swaps[0])
    assert swaps[0] > RACE_LOADS and served + refused == RACE_LOADS
