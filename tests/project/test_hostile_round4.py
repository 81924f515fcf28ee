"""The fourth round of hostile inputs (docs/reliability.md): no test backend reachable from a
bundle or an installed dossier, every route read back checked against this host's knob
database and thread bound, ``verify --recheck`` bounded in time, the budget search's journal,
the hold-out records and a bundle's tuning cache read like untrusted data, and the leftovers
of the third round (inputs that are no arrays, empty sources, over-long set paths, a nested
``.npy`` header). Every case failed before its fix; the docstrings say how."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import _bundles as h
import numpy as np
import pytest
import tomllib
from _hostile import _pair
from conftest import REPO, dossier_command

import dossier
from dossier.errors import ExitCode, InputError, InvalidHostError


# ------------------------------------------------------------------ 1. test backends
def test_the_package_declares_no_test_backend() -> None:
    """Before: pyproject.toml registered ``faulty`` and ``landscape`` under dossier.backends,
    and their code was part of the dossier package."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    declared = project["project"]["entry-points"]["dossier.backends"]
    assert set(declared) == {"onnxruntime", "torch-inductor", "tensorrt"}
    assert not (REPO / "dossier" / "backends" / "faulty").exists()
    assert not (REPO / "dossier" / "backends" / "landscape").exists()


def test_outside_the_test_suite_no_test_backend_is_served(tmp_path: Path) -> None:
    """Before: ``dossier knobs --backend faulty`` listed the fault knobs from any installed
    dossier. A process without tests/plugins on its path gets one line and no traceback
    (exit 5 where an old install still lists the name, exit 3 where nothing does)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(REPO)
    run = subprocess.run(dossier_command("knobs", "--backend", "faulty"), env=env,
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode in (ExitCode.INPUT, ExitCode.BACKEND_UNAVAILABLE), run.stderr
    assert "Traceback" not in run.stderr and "fault" not in run.stdout
    assert [ln for ln in run.stderr.splitlines() if ln.startswith("error:")]


def _resealed(bundle: Path, backend: str | None = None, route: str | None = None) -> Path:
    def edit(m: dict) -> None:  # type: ignore[type-arg]
        if backend is not None:
            m["backend"] = backend
        if route is not None:
            m["engines"]["shipped"]["route"] = route
    h.reseal(bundle, edit)
    return bundle


@pytest.mark.parametrize("name", ["faulty", "no-such-backend"])
def test_a_bundle_naming_a_backend_not_shipped_is_invalid(bundle: Path, host: Path,
                                                          tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          name: str) -> None:
    """Before: a resealed bundle with ``backend = "faulty"`` and a route ``-fault=kill_worker``
    verified VALID, and ``dossier.load`` SIGKILLed its caller's parent after writing a marker
    into the current folder; an unknown backend was exit 3 (no policy)."""
    _resealed(bundle, name, "-fault=kill_worker -graph_optimization_level=all")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DOSSIER_FAULT_DIR", str(tmp_path))
    res = h.cli("verify", bundle, "--host-fingerprint", host)
    assert res.exit_code == ExitCode.INVALID, h.said(res)
    assert "not a shipped backend" in res.stdout
    with pytest.raises(InvalidHostError, match="not a shipped backend"):
        dossier.load(bundle, host=host)
    res = h.cli("verify", bundle, "--host-fingerprint", host, "--recheck", "--json")
    assert res.exit_code == ExitCode.INVALID
    steps = {s["name"]: s for s in json.loads(res.stdout)["steps"]}
    assert steps["recheck"]["outcome"] == "skipped"
    assert not list(tmp_path.glob("killed-*"))  # nothing of the engine was loaded


# ---------------------------------------------------------- 2. numbers read back, bounded
@pytest.mark.parametrize("route, why", [
    ("-graph_optimization_level=all -intra_op_num_threads=100000", "thread count may be at most"),
    ("-graph_optimization_level=all -inter_op_num_threads=2000", "thread count may be at most"),
    ("-graph_optimization_level=all -intra_op_num_threads=many", "not a thread count"),
    ("-graph_optimization_level=all -nosuch=1", "unknown knob -nosuch"),
    ("-graph_optimization_level=turbo", "not allowed for -graph_optimization_level"),
])
def test_a_route_read_back_is_checked_before_anything_loads(bundle: Path, host: Path,
                                                            route: str, why: str) -> None:
    """Before: a route asking for 100000 threads verified VALID and hung ``run``, ``load``
    and ``verify --recheck`` until killed (2000 threads: 38-161 s per load)."""
    _resealed(bundle, route=route)
    res = h.cli("verify", bundle, "--host-fingerprint", host, "--recheck", "--json")
    assert res.exit_code == ExitCode.INVALID, h.said(res)
    report = json.loads(res.stdout)
    assert any(why in r for r in report["reasons"]), report["reasons"]
    assert {s["name"]: s["outcome"] for s in report["steps"]}["recheck"] == "skipped"
    with pytest.raises(InvalidHostError, match="engines.shipped.route: .* -> refused: "):
        dossier.load(bundle, host=host)


def test_the_thread_bound_is_a_multiple_of_this_hosts_cores() -> None:
    from dossier.backends import get_backend
    from dossier.backends.interface import THREADS_PER_CORE, max_threads
    from dossier.errors import SelectionError

    limit = max_threads()
    assert limit == THREADS_PER_CORE * len(os.sched_getaffinity(0))
    ort = get_backend("onnxruntime")
    assert ort.check_recorded_route(f"-intra_op_num_threads={limit}").as_dict() == {
        "intra_op_num_threads": str(limit)}
    with pytest.raises(SelectionError, match="may be at most"):
        ort.check_recorded_route(f"-intra_op_num_threads={limit + 1}")


def test_routes_of_every_backend_are_checked_and_the_check_imports_no_runtime() -> None:
    """ONNX Runtime's and AOTInductor's routes are checked against the knobs they know
    without their library, so that ``verify`` still imports no runtime (``torch``: seconds)."""
    code = (
        "import sys\n"
        "from dossier.backends import get_backend\n"
        "from dossier.errors import SelectionError\n"
        "for name, good, bad in (\n"
        "    ('torch-inductor', '-device=cpu -inductor:cpp.threads=2', "
        "'-inductor:cpp.threads=100000'),\n"
        "    ('torch-inductor', '-dtype=float32', '-dtype=float128'),\n"
        "    ('onnxruntime', '-optimizer:ConvBNFusion=off', '-optimizer:ConvBNFusion=maybe')):\n"
        "    b = get_backend(name)\n"
        "    assert not b.route_check_imports\n"
        "    b.check_recorded_route(good)\n"
        "    try:\n"
        "        b.check_recorded_route(bad)\n"
        "    except SelectionError:\n"
        "        pass\n"
        "    else:\n"
        "        raise AssertionError(bad)\n"
        "loaded = [m for m in ('torch', 'onnxruntime') if m in sys.modules]\n"
        "assert not loaded, loaded\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr


def test_the_thread_bound_is_the_judged_hosts(bundle: Path, host: Path) -> None:
    """With ``--host-fingerprint``, the bound is 8 per logical CPU of the host judged."""
    _resealed(bundle, route="-graph_optimization_level=all -intra_op_num_threads=16")
    found = {}
    for cores in (1, 4):
        fp = json.loads(host.read_text())
        fp["cpu"]["cores"] = cores
        host.write_text(json.dumps(fp))
        res = h.cli("verify", bundle, "--host-fingerprint", host, "--json")
        found[cores] = any("thread count" in r for r in json.loads(res.stdout)["reasons"])
    assert found == {1: True, 4: False}


def test_recheck_has_a_time_limit_of_its_own(bundle: Path, host: Path) -> None:
    """Before: a re-check had the bundle's own trial timeout (a week, in a crafted header) and
    no option to bound it."""
    res = h.cli("verify", bundle, "--host-fingerprint", host, "--recheck",
                "--recheck-max-s", "0.01")
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    assert "--recheck did not finish" in h.said(res) and "--recheck-max-s" in h.said(res)
    assert h.cli("verify", bundle, "--recheck-max-s", "5").exit_code == ExitCode.USAGE
    assert h.cli("verify", bundle, "--recheck", "--recheck-max-s", "nan",
                 "--host-fingerprint", host).exit_code == ExitCode.INPUT


# ------------------------------------------------------------------ 6 + #56.10: inputs
def test_float64_object_and_complex_inputs_are_input_errors(bundle: Path, host: Path,
                                                            tmp_path: Path) -> None:
    """Before: float64 inputs were EngineFailedError from ``dossier.load``'s engine and exit 11
    (the INVALID-host code) from ``dossier run -i``; a list was cast to float64 the same way."""
    engine = dossier.load(bundle, host=host)
    x = _pair(bundle).inputs["x"]
    wrongs = ((x.astype(np.float64), "float64"), (x.astype(np.complex64), "complex64"),
              (x.tolist(), "float64"))
    for wrong, dtype in wrongs:
        for feed, named in (({"x": wrong}, {}), (None, {"x": wrong})):
            with pytest.raises(InputError, match=f"input 'x' is {dtype}; the engine takes "
                                                 r"float32 \(cast it\)"):
                engine(feed, **named)
    with pytest.raises(InputError, match="input 'x' is object; the engine takes float32"):
        engine(x=x.astype(object))
    np.savez(tmp_path / "f64.npz", x=x.astype(np.float64))
    res = h.cli("run", bundle, "--host-fingerprint", host, "-i", tmp_path / "f64.npz")
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    assert "input 'x' is float64; the engine takes float32 (cast it)" in h.said(res)


class _Raises:
    def __array__(self, *a: object, **k: object) -> np.ndarray:
        raise RuntimeError("no array here")


def test_feeds_that_are_no_mapping_or_no_array_are_one_line(bundle: Path, host: Path) -> None:
    """Before: ``engine([x])`` and ``engine((x,))`` raised AttributeError; an input whose
    ``__array__`` raises raised that exception."""
    engine = dossier.load(bundle, host=host)
    x = _pair(bundle).inputs["x"]
    for feed in ([x], (x,)):
        with pytest.raises(InputError, match="named inputs, a dict of name to array, not a"):
            engine(feed)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="input 'x' cannot be read as an array: "
                                         "RuntimeError: no array here"):
        engine(x=_Raises())


def test_an_empty_source_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: ``dossier.load("")`` raised ValueError ("PosixPath('.') has an empty name") and
    ``dossier run ""`` ended the same way (exit 70)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="no bundle given"):
        dossier.load("")
    res = h.cli("run", "")
    assert res.exit_code == ExitCode.INPUT and "no bundle given" in h.said(res)


# ------------------------------------------------------- 5. a bundle's tuning cache, streamed
@pytest.mark.parametrize("tail", [b"\0" * 4096, b'{"kind": "session"'],
                         ids=["nul-tail", "torn-line"])
def test_a_bundle_refuses_anything_after_its_last_record(bundle: Path, tail: bytes) -> None:
    """Before: a tail of NUL bytes (1-3 GiB in the attack) after a bundle's last record was
    accepted silently, as a torn write of a search in progress."""
    from dossier.bundle import open_bundle
    from dossier.errors import CacheMismatchError

    with open(bundle / "tuning-cache.jsonl", "ab") as f:
        f.write(tail)
    h.reseal(bundle)
    with open_bundle(bundle) as b, pytest.raises(CacheMismatchError,
                                                 match="bytes after its last record"):
        b.tuning_cache()
    res = h.cli("explain", bundle)
    assert res.exit_code == ExitCode.TUNE or res.exit_code == ExitCode.INPUT, h.said(res)
    assert "after its last record" in h.said(res)


def test_the_tuning_cache_is_read_within_its_limits(bundle: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the whole file was read at once (a 77 MB cache took 1.6 GB of memory), with no
    bound on a line, the lines or the size; a FIFO in its place blocked."""
    from dossier import cache
    from dossier.errors import CacheMismatchError

    path = tmp_path / "tuning-cache.jsonl"
    original = (bundle / "tuning-cache.jsonl").read_bytes()
    lines = original.splitlines(keepends=True)
    path.write_bytes(original)
    assert len(cache.TuningCache.open(path, whole=True).records) == len(lines) - 1
    monkeypatch.setattr(cache, "CACHE_MAX_LINE", max(map(len, lines)) - 2)
    with pytest.raises(CacheMismatchError, match="is longer than"):
        cache.TuningCache.open(path)
    monkeypatch.undo()
    monkeypatch.setattr(cache, "CACHE_MAX_LINES", len(lines) - 1)
    with pytest.raises(CacheMismatchError, match=f"more than {len(lines) - 1} lines"):
        cache.TuningCache.open(path)
    monkeypatch.setattr(cache, "CACHE_MAX_BYTES", len(original) - 1)
    with pytest.raises(CacheMismatchError, match="more than the"):
        cache.TuningCache.open(path)
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(CacheMismatchError, match="not a regular file"):
        cache.TuningCache.open(fifo)


# ------------------------------------------------------------ 3. the budget search's journal
def _budget(tmp_path: Path):  # type: ignore[no-untyped-def]
    import test_budget as tb

    from dossier.strategies.budget import BudgetStrategy
    from dossier.strategies.spend import Limits

    space = tb.replay.landscape_space(6, 0.01, 0)

    def walk() -> list[str]:
        s = BudgetStrategy(Limits(max_builds=8), seed=1)
        s.open(tmp_path)
        return tb._walk(space, s, {})  # type: ignore[no-any-return]
    return space, walk


@pytest.mark.parametrize("make, why", [
    (lambda p, out: p.symlink_to(out), "symbolic link"),
    (lambda p, out: os.mkfifo(p), "not a regular file"),
    (lambda p, out: p.mkdir(), "not a regular file"),
    (lambda p, out: p.write_bytes(b'{"op_code": 99, "worker_id": "w"}\n'),
     "line 1 is not a journal operation"),
    (lambda p, out: p.write_bytes(b'{"op_code": 0, "worker_id": "w", "study_name": "search", '
                                  b'"directions": [2]}\n' + b"[" * 100_000 + b"\n"),
     "line 2 is not JSON"),
    (lambda p, out: p.write_bytes(b'{"op_code": 0, "worker_id": "w", "study_name": 7}\n'),
     "Optuna cannot replay it"),
], ids=["symlink", "fifo", "folder", "unknown-op", "deep-nesting", "wrong-types"])
def test_a_journal_that_is_no_journal_is_refused_and_the_run_resumes(
        tmp_path: Path, make, why: str) -> None:  # type: ignore[no-untyped-def]
    """Before: a symbolic link got the file it names truncated and written, a FIFO hung
    ``--continue``, a folder, an unknown operation, deep nesting or wrong types were
    tracebacks (exit 70), and the run folder was refused from then on."""
    from dossier.errors import TuneError
    from dossier.strategies.budget import STUDY_NAME

    outside = tmp_path / "outside.txt"
    outside.write_text("not the journal's\n")
    run = tmp_path / "run"
    run.mkdir()
    _, walk = _budget(run)
    make(run / STUDY_NAME, outside)
    with pytest.raises(TuneError, match=why) as err:
        walk()
    assert err.value.exit_code == ExitCode.TUNE and "set aside as" in str(err.value)
    assert outside.read_text() == "not the journal's\n"
    assert len(walk()) == 7  # resumed: a new study, from the trials recorded
    assert outside.read_text() == "not the journal's\n"


@pytest.mark.parametrize("how", ["told", "enqueued"])
def test_a_journal_proposing_a_route_outside_the_selection_is_refused(tmp_path: Path,
                                                                      how: str) -> None:
    """Before: one crafted line made ``--continue`` build and time a route outside the
    selection (a 100000-thread value hung it for 300 s), then crash with exit 70."""
    import optuna

    from dossier.errors import TuneError
    from dossier.strategies.budget import STUDY_NAME, BudgetStrategy

    space, walk = _budget(tmp_path)
    knob = space.selection.varied[0].knob
    study = BudgetStrategy.open_study(tmp_path / STUDY_NAME)
    if how == "told":
        study.add_trial(optuna.trial.create_trial(
            params={knob: "100000"}, value=1.0,
            distributions={knob: optuna.distributions.CategoricalDistribution(["100000"])}))
    else:
        study.enqueue_trial({knob: "100000"})
    with pytest.raises(TuneError, match=f"trial 0: -{knob}=100000 is not a value of the "
                                        "selection"):
        walk()
    assert len(walk()) == 7


# ----------------------------------------------------------- 4. hold-out records on resume
@pytest.fixture(scope="module")
def held_run(samples_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A search with a hold-out set (the faulty backend's known gain on the tblock sample),
    run once: its run folder."""
    from test_datasets import _known_gain_spec

    from dossier.tuner import tune

    root = tmp_path_factory.mktemp("held")
    res = tune(_known_gain_spec(samples_dir, root), root / "run")
    assert res.cache.holdouts and res.decision is not None
    return root / "run"


def _flipped(held_run: Path, tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    """A copy of ``held_run`` killed after its hold-out records (no decision), the last
    hold-out record edited by ``edit(record_dict)``; its tuning cache."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(held_run, run, symlinks=True)
    lines = (run / "tuning-cache.jsonl").read_text().splitlines()
    records = [json.loads(ln) for ln in lines]
    at = max(i for i, r in enumerate(records) if r.get("kind") == "holdout")
    edit(records[at])
    kept = [json.dumps(r) if i == at else ln for i, (ln, r) in enumerate(zip(lines, records))
            if r.get("kind") != "decision"]
    (run / "tuning-cache.jsonl").write_text("\n".join(kept) + "\n")
    return run / "tuning-cache.jsonl"


def _over(r: dict) -> None:  # type: ignore[type-arg]
    pair = sorted(r["losses"])[0]
    out = sorted(r["losses"][pair])[0]
    r["losses"][pair][out] = 0.0012  # the threshold is 0.001: flipped while it fails
    r["worst_loss"], r["passed"], r["reason"] = 0.0012, True, None


@pytest.mark.parametrize("edit, why", [
    (_over, "is marked passed with a cos loss of 0.0012, not below the threshold 0.001"),
    (lambda r: r.update(passed=False, reason="crafted"), "is marked failed with every cos loss"),
    (lambda r: r.update(worst_loss=1e-9), "the largest of its losses is"),
    (lambda r: r.update(pairs=2), "counts 2 pairs; the header's hold-out set has 3"),
    (lambda r: r.update(losses=None, worst_loss=None), "is marked passed with no losses"),
], ids=["passed-over-threshold", "failed-below", "worst", "pairs", "no-losses"])
def test_a_hold_out_record_that_contradicts_itself_is_refused_on_resume(
        held_run: Path, tmp_path: Path, edit, why: str) -> None:  # type: ignore[no-untyped-def]
    """Before: a record flipped to ``passed`` with its own loss (0.0012) above the threshold
    (0.001) was taken on ``--continue``: the failing route shipped, ``explain`` said passed."""
    from dossier.errors import TuneError
    from dossier.tuner import continue_tune

    cache = _flipped(held_run, tmp_path, edit)
    with pytest.raises(TuneError, match=why) as err:
        continue_tune(cache)
    assert err.value.exit_code == ExitCode.TUNE and " line " in str(err.value)


def test_a_consistent_hold_out_record_still_resumes(held_run: Path, tmp_path: Path) -> None:
    """Guard: killed after its hold-out records, an untouched run resumes and takes them."""
    from dossier.tuner import continue_tune

    cache = _flipped(held_run, tmp_path, lambda r: None)
    res = continue_tune(cache)
    assert res.decision is not None and res.decision.holdout is not None
    recorded = sum(json.loads(ln).get("kind") == "holdout"
                   for ln in (held_run / "tuning-cache.jsonl").read_text().splitlines())
    assert recorded and len(res.cache.holdouts) == recorded  # none re-run


# ------------------------------------------------------------------ 6. the leftovers
@pytest.mark.parametrize("section", ["validation", "calibration", "holdout"])
def test_a_data_set_path_longer_than_name_max_is_one_line(convnet_folder: Path,
                                                          section: str) -> None:
    """Before: ``[validation]``, ``[calibration]`` or ``[holdout]`` naming a path of 300
    characters ended in OSError (File name too long), exit 70."""
    from conftest import tiny_spec

    long = "v" * 300
    extra = "" if section == "validation" else f'\n[{section}]\npath = "{long}"\n'
    spec = tiny_spec(convnet_folder, extra=extra)
    if section == "validation":
        spec.write_text(spec.read_text().replace('path = "validation"', f'path = "{long}"'))
    res = h.cli("tune", spec, "--out", convnet_folder / "run", "--dry-run")
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    named = {"validation": "validation set", "calibration": "calibration set",
             "holdout": "hold-out set"}[section]
    assert f"error: {named} " in res.stderr and "File name too long" in h.said(res)
    assert not (convnet_folder / "run").exists()


def _npy(header: bytes) -> bytes:
    header += b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header


def test_validation_create_of_an_unbalanced_npy_header_is_one_line(tmp_path: Path) -> None:
    """Before: a ``.npy`` header of unclosed brackets made ``validation create`` exit 70 with
    numpy's tokenize.TokenError."""
    bad = tmp_path / "x.npy"
    bad.write_bytes(_npy(b"{'descr': '<f4', 'fortran_order': False, 'shape': " + b"(" * 200
                         + b", }"))
    np.save(tmp_path / "ref.npy", np.zeros((1, 10), np.float32))
    res = h.cli("validation", "create", tmp_path / "set", "-i", bad, "-r", tmp_path / "ref.npy")
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    assert "x.npy: not a readable NumPy file (its header does not parse" in h.said(res)
    assert not (tmp_path / "set").exists()
