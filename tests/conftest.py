"""The test suite's one vocabulary: built samples, the released bundles of the samples, small
timing settings, spec factories, the in-process CLI and ``dossier`` as a real process (run to
its end, or interrupted with Ctrl-C), a local registry and a misbehaving HTTP server, and the
order in which modules start when the suite is spread over processes (pytest-xdist).
docs/testing.md tells how to run it.

Helpers of the tests import from here by the tests folder's own names (``from conftest import
cli``, ``import _bundles as h``): pytest puts this folder first on the path, and a
second name for the same file (``tests.conftest``) would run it twice. The tests are grouped
in one folder per package they test (``tests/measure``, ``tests/jobs``...); every such folder
is on the path too, so a test module imports another's fixtures by its name (module names are
unique across the folders).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPO = ROOT
PLUGINS = ROOT / "tests" / "plugins"
"""The test-only backends ``faulty`` and ``landscape`` and the record that registers them
(``dossier_test_backends``): put first on this process's path and on PYTHONPATH below, so
that the suite and every process it starts find them; nothing outside the suite does."""
sys.path.insert(0, str(PLUGINS))
for _folder in sorted(ROOT.joinpath("tests").iterdir()):
    if _folder.is_dir() and _folder.name not in ("assets", "plugins") \
            and not _folder.name.startswith((".", "_")):
        sys.path.insert(1, str(_folder))
import dossier_test_backends  # noqa: E402

dossier_test_backends.enable()

from dossier.measure.timing import TimingSettings  # noqa: E402
from dossier.spec import ReleaseSpec, load_spec  # noqa: E402

TINY_TIMING = TimingSettings(samples=12, rounds=6, block_warmup=1, warmup_window=2,
                             warmup_min_runs=1, warmup_max_s=0.2, confirm_top=1,
                             trial_timeout_s=60, confirm_rounds=3, confirm_warmup=2,
                             confirm_runs=5, confirm_block_s=0.05, confirm_processes=3,
                             confirm_max_processes=3, confirm_floor=0.0)
"""Timing small enough for tests: decisions made with it are not meaningful, the plumbing is
(so every admissible route goes to the confirmation: no floor)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="also run tests marked slow")


FIRST = ("test_torch_inductor.py", "test_serve_torch.py", "test_tuner.py", "test_reliability.py",
         "test_build_cache.py", "test_disk_full.py", "test_ray_executor.py", "test_bench_smoke.py",
         "test_ray_two_gpus.py", "test_locks.py", "test_cli_tune.py", "test_confirmation.py",
         "test_readme.py", "test_cli_output.py", "test_verify.py", "test_explain.py",
         "test_bundle_write.py", "test_bundle_archive.py")
"""The modules that take longest, started first so that no worker is left with a long one at
the end (from ``--durations``; the others keep their order)."""

def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--run-slow"):
        skip = pytest.mark.skip(reason="slow: run with --run-slow")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)
    # make test: --dist loadfile --no-loadscope-reorder runs each module in one worker (its
    # module fixtures made once, its tests in the order written), modules in this order
    order = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: order.get(item.path.name, len(FIRST)))


@pytest.fixture(scope="session")
def samples_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both samples built once per session into a temporary folder."""
    spec = importlib.util.spec_from_file_location("samples_build", ROOT / "samples" / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["samples_build"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    out = tmp_path_factory.mktemp("samples")
    module.build_all(out)
    return out


@pytest.fixture()
def sample(samples_dir: Path, tmp_path: Path):
    """Factory: a private copy of a sample folder (so a test may damage it) and its spec."""

    def make(name: str, **tune: object) -> tuple[Path, ReleaseSpec]:
        dst = tmp_path / f"sample-{name}"
        if not dst.exists():
            shutil.copytree(samples_dir / name, dst)
        spec = load_spec(dst / "release.toml", tune or None)
        return dst / "release.toml", spec.model_copy(update={"timing": TINY_TIMING})

    return make


@pytest.fixture(scope="session")
def rel(tmp_path_factory: pytest.TempPathFactory, samples_dir: Path) -> dict[str, Any]:
    """Both samples released with ``dossier release`` once per session (small timing; the
    tblock spec has an extra, uncovered shape entry): name -> _bundles.Released.
    Shared: a test that damages a bundle damages a copy (``h.copy_bundle``)."""
    import _bundles as h

    return h.released(tmp_path_factory.mktemp("bundle-session"), samples_dir)


@pytest.fixture()
def runner():
    """typer's CliRunner over the dossier app."""
    from typer.testing import CliRunner

    return CliRunner()


def cli(*args: object, columns: int | None = None, **kw: Any) -> Any:
    """Run ``dossier ARGS`` in-process; click's Result (exit_code, stdout, stderr). Exceptions
    propagate unless ``catch_exceptions=True``; ``columns`` sets the terminal width rich wraps
    at."""
    from typer.testing import CliRunner

    from dossier_cli.main import app

    kw.setdefault("catch_exceptions", False)
    if columns is not None:
        kw["env"] = {**kw.get("env", {}), "COLUMNS": str(columns)}
    return CliRunner().invoke(app, [str(a) for a in args], **kw)


def subprocess_env(*first: os.PathLike[str] | str, **extra: str) -> dict[str, str]:
    """This environment for a child process that imports dossier from this checkout, with
    ``first`` folders ahead of it on PYTHONPATH (and this process's PYTHONPATH after it) and
    ``extra`` variables set."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = os.pathsep.join([*map(str, first), str(REPO), *kept])
    return {**os.environ, "PYTHONPATH": path, **extra}


def dossier_command(*args: object) -> list[str]:
    """The argv of ``dossier ARGS`` run by this Python from this checkout."""
    return [sys.executable, "-m", "dossier_cli.main", *map(str, args)]


def dossier_process(args: Sequence[object], env: dict[str, str] | None = None, *,
                    stdout: int | IO[Any] | None = subprocess.DEVNULL,
                    stderr: int | IO[Any] | None = subprocess.PIPE,
                    new_session: bool = True, **kw: Any) -> subprocess.Popen[bytes]:
    """``dossier ARGS`` started as a real process (by default in a process group of its own,
    no standard input, stdout discarded, stderr piped); ``env`` defaults to
    :func:`subprocess_env`."""
    return subprocess.Popen(dossier_command(*args), env=env if env is not None else subprocess_env(),
                            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                            start_new_session=new_session, **kw)


def write_tiny_timing(spec_path: Path) -> None:
    """Append a [timing] table with TINY_TIMING to a spec file (for CLI tests)."""
    lines = ["", "[timing]"] + [f"{k} = {v!r}".replace("'", '"').replace("None", "")
                                for k, v in TINY_TIMING.model_dump().items() if v is not None]
    with open(spec_path, "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


TINY_SPEC_TIMING = """
[timing]
samples = 12
rounds = 6
block_warmup = 1
warmup_window = 2
warmup_min_runs = 1
warmup_max_s = 0.2
confirm_top = 1
trial_timeout_s = 60
confirm_rounds = 7
confirm_warmup = 2
confirm_runs = 5
confirm_block_s = 0.05
"""
"""The [timing] table of :func:`tiny_spec`: timing small enough for tests, as a spec file
writes it."""


def tiny_spec(folder: Path, name: str = "tiny", *, tune: str = "", extra: str = "",
              timing: str = TINY_SPEC_TIMING) -> Path:
    """A spec for the conv-net sample in ``folder`` (two routes unless ``tune`` says), written
    beside it as ``NAME.toml``; ``extra`` is appended (e.g. ``[[shapes]]`` entries)."""
    spec = folder / f"{name}.toml"
    spec.write_text(f'[release]\nname = "{name}"\n[model]\npath = "model.onnx"\n'
                    '[validation]\npath = "validation"\n[tune]\n'
                    + (tune or 'selection = "-graph_optimization_level=[all|disable_all]"\n')
                    + 'metric = "linf"\nthreshold = 1e-4\n' + timing + extra)
    return spec


def dossier_run(*args: object, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``dossier ARGS`` as a shell runs it: a process whose stdout is a pipe, not a terminal
    (no COLUMNS set); its stdout and stderr as text."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(dossier_command(*args), capture_output=True, text=True, env=env, **kw)


def interrupted(*args: object, after: str, wait: float = 0.0, cwd: Path) -> tuple[int, str]:
    """Run ``dossier ARGS``, and once a stderr line holds ``after`` (and ``wait`` s later) press
    Ctrl-C: SIGINT to its process group, as a terminal sends it. Its exit status and stderr."""
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    def ctrl_c_as_a_terminal_has_it() -> None:
        # a test worker may run with SIGINT ignored (pytest-xdist's do), and a Python started
        # with SIGINT ignored leaves it so: Ctrl-C would then be lost on the way
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    with subprocess.Popen(dossier_command(*args), stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                          start_new_session=True,
                          preexec_fn=ctrl_c_as_a_terminal_has_it) as p:  # noqa: PLW1509
        assert p.stderr is not None
        lines = []
        for ln in p.stderr:
            lines.append(ln)
            if after in ln:
                break
        time.sleep(wait)
        os.killpg(p.pid, signal.SIGINT)
        lines += p.stderr.readlines()
        return p.wait(timeout=120), "".join(lines)


os.environ.setdefault("OMP_NUM_THREADS", "2")


def isolate_registry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No registry credentials and no registry cache from the machine (for a test's
    autouse fixture)."""
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    monkeypatch.setenv("DOSSIER_REGISTRY_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("DOSSIER_REGISTRY_USERNAME", raising=False)
    monkeypatch.delenv("DOSSIER_REGISTRY_PASSWORD", raising=False)


@pytest.fixture()
def convnet_folder(samples_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the conv-net sample's folder (``tmp_path/convnet``), for
    :func:`tiny_spec`; a test may damage it."""
    folder = tmp_path / "convnet"
    shutil.copytree(samples_dir / "convnet", folder)
    return folder


@pytest.fixture(scope="session")
def convnet_bundle(tmp_path_factory: pytest.TempPathFactory, samples_dir: Path) -> Path:
    """The conv-net sample searched over two routes (``test_explain.RUNS["convnet"]``, tiny
    timing) and bundled, once per session. Shared: a test must not alter it."""
    from test_explain import make_bundle

    return make_bundle(tmp_path_factory.mktemp("convnet-bundle"), samples_dir, "convnet")


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    """A private copy of the golden convnet bundle (tests/assets/golden), which a test may
    alter; a test file that means another bundle by this name defines its own."""
    import _bundles as h

    return h.copy_bundle(h.GOLDEN, tmp_path / "release")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local OCI registry (the ``docker-registry`` binary) for a test module; skipped where
    it, or the [oci] extra, is not installed."""
    from test_registry import REGISTRY_BIN, Registry

    if not os.access(REGISTRY_BIN, os.X_OK):
        pytest.skip("docker-registry is not installed")
    pytest.importorskip("oras", reason="registries need the [oci] extra (oras)")
    server = Registry(tmp_path_factory.mktemp("registry")).start()
    yield server
    server.kill()


@pytest.fixture
def host(bundle: Path, tmp_path: Path) -> Path:
    """``bundle``'s tuning host as a fingerprint file (``--host-fingerprint``, ``host=``): the
    bundle is VALID there, whatever this CPU is."""
    path = tmp_path / "host.json"
    path.write_bytes((bundle / "fingerprint.json").read_bytes())
    return path


@pytest.fixture
def hostile() -> Iterator[Any]:
    """Factory: ``hostile(behave)`` starts an HTTP server on 127.0.0.1 that answers every request
    with ``behave(handler)`` (``_hostile.Hostile``: its ``port``, the ``paths`` asked for, a
    ``stop`` event); every server is closed after the test."""
    from _hostile import Hostile

    servers: list[Hostile] = []

    def make(behave: Any) -> Hostile:
        servers.append(Hostile(behave))
        return servers[-1]

    yield make
    for s in servers:
        s.close()
