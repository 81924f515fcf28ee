"""Shared fixtures: built samples, small timing settings, spec factories, the CLI runner."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

from dossier.spec import ReleaseSpec, load_spec
from dossier.timing import TimingSettings

ROOT = Path(__file__).resolve().parents[1]

TINY_TIMING = TimingSettings(samples=12, rounds=6, block_warmup=1, warmup_window=2,
                             warmup_min_runs=1, warmup_max_s=0.2, confirm_top=1,
                             trial_timeout_s=60, confirm_rounds=3, confirm_warmup=2,
                             confirm_runs=5, confirm_block_s=0.05, confirm_processes=3,
                             confirm_max_processes=3)
"""Timing small enough for tests: decisions made with it are not meaningful, the plumbing is."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="also run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


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


@pytest.fixture()
def runner():
    """typer's CliRunner over the dossier app."""
    from typer.testing import CliRunner

    return CliRunner()


def write_tiny_timing(spec_path: Path) -> None:
    """Append a [timing] table with TINY_TIMING to a spec file (for CLI tests)."""
    lines = ["", "[timing]"] + [f"{k} = {v!r}".replace("'", '"').replace("None", "")
                                for k, v in TINY_TIMING.model_dump().items() if v is not None]
    with open(spec_path, "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


os.environ.setdefault("OMP_NUM_THREADS", "2")
