"""The build cache: a second search takes its engines instead of rebuilding them, and every
stored entry is checked as untrusted input (tampered bytes, crafted entries, links, entry folders
others may write, FIFOs, two writers, a full disk)."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import shutil
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from dossier.build_cache import ENGINE, ENTRY, BuildCache, BuildIdentity
from dossier.errors import ExitCode, InputError
from dossier.hashing import digest_file
from dossier.tuner import tune
from dossier_cli.main import app

SELECTION = "-intra_op_num_threads=[0|1] -optimizer:NchwcTransformer=[on|off]"
"""Three routes, two builds: the threads knob is load-time (the route reuses the baseline's
engine in the run), NchwcTransformer is build-time."""


def _identity(knobs: list[tuple[str, str]] | None = None) -> BuildIdentity:
    return BuildIdentity(backend="onnxruntime", tuner_version="1.0", stack={"x": "1"},
                         host={"cpu": "c"}, model_digest="0" * 32,
                         build_knobs=knobs or [("k", "v")], engine_suffix=".ort")


def _engine(tmp_path: Path, data: bytes = b"engine bytes " * 100) -> Path:
    """A new engine file, as a build makes one (never written over the last one: the cache may
    hold that file under a second name)."""
    path = tmp_path / "built.ort"
    path.unlink(missing_ok=True)
    path.write_bytes(data)
    return path


def _built(res) -> list:  # type: ignore[no-untyped-def]
    return [t for t in res.cache.trials if t.role != "confirm" and t.build_s is not None]


def test_a_second_search_takes_every_build_from_the_cache(sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", strategy="fast", selection=SELECTION)
    store = tmp_path / "builds"
    first = tune(spec, tmp_path / "one", build_cache=store)
    assert first.notes[-1].endswith("0 engine(s) taken, 2 stored")
    assert len([p for p in store.iterdir() if not p.name.startswith(".")]) == 2
    second = tune(spec, tmp_path / "two", build_cache=store)
    assert second.notes[-1].endswith("2 engine(s) taken, 0 stored")
    one, two = _built(first), _built(second)
    assert [t.route for t in one] == [t.route for t in two] and len(two) == 2
    for a, b in zip(one, two, strict=True):
        assert b.extra.get("build_cache") == "hit" and "build_cache" not in a.extra
        assert b.build_s == pytest.approx(a.build_s, rel=1e-9)  # the build time it took then
        assert "startup_build" not in b.phases_s  # no build process ran
        assert b.phases_s["build"] < a.build_s
        assert b.engine_digest == a.engine_digest  # the very engine stored by the first
        assert b.admissible and b.worst_loss == a.worst_loss
    assert not any(p.name.startswith(".") for p in store.iterdir())
    from dossier.audit.explain import explain_search

    c = second.cache
    cost = explain_search(c.header, c.trials, c.sessions, c.decision).cost
    assert cost.cached_builds == 2 and cost.build_s == pytest.approx(sum(t.build_s for t in one))
    assert explain_search(first.cache.header, first.cache.trials, first.cache.sessions,
                          first.cache.decision).cost.cached_builds == 0


def test_a_changed_build_input_misses(sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", strategy="fast", selection=SELECTION)
    store = tmp_path / "builds"
    tune(spec, tmp_path / "one", build_cache=store)
    import onnx

    model = onnx.load(str(spec.model_path()))
    model.doc_string = "the same graph, other bytes"
    onnx.save(model, str(spec.model_path()))
    res = tune(spec, tmp_path / "two", build_cache=store)
    assert res.notes[-1].endswith("0 engine(s) taken, 2 stored")
    weights = spec.model_copy(update={"shapes": [s.model_copy(update={"weight": 2 * s.weight})
                                                 for s in spec.shapes]})
    assert weights.shapes
    res = tune(weights, tmp_path / "three", build_cache=store)
    assert res.notes[-1].endswith("0 engine(s) taken, 2 stored")


def test_a_tampered_engine_is_rebuilt_and_its_entry_replaced(sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", strategy="fast", selection=SELECTION)
    store = tmp_path / "builds"
    tune(spec, tmp_path / "one", build_cache=store)
    victim = sorted(p for p in store.iterdir())[0]
    engine = victim / (ENGINE + ".ort")
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    engine.write_bytes(bytes(data))
    res = tune(spec, tmp_path / "two", build_cache=store)
    assert res.notes[-1].endswith("1 engine(s) taken, 1 stored")
    hits = [t for t in _built(res) if t.extra.get("build_cache") == "hit"]
    assert len(hits) == 1 and hits[0].engine_digest != digest_file(engine)[0]
    entry = json.loads((victim / ENTRY).read_text())
    assert digest_file(engine)[0] == entry["engine_digest"]  # stored again, whole


def test_an_identity_with_gpus_reads_back_equal(tmp_path: Path) -> None:
    """The host facts go through JSON in the entry: tuples come back as lists, which must not
    turn every GPU host's lookup into a miss."""
    from dossier.build_cache import host_identity
    from dossier.fingerprint import GpuInfo, collect

    fp = collect(include_gpu=False).model_copy(update={"gpus": [
        GpuInfo(index=1, name="NVIDIA H200", compute_capability="9.0"),
        GpuInfo(index=0, name="NVIDIA H200", compute_capability="9.0"),
        GpuInfo(index=2, name="NVIDIA L4", compute_capability="8.9")]})
    ident = _identity().model_copy(update={"host": host_identity(fp)})
    cache = BuildCache(tmp_path / "c")
    assert cache.put(ident, _engine(tmp_path), 3.0, {})
    assert cache.get(ident, tmp_path / "out.ort") is not None


def test_put_links_the_engine_and_a_later_build_leaves_the_entry_whole(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path / "c")
    ident = _identity()
    built = _engine(tmp_path)
    assert cache.put(ident, built, 1.0, {})
    assert built.stat().st_nlink == 2  # one file under two names: no bytes copied
    _engine(tmp_path, b"the next build's engine")  # a new file, as a build makes
    got = cache.get(ident, tmp_path / "out.ort")
    assert got is not None and (tmp_path / "out.ort").read_bytes() == b"engine bytes " * 100


def test_get_returns_what_put_stored_and_nothing_else(tmp_path: Path) -> None:
    cache = BuildCache(tmp_path / "c")
    ident = _identity()
    dest = tmp_path / "out.ort"
    assert cache.get(ident, dest) is None and not dest.exists()
    assert cache.put(ident, _engine(tmp_path), 12.5, {"fact": 1})
    entry = cache.get(ident, dest)
    assert entry is not None and entry.build_s == 12.5 and entry.facts == {"fact": "1"}
    assert dest.read_bytes() == _engine(tmp_path).read_bytes()
    assert cache.get(_identity([("k", "other")]), tmp_path / "x.ort") is None


@pytest.mark.parametrize("damage", ["garbage", "huge", "other key", "other identity",
                                    "engine link", "entry link", "engine truncated"])
def test_a_crafted_or_damaged_entry_is_a_miss(tmp_path: Path, damage: str) -> None:
    cache = BuildCache(tmp_path / "c")
    ident = _identity()
    cache.put(ident, _engine(tmp_path), 1.0, {})
    folder = cache.folder / ident.key()
    entry, engine = folder / ENTRY, folder / (ENGINE + ".ort")
    if damage == "garbage":
        entry.write_text("{not json")
    elif damage == "huge":
        entry.write_text(" " * (2 << 20) + entry.read_text())
    elif damage == "other key":
        d = json.loads(entry.read_text())
        d["key"] = "f" * 32
        entry.write_text(json.dumps(d))
    elif damage == "other identity":  # a valid entry of another build, planted under this key
        d = json.loads(entry.read_text())
        d["identity"]["build_knobs"] = [["k", "planted"]]
        entry.write_text(json.dumps(d))
    elif damage == "engine link":  # the right bytes, behind a link
        real = tmp_path / "real.ort"
        real.write_bytes(engine.read_bytes())
        engine.unlink()
        engine.symlink_to(real)
    elif damage == "entry link":
        real = tmp_path / "entry.json"
        real.write_text(entry.read_text())
        entry.unlink()
        entry.symlink_to(real)
    elif damage == "engine truncated":
        engine.write_bytes(engine.read_bytes()[:-1])
    dest = tmp_path / "out.ort"
    assert cache.get(ident, dest) is None and not dest.exists()
    assert cache.put(ident, _engine(tmp_path), 2.0, {})  # replaced by the next build
    got = cache.get(ident, dest)
    assert got is not None and got.build_s == 2.0


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Any, Any, Path]:
    """A build cache holding one entry: (cache, identity, the entry's folder)."""
    cache = BuildCache(tmp_path / "bc")
    engine = tmp_path / "engine.ort"
    engine.write_bytes(b"engine bytes" * 100)
    identity = _identity()
    assert cache.put(identity, engine, 1.0, {})
    assert cache.get(identity, tmp_path / "probe.ort") is not None  # an honest hit
    (tmp_path / "probe.ort").unlink()
    return cache, identity, tmp_path / "bc" / identity.key()


def test_a_world_writable_entry_folder_is_a_miss(stored: tuple[Any, Any, Path],
                                                 tmp_path: Path) -> None:
    """Before: only the top folder was checked; an entry folder anyone may write was a hit."""
    cache, identity, entry = stored
    os.chmod(entry, 0o777)
    assert cache.get(identity, tmp_path / "got.ort") is None
    assert not (tmp_path / "got.ort").exists()


def test_an_entry_folder_linked_outside_is_a_miss(stored: tuple[Any, Any, Path],
                                                  tmp_path: Path) -> None:
    """Before: an entry folder that is a link to a world-writable folder outside was a hit."""
    cache, identity, entry = stored
    outside = tmp_path / "outside"
    shutil.move(entry, outside)
    os.chmod(outside, 0o777)
    entry.symlink_to(outside)
    assert cache.get(identity, tmp_path / "got.ort") is None
    assert not (tmp_path / "got.ort").exists()


@pytest.mark.parametrize("name", ["entry.json", "engine.ort"])
def test_a_fifo_in_the_build_cache_is_a_miss_not_a_hang(stored: tuple[Any, Any, Path],
                                                        tmp_path: Path, name: str) -> None:
    """Before: a FIFO in place of entry.json or the engine hung the search forever: the open
    blocked before the regular-file check."""
    cache, identity, entry = stored
    fifo = entry / name
    fifo.unlink()
    os.mkfifo(fifo)
    box: list[Any] = []
    t = threading.Thread(target=lambda: box.append(cache.get(identity, tmp_path / "g.ort")),
                         daemon=True)
    t.start()
    t.join(10)
    try:
        assert box == [None], "still blocked on the FIFO after 10 s"
    finally:
        if t.is_alive():  # release the blocked reader
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) or not os.path.lexists(fifo)


def test_a_folder_others_may_write_is_refused(tmp_path: Path, runner, sample) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(InputError, match="may be written by others"):
        BuildCache(shared)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "c", target_is_directory=True)
    (tmp_path / "c").mkdir()
    with pytest.raises(InputError, match="not a folder"):
        BuildCache(link)
    spec_path, _ = sample("convnet")
    r = runner.invoke(app, ["tune", str(spec_path), "--out", str(tmp_path / "run"),
                            "--build-cache", str(shared)])
    assert r.exit_code == ExitCode.INPUT, r.output
    assert "may be written by others" in r.output and not (tmp_path / "run").exists()


def test_local_builds_only(sample, tmp_path: Path) -> None:
    _, spec = sample("convnet", strategy="fast", selection=SELECTION)
    with pytest.raises(InputError, match="local builds only"):
        tune(spec, tmp_path / "run", executor="ray", build_cache=tmp_path / "c")
    assert not (tmp_path / "run" / "tuning-cache.jsonl").exists()


def _put(folder: str, engine: str, build_s: float) -> bool:
    return BuildCache(Path(folder)).put(_identity(), Path(engine), build_s, {})


def test_two_writers_of_one_key_leave_one_whole_entry(tmp_path: Path) -> None:
    folder = tmp_path / "c"
    BuildCache(folder)
    engine = _engine(tmp_path, os.urandom(4 << 20))
    with multiprocessing.get_context("fork").Pool(4) as pool:
        done = pool.starmap(_put, [(str(folder), str(engine), float(i)) for i in range(8)])
    assert all(done)
    assert [p.name for p in folder.iterdir()] == [_identity().key()]  # no staging left
    got = BuildCache(folder).get(_identity(), tmp_path / "out.ort")
    assert got is not None and (tmp_path / "out.ort").read_bytes() == engine.read_bytes()


def test_a_full_disk_costs_the_cache_entry_only(tmp_path: Path, monkeypatch) -> None:
    import dossier.build_cache as bc

    def full(src: Path, dst: Path) -> tuple[str, int]:
        dst.write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))

    cache = BuildCache(tmp_path / "c")
    monkeypatch.setattr(bc, "link_or_copy_hashed", full)
    assert not cache.put(_identity(), _engine(tmp_path), 1.0, {})
    assert "No space left" in cache.notes[0] and "rebuilds it" in cache.notes[0]
    assert list(cache.folder.iterdir()) == []  # nothing half-written


def _put_under_fsize_limit(folder: str, engine: str, limit: int) -> None:
    import resource
    import signal

    def no_link(*_a: object, **_k: object) -> None:  # another file system: the bytes are copied
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    os.link = no_link  # type: ignore[assignment] # a forked child of its own
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    cache = BuildCache(Path(folder))
    ok = cache.put(_identity(), Path(engine), 1.0, {})
    os._exit(0 if not ok and "File too large" in cache.notes[0] else 1)


def test_a_file_size_limit_costs_the_entry_only(tmp_path: Path) -> None:
    """A real failing write (RLIMIT_FSIZE), not a mocked one: put says no, in its notes, and
    leaves nothing in the folder."""
    folder = tmp_path / "c"
    BuildCache(folder)
    engine = _engine(tmp_path, os.urandom(1 << 20))
    proc = multiprocessing.get_context("fork").Process(
        target=_put_under_fsize_limit, args=(str(folder), str(engine), 64 << 10))
    proc.start()
    proc.join()
    assert proc.exitcode == 0
    assert list(folder.iterdir()) == []
    assert BuildCache(folder).get(_identity(), tmp_path / "out.ort") is None


def test_staging_left_by_a_dead_writer_is_removed(tmp_path: Path) -> None:
    folder = tmp_path / "c"
    BuildCache(folder)
    proc = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    proc.start()
    proc.join()
    stale = folder / f".{'a' * 32}.staging-{proc.pid}-00ff"
    stale.mkdir()
    (stale / "engine.ort").write_bytes(b"half")
    BuildCache(folder)
    assert not stale.exists()


def test_a_search_with_a_build_cache_collects_the_host_once(sample, tmp_path: Path,
                                                             monkeypatch) -> None:
    """The key needs the host's facts, and so does the run folder's fingerprint.json: one
    collection serves both (for the torch backend it costs an import of torch)."""
    import dossier.build_plan as build_plan_module
    import dossier.tuner.session as session_module

    calls = []
    real = session_module.collect

    def counting(**kwargs):  # type: ignore[no-untyped-def]
        calls.append(kwargs)
        return real(**kwargs)

    for module in (session_module, build_plan_module):  # the run folder's, and the key's
        monkeypatch.setattr(module, "collect", counting)
    _, spec = sample("convnet", strategy="fast", selection=SELECTION)
    res = tune(spec, tmp_path / "one", build_cache=tmp_path / "builds")
    assert res.notes[-1].endswith("0 engine(s) taken, 2 stored")
    assert len(calls) == 1
