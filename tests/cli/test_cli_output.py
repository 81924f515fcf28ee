"""What the CLI prints outside a terminal (stdout a pipe, no COLUMNS): no line folded at a
guessed width, and stdout holding the result alone, so that ``B=$(dossier release ...)`` works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, dossier_run, tiny_spec


def test_no_hard_wrapping_outside_a_terminal(convnet_bundle: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    run = [sys.executable, "-m", "dossier_cli.main"]
    table = subprocess.run([*run, "knobs"], capture_output=True, text=True, env=env,
                           cwd=ROOT, check=True).stdout
    names = [k["name"] for k in json.loads(subprocess.run(
        [*run, "knobs", "--json"], capture_output=True, text=True, env=env, cwd=ROOT,
        check=True).stdout)["knobs"]]
    rows = [ln for ln in table.splitlines() if ln.startswith("│")]
    assert len(rows) == len(names)  # one line per knob: nothing folded
    for name, row in zip(names, rows):
        assert f"-{name} " in row and "…" not in row
    text = subprocess.run([*run, "explain", str(convnet_bundle)], capture_output=True,
                          text=True, env=env, cwd=ROOT, check=True).stdout
    lines = text.splitlines()
    rule = lines[lines.index("Decision rule") + 1]  # the rule is one line, however long
    assert len(rule) > 200 and rule.strip().endswith("else the baseline")


def test_stdout_is_the_result_alone_outside_a_terminal(convnet_folder: Path,
                                                       tmp_path: Path) -> None:
    """`B=$(dossier release ...); dossier inspect "$B"` works: no empty line before the path
    (the progress bar printed one on stdout when stdout was not a terminal)."""
    spec = tiny_spec(convnet_folder)
    r = dossier_run("release", spec, "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{tmp_path / 'out' / 'tiny-1.dossier'}\n"
    assert not r.stderr.startswith("\n") and "\n\n" not in r.stderr
    assert dossier_run("inspect", r.stdout.strip()).returncode == 0
    t = dossier_run("tune", spec, "--out", tmp_path / "run")
    assert t.returncode == 0, t.stderr
    assert t.stdout.splitlines()[0] == f"run: {tmp_path / 'run'}"
    rt = dossier_run("retune", r.stdout.strip(), "--out", tmp_path / "next", "--top", "1")
    assert rt.returncode == 0, rt.stderr
    assert rt.stdout.startswith(f"wrote {tmp_path / 'next' / 'tiny-2.dossier'} ")
