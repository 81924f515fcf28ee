"""First contact: what a new user runs first behaves as the README and the documentation say
(relative paths, a file where a folder is expected, help text, knob names with their dash, output
outside a terminal, the Makefile, the snippets of the README and of docs/, and exit codes)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dossier.errors import ExitCode
from dossier_cli.main import app
from tests.conftest import ROOT
from tests.test_explain import make_bundle

README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


def _cli(*args: object, **kw):  # noqa: ANN202
    return CliRunner().invoke(app, [str(a) for a in args], **kw)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, samples_dir: Path) -> Path:
    return make_bundle(tmp_path_factory.mktemp("first"), samples_dir, "convnet")


def test_retune_with_a_relative_out(bundle: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = _cli("retune", bundle, "--out", "releases/", "--top", "1", "--quiet")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "releases" / "convnet-convnet-2.dossier" / "manifest.json").is_file()


def test_a_failed_retune_leaves_nothing(bundle: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("other.onnx").write_bytes(b"not the model")
    r = _cli("retune", bundle, "--out", "releases", "--model", "other.onnx")
    assert r.exit_code == ExitCode.INPUT and "is not the bundle's model" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.onnx"]


def test_tune_out_that_is_a_file(sample, tmp_path: Path) -> None:
    spec, _ = sample("convnet")
    target = tmp_path / "taken"
    target.write_text("x")
    r = _cli("tune", spec, "--out", target)
    assert r.exit_code == ExitCode.OUTPUT, r.output
    assert r.output.strip().startswith("error: --out") and len(r.output.strip().splitlines()) == 1
    assert target.read_text() == "x"


def test_explain_html_into_a_folder_and_file_mode(bundle: Path, tmp_path: Path) -> None:
    pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")
    folder = tmp_path / "reports"
    folder.mkdir()
    r = _cli("explain", bundle, "--html", folder)
    assert r.exit_code == ExitCode.OUTPUT and "is a folder" in r.output
    assert list(folder.iterdir()) == [] and list(tmp_path.iterdir()) == [folder]
    old = os.umask(0o022)
    try:
        assert _cli("explain", bundle, "--html", folder / "r.html").exit_code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((folder / "r.html").stat().st_mode) == 0o644
    assert [p.name for p in folder.iterdir()] == ["r.html"]


def test_help_keeps_the_selection_syntax() -> None:
    text = " ".join(_cli("knobs", "--help", env={"COLUMNS": "200"}).output.split())
    assert "-knob=[a|b] varies a knob" in text
    text = " ".join(_cli("tune", "--help", env={"COLUMNS": "200"}).output.split())
    assert "'-a=[x|y] -b=z'" in text


def test_knobs_takes_the_name_as_the_table_prints_it() -> None:
    for name in ("-optimizer:NchwcTransformer", "optimizer:NchwcTransformer"):
        r = _cli("knobs", name, "--json")
        assert r.exit_code == 0, r.output
        assert [k["name"] for k in json.loads(r.stdout)["knobs"]] == ["optimizer:NchwcTransformer"]
    r = _cli("knobs", "-optimizer:NoSuchThing")
    assert r.exit_code == ExitCode.INPUT and "unknown knob" in r.output


def test_no_hard_wrapping_outside_a_terminal(bundle: Path) -> None:
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
    text = subprocess.run([*run, "explain", str(bundle)], capture_output=True, text=True,
                          env=env, cwd=ROOT, check=True).stdout
    rule = next(ln for ln in text.splitlines() if ln.strip().startswith("the A/A trial"))
    assert rule.strip().endswith("else the baseline")  # the rule is one line, however long


def test_make_sample_installs_no_torch_and_removes_a_stale_signature() -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")

    def dry(target: str) -> str:
        return subprocess.run(["make", "-n", "-B", target], capture_output=True, text=True,
                              cwd=ROOT, check=True).stdout

    assert "torch" not in dry("sample")
    assert "install -q 'torch==" in dry("setup") and "install -q 'torch==" in dry("test")
    assert "install -q 'torch" not in subprocess.run(["make", "-n", "-B", "setup", "TORCH="],
                                         capture_output=True, text=True, cwd=ROOT,
                                         check=True).stdout
    assert re.search(r"rm -rf .*out/convnet-1\.dossier\.sig\.json", dry("sample"))


def test_quick_tour_spec_snippet_is_the_file_it_names() -> None:
    page = (DOCS / "quickstart.md").read_text()
    m = re.search(r"A release spec \(`(samples/[\w/]+\.toml)`\).*?```toml\n(.*?)```", page,
                  re.S)
    assert m is not None
    assert m.group(2) == (ROOT / m.group(1)).read_text()


def test_readme_spec_snippet_runs_beside_the_sample(samples_dir: Path, tmp_path: Path) -> None:
    """The README's short spec, saved in the sample's folder as it says, is a spec `tune`
    takes: its dry run lists the routes of its selection, baseline first."""
    snippets = re.findall(r"```toml\n(.*?)```", README, re.S)
    assert len(snippets) == 1 and len(snippets[0].splitlines()) <= 10
    folder = tmp_path / "convnet"
    shutil.copytree(samples_dir / "convnet", folder)
    (folder / "mine.toml").write_text(snippets[0])
    r = _cli("tune", folder / "mine.toml", "--dry-run", "--json")
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


def test_readme_first_release_commands_exist() -> None:
    block = README.split("## A first release", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [ln.split()[1] for ln in block.splitlines() if ln.startswith("dossier ")]
    assert commands == ["release", "verify", "explain"]
    for command in commands:
        assert _cli(command, "--help").exit_code == 0


def test_exit_code_page_is_complete() -> None:
    table = (DOCS / "exit-codes.md").read_text().split("# Exit codes", 1)[1].split("\n\n", 1)[0]
    codes = {int(c) for c in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert codes == {int(c) for c in ExitCode} | {1}
    app_help = " ".join(_cli("--help", env={"COLUMNS": "400"}).output.split())  # as one line
    for code in codes:
        assert re.search(rf"\b{code} [A-Za-z]", app_help), code


def test_cli_reference_page_is_current() -> None:
    """docs/cli.md is what docs/gen_cli.py writes from today's --help (the docs build checks it
    too, where mkdocs is installed)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_cli", DOCS / "gen_cli.py")
    assert spec and spec.loader
    gen_cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_cli)
    assert (DOCS / "cli.md").read_text() == gen_cli.render(), "run python docs/gen_cli.py"
