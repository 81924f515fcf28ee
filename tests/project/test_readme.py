"""The README as a newcomer reads it: short, its links resolve, its one spec snippet is a spec
``tune`` takes, and its first release runs as written (interrupted with Ctrl-C and resumed as
the message says)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from conftest import ROOT, TINY_SPEC_TIMING, cli, dossier_run, interrupted

from dossier.errors import ExitCode

README = (ROOT / "README.md").read_text()


def test_readme_spec_snippet_runs_beside_the_sample(samples_dir: Path, tmp_path: Path) -> None:
    """The README's short spec, saved in the sample's folder as it says, is a spec `tune`
    takes: its dry run lists the routes of its selection, baseline first."""
    snippets = re.findall(r"```toml\n(.*?)```", README, re.S)  # the second: the int8 section's
    assert len(snippets) == 2 and len(snippets[0].splitlines()) <= 10
    folder = tmp_path / "convnet"
    shutil.copytree(samples_dir / "convnet", folder)
    (folder / "mine.toml").write_text(snippets[0])
    r = cli("tune", folder / "mine.toml", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    routes = json.loads(r.stdout)["routes"]
    assert len(routes) >= 2 and all("-optimizer:ConvBNFusion=" in x for x in routes)


def test_readme_is_short_and_its_links_resolve() -> None:
    assert len(README.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        assert (ROOT / link).exists(), link
    assert ". .venv/bin/activate" in README


def test_readme_first_release_as_written_interrupted_and_resumed(samples_dir: Path,
                                                                 tmp_path: Path) -> None:
    """The README's three commands, run as written in a checkout whose samples are built (and
    whose out/ already holds make sample's bundle). Ctrl-C during the release names the folder
    and the command that resumes it, and that command does; Ctrl-C during verify --rebench names
    no tuning cache."""
    block = README.split("## A first release", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [ln.split("#", 1)[0].split()[1:] for ln in block.splitlines()
                if ln.startswith("dossier ")]
    assert [c[0] for c in commands] == ["release", "verify", "explain"]
    sample = tmp_path / "samples" / "convnet"
    shutil.copytree(samples_dir / "convnet", sample)
    timing = "\n".join(ln for ln in TINY_SPEC_TIMING.splitlines()  # the sample's 12 routes,
                       if not ln.startswith("confirm_"))            # timed briefly
    (sample / "release.toml").write_text((sample / "release.toml").read_text() + timing
                                         + "\nconfirm_rounds = 7\nconfirm_block_s = 0.2\n")
    (tmp_path / "out" / "convnet-1.dossier").mkdir(parents=True)  # as make sample left it
    release = commands[0]
    rc, err = interrupted(*release, after="[  1] ", cwd=tmp_path)
    assert rc == ExitCode.INTERRUPTED, err
    out = Path(release[release.index("--out") + 1])
    assert err.strip().splitlines()[-1] == (
        f"interrupted; finished trials are kept in {out / '.runs' / 'convnet-1'}: run dossier "
        f"release {release[1]} --out {out} again to resume"), err
    for command in commands:  # the release resumes
        r = dossier_run(*command, cwd=tmp_path)
        assert r.returncode == 0, (command, r.stderr)
        if command[0] == "release":
            assert "restored" in r.stderr and r.stdout == f"{out / 'convnet-1.dossier'}\n"
    rc, err = interrupted("verify", out / "convnet-1.dossier", "--rebench", after="OK: ",
                          wait=0.5, cwd=tmp_path)
    assert rc == ExitCode.INTERRUPTED, err
    assert err.strip().splitlines()[-1] == ("interrupted; verify wrote nothing (run it again "
                                            "to check the bundle)")
    assert "tuning cache" not in err
