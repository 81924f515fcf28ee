"""The documentation of docs/ says what the code does: the quick tour's spec is the sample's
file, the exit-code page lists every exit code, and the CLI reference is today's --help."""

from __future__ import annotations

import re

from conftest import ROOT, cli

from dossier.errors import ExitCode

DOCS = ROOT / "docs"


def test_quick_tour_spec_snippet_is_the_file_it_names() -> None:
    page = (DOCS / "quickstart.md").read_text()
    m = re.search(r"A release spec \(`(samples/[\w/]+\.toml)`\).*?```toml\n(.*?)```", page,
                  re.S)
    assert m is not None
    assert m.group(2) == (ROOT / m.group(1)).read_text()


def test_exit_code_page_is_complete() -> None:
    table = (DOCS / "exit-codes.md").read_text().split("# Exit codes", 1)[1].split("\n\n", 1)[0]
    codes = {int(c) for c in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert codes == {int(c) for c in ExitCode}  # schema --check's 1 is ExitCode.DRIFT
    app_help = " ".join(cli("--help", columns=400).output.split())  # as one line
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
