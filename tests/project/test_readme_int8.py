"""The README's int8 section as a newcomer runs it beside the tblock sample: its three commands
and its spec, as written. The split makes the three sets; the spec is one `tune` takes (its dry
run lists the int8 routes); the release and explain run on it (small timing)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, cli, write_tiny_timing

README = (ROOT / "README.md").read_text()
SECTION = README.split("## Precision routes and the three data sets", 1)[1].split("\n## ", 1)[0]


def _commands() -> list[list[str]]:
    block = re.findall(r"```bash\n(.*?)```", SECTION, re.S)
    assert len(block) == 1
    return [shlex.split(line) for line in block[0].splitlines() if line.strip()]


def test_the_int8_section_is_a_short_spec_and_three_commands() -> None:
    specs = re.findall(r"```toml\n(.*?)```", SECTION, re.S)
    assert len(specs) == 1 and len(specs[0].splitlines()) <= 8
    commands = _commands()
    assert [c[:2] for c in commands] == [["dossier", "validation"], ["dossier", "release"],
                                         ["dossier", "explain"]]
    assert len(SECTION.split()) < 260  # no wall: the spec and the commands say it


def _split_and_dry_run(samples_dir: Path, tmp_path: Path,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    """In a copy of the tblock sample: the section's spec saved as int8.toml, its split run as
    written, and the spec's dry run listing the int8 routes."""
    folder = tmp_path / "tblock"
    shutil.copytree(samples_dir / "tblock", folder)
    monkeypatch.chdir(folder)
    Path("int8.toml").write_text(re.findall(r"```toml\n(.*?)```", SECTION, re.S)[0])
    r = cli(*_commands()[0][1:])
    assert r.exit_code == 0, r.output
    dry = cli("tune", "int8.toml", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    assert any("-quantization=static" in x for x in json.loads(dry.stdout)["routes"])


def test_the_int8_spec_and_split_fit_the_sample(samples_dir: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    _split_and_dry_run(samples_dir, tmp_path, monkeypatch)


@pytest.mark.slow
def test_the_int8_section_runs_as_written(samples_dir: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _split_and_dry_run(samples_dir, tmp_path, monkeypatch)
    _, release, explain = _commands()
    write_tiny_timing(Path("int8.toml"))
    r = cli(*release[1:], "--quiet")
    assert r.exit_code == 0, r.stderr
    r = cli(*explain[1:])
    assert r.exit_code == 0, r.output
