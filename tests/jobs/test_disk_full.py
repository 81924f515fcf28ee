"""A full disk is the host's fault, not the route's: real tmpfs mounts (and ``RLIMIT_FSIZE``),
real processes.

``dossier tune`` into a tmpfs too small for the search stops with one line naming the file
system (exit 74), records no trial falsely (no ``crashed`` or ``build_failed`` for a trial that
hit the full disk), leaves no ``knobs.json.tmp``; once there is room, ``tune --continue`` runs the
interrupted trial and the search ends as an uninterrupted one, and bundles. The same for a file
size limit (``ulimit -f``), for a bundle written to a full disk, and for archives opened with a
small TMPDIR (commands that need no files extract none).

Mounting a tmpfs needs root (CI runs as root); elsewhere those tests skip, saying so, and the
``RLIMIT_FSIZE`` test still runs.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import _bundles as h
import pytest
from _figures import figures
from conftest import dossier_command
from conftest import subprocess_env as _env

from dossier.errors import ExitCode
from dossier.run_folder import CACHE_NAME

ROOM = "64m"
"""Size the tmpfs is grown to once the test frees space."""
DEFAULT_SIZES = ("160k",)
"""tmpfs size of the default suite: full during the search trial (the engine is about 60 KiB,
knobs.json 24 KiB); the slow suite sweeps 20 sizes, from full before the cache header to room
enough."""
SLOW_SIZES = ("4k", "8k", "12k", "16k", "20k", "28k", "36k", "48k", "64k", "80k", "100k", "120k",
              "140k", "160k", "180k", "200k", "240k", "280k", "320k", "400k")


@pytest.fixture(scope="module")
def spec(samples_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return h.write_spec(tmp_path_factory.mktemp("full-spec") / "release.toml",
                        samples_dir / "convnet")


@pytest.fixture(scope="module")
def finished(spec: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished run folder and its archive."""
    root = tmp_path_factory.mktemp("full-run")
    run, out = root / "run", root / "out"
    assert _dossier("tune", spec, "--out", run, "--quiet")[0] == 0
    assert _dossier("bundle", run, "--out", out)[0] == 0
    assert _dossier("pack", out / "convnet-1.dossier", "--out", out)[0] == 0
    return run, out / "convnet-1.dossier.tar"


class Tmpfs:
    """A tmpfs mounted for one test, unmounted at its end."""

    def __init__(self, where: Path, size: str) -> None:
        self.path = where
        self.mounted = False
        where.mkdir(parents=True, exist_ok=True)
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, text=True)
        if res.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.strip()}")
        self.mounted = True

    def grow(self, size: str = ROOM) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True)

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False)
            self.mounted = False


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    mounted: list[Tmpfs] = []

    def mount(size: str) -> Tmpfs:
        fs = Tmpfs(tmp_path / f"mnt-{len(mounted)}", size)
        mounted.append(fs)
        return fs

    yield mount
    for fs in mounted:
        fs.unmount()


def _dossier(*args: object, env: dict[str, str] | None = None,
             fsize: int | None = None) -> tuple[int, str]:
    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    res = subprocess.run(dossier_command(*args),
                         env=env or _env(), capture_output=True, timeout=600,
                         stdin=subprocess.DEVNULL, preexec_fn=limit)
    return res.returncode, " ".join(res.stderr.decode(errors="replace").split())


def _records(run: Path) -> list[dict]:
    cache = run / CACHE_NAME
    if not cache.is_file():
        return []
    lines = cache.read_bytes().split(b"\n")[:-1]  # a torn last line is what --continue cuts
    return [json.loads(line) for line in lines]


def _assert_nothing_false(run: Path) -> None:
    """No trial recorded as failing (every route of this selection builds and passes), no
    knobs.json.tmp or other temporary file, no engine that no record names."""
    trials = [r for r in _records(run) if r["kind"] == "trial"]
    assert all(t["outcome"] == "ok" for t in trials), [(t["route"], t["reason"]) for t in trials]
    leftovers = [p.name for p in run.rglob("*.tmp")] if run.exists() else []
    assert not leftovers, leftovers
    engines = {p.name for p in (run / "engines").glob("*")} if (run / "engines").is_dir() else set()
    named = {Path(t["engine"]).name for t in trials if t.get("engine")}
    assert engines <= named, engines - named


def _fill_and_resume(spec: Path, tmpfs, size: str) -> str:  # type: ignore[no-untyped-def]
    """tune into a tmpfs of ``size``; when it stops on the full disk, grow it and resume.
    Returns where it stopped ("" when there was room)."""
    fs = tmpfs(size)
    run = fs.path / "run"
    code, said = _dossier("tune", spec, "--out", run, "--quiet")
    stopped = ""
    if code != 0:
        assert code == ExitCode.DISK_FULL, (size, code, said)
        assert said.count("error:") == 1 and str(fs.path) in said, said
        assert "No space left on device" in said, said
        stopped = said.split(" is full while ", 1)[1].split(":")[0]
        _assert_nothing_false(run)
        fs.grow()
        if (run / CACHE_NAME).is_file():
            code, said = _dossier("tune", "--continue", run, "--quiet")
        else:  # full before the cache header was written: nothing to continue
            code, said = _dossier("tune", spec, "--out", run, "--quiet")
        assert code == 0, (size, said)
    _assert_nothing_false(run)
    trials = {r["route"] for r in _records(run) if r["kind"] == "trial" and r["role"] != "confirm"}
    assert trials == {"-graph_optimization_level=all", "-graph_optimization_level=disable_all"}
    fs.grow()  # the bundle needs room too (a full bundle target: its own test below)
    code, said = _dossier("bundle", run, "--out", fs.path / "out")
    assert code == 0, said
    fs.unmount()
    return stopped


def _sweep(spec: Path, tmpfs, sizes: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    stops = [_fill_and_resume(spec, tmpfs, size) for size in sizes]
    figures("tune into a full tmpfs, resumed once there is room", sizes=len(sizes),
            stopped_on_full_disk=sum(bool(s) for s in stops),
            resumed_to_the_uninterrupted_result=len(sizes),
            where=sorted({s or "(room enough)" for s in stops}))


def test_a_full_disk_stops_the_search_and_continue_reruns_the_trial(spec: Path, tmpfs) -> None:  # type: ignore[no-untyped-def]
    _sweep(spec, tmpfs, DEFAULT_SIZES)


@pytest.mark.slow
def test_a_full_disk_at_many_sizes(spec: Path, tmpfs) -> None:  # type: ignore[no-untyped-def]
    _sweep(spec, tmpfs, SLOW_SIZES)


@pytest.mark.parametrize("kib", [pytest.param(20, marks=pytest.mark.slow), 40])
def test_a_file_size_limit_is_the_host_not_the_route(spec: Path, tmp_path: Path, kib: int) -> None:
    """Under ``ulimit -f 40`` (KiB) the ~60 KiB engine cannot be written (under 20, knobs.json
    cannot): exit 74 saying so, no ``build_failed`` recorded, no knobs.json.tmp; without the limit
    ``--continue`` finishes the search. (Under 20 this found a knob database read from a log in a
    temporary file: cut short by the limit, it silently lost knobs; the log now goes through a
    pipe.)"""
    run = tmp_path / "run"
    code, said = _dossier("tune", spec, "--out", run, "--quiet", fsize=kib << 10)
    assert code == ExitCode.DISK_FULL and said.count("error:") == 1, said
    assert "file size limit" in said and "File too large" in said, said
    _assert_nothing_false(run)
    code, said = _dossier("tune", "--continue", run, "--quiet")
    assert code == 0, said
    _assert_nothing_false(run)
    assert len([r for r in _records(run) if r["kind"] == "trial"]) >= 2


def test_a_bundle_written_to_a_full_disk_leaves_nothing(spec: Path, tmpfs, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                         finished: tuple[Path, Path]) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished[0], run)
    fs = tmpfs("96k")
    for args in (("bundle", run, "--out", fs.path), ("release", spec, "--out", fs.path,
                                                      "--work", run, "--quiet")):
        code, said = _dossier(*args)
        assert code == ExitCode.DISK_FULL and said.count("error:") == 1, said
        assert list(fs.path.iterdir()) == []  # no staging folder, no lock, no half bundle
    fs.grow()
    code, said = _dossier("bundle", run, "--out", fs.path)
    assert code == 0, said


@pytest.mark.parametrize("limit", ["fsize", "tmpfs"])
def test_the_html_report_on_a_full_disk(limit: str, tmpfs, tmp_path: Path,  # type: ignore[no-untyped-def]
                                        finished: tuple[Path, Path]) -> None:
    """``explain --html`` (a page of ~5 MiB) past the file size limit or onto a full tmpfs: one
    line naming the limit or the file system (exit 74), no staging file, and the earlier page at
    that path left whole; once there is room the page is written."""
    pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")
    fs = tmpfs("1m") if limit == "tmpfs" else None
    folder = fs.path if fs is not None else tmp_path / "pages"
    folder.mkdir(exist_ok=True)
    page = folder / "report.html"
    page.write_text("the earlier page")
    code, said = _dossier("explain", finished[1], "--html", page,
                          fsize=(2 << 20) if limit == "fsize" else None)
    assert code == ExitCode.DISK_FULL and said.count("error:") == 1, said
    assert ("file size limit" in said) if limit == "fsize" else (str(folder) in said), said
    assert [p.name for p in folder.iterdir()] == ["report.html"]
    assert page.read_text() == "the earlier page"
    if fs is not None:
        fs.grow()
    code, said = _dossier("explain", finished[1], "--html", page)
    assert code == 0 and "Plotly.newPlot" in page.read_text(), said


def _fill(folder: Path) -> Path:
    """Write zeros into ``folder`` until its file system is full; the filler file."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while f.write(b"\0" * 4096):
                pass
        except OSError:
            pass
    return filler


def test_every_writer_says_the_disk_is_full(tmpfs, finished: tuple[Path, Path],  # type: ignore[no-untyped-def]
                                            tmp_path: Path) -> None:
    """pack, sign (a new envelope and a co-signature), keygen, import, export and schema into
    a full file system: each stops with one line naming it (exit 74, not 7) and leaves no file
    behind."""
    from test_trtexec_import import plan_bytes, tiny_onnx, write_cache

    bundle = finished[1].parent / "convnet-1.dossier"
    keys = tmp_path / "keys"
    assert _dossier("keygen", "--out", keys)[0] == 0
    assert _dossier("keygen", "--out", keys, "--name", "second")[0] == 0
    trt = tmp_path / "trt"
    trt.mkdir()
    tiny_onnx(trt / "resnet.onnx")
    (trt / "best.plan").write_bytes(plan_bytes())
    write_cache(trt)
    fs = tmpfs("64k")
    signed = fs.path / "co.sig.json"
    assert _dossier("sign", bundle, "--key", keys / "dossier.key", "--out", signed)[0] == 0
    filler = _fill(fs.path)
    kept = {signed: signed.read_bytes()}
    for args in (("pack", bundle, "--out", fs.path / "out"),
                 ("sign", bundle, "--key", keys / "dossier.key", "--out", fs.path / "b.sig.json"),
                 ("sign", bundle, "--key", keys / "second.key", "--out", signed),
                 ("keygen", "--out", fs.path / "keys"),
                 ("import", "trtexec", "--tuning-cache", trt / "tuning-cache.jsonl", "--engine",
                  trt / "best.plan", "--out", fs.path / "imported"),
                 ("export", "trtexec-cache", bundle, "--out", fs.path / "exported.jsonl"),
                 ("schema", "--out", fs.path / "schemas")):
        code, said = _dossier(*args)
        assert code == ExitCode.DISK_FULL, (args[0], code, said)
        assert said.count("error:") == 1 and str(fs.path) in said, said
        left = sorted(p for p in fs.path.rglob("*") if not p.is_dir())
        assert left == sorted([filler, signed]), (args[0], left)
        assert signed.read_bytes() == kept[signed]  # the envelope co-signed is unchanged
    figures("writers into a full file system", commands=7, exit_74=7)


def test_archives_with_a_small_tmpdir(tmpfs, finished: tuple[Path, Path]) -> None:  # type: ignore[no-untyped-def]
    """TMPDIR on a 64 KiB tmpfs: ``inspect`` and ``verify --integrity-only`` of an archive
    extract nothing and succeed; ``verify --recheck``, which needs the engine, says in one line
    that TMPDIR is full (exit 74); TMPDIR is left empty every time."""
    archive = finished[1]
    fs = tmpfs("64k")
    env = _env(TMPDIR=str(fs.path))
    for args, expected in ((("inspect", archive), 0),
                           (("verify", archive, "--integrity-only"), 0),
                           (("explain", archive), 0),
                           (("verify", archive, "--recheck"), ExitCode.DISK_FULL)):
        code, said = _dossier(*args, env=env)
        assert code == expected, (args, code, said)
        if expected:
            assert said.count("error:") + said.count("FAIL:") == 1 and str(fs.path) in said, said
        assert list(fs.path.iterdir()) == [], args
