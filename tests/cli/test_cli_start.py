"""The CLI starts without the library's heavy imports: building the app and rendering help
(the root's, and every command's) loads no numpy, pyarrow, onnxruntime, torch or scipy, and none
of the tuner or the backends; a command imports those in its body, when it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ["numpy", "pyarrow", "onnxruntime", "onnx", "torch", "scipy", "dossier.tuner",
         "dossier.backends", "dossier.bundle", "dossier.trial"]

_PROBE = """
import json, sys
from typer.main import get_command
from typer.testing import CliRunner
from dossier_cli.main import app
group = get_command(app)
runner = CliRunner()
helps = [[]] + [[name, "--help"] for name in group.commands] + [["import", "trtexec", "--help"]]
codes = {" ".join(args) or "--help": runner.invoke(app, args or ["--help"]).exit_code
         for args in helps}
print(json.dumps({"codes": codes, "loaded": [m for m in %r if m in sys.modules],
                  "commands": sorted(group.commands)}))
"""


def _probe(before: str = "") -> dict[str, object]:
    res = subprocess.run([sys.executable, "-c", before + _PROBE % HEAVY], capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    data: dict[str, object] = json.loads(res.stdout.splitlines()[-1])
    return data


@pytest.fixture(scope="module")
def probe() -> dict[str, object]:
    return _probe()


def test_help_of_every_command_renders(probe: dict[str, object]) -> None:
    codes, commands = probe["codes"], probe["commands"]
    assert isinstance(codes, dict) and isinstance(commands, list)
    assert {"verify", "tune", "release", "bundle", "explain", "schema"} <= set(commands)
    assert codes and all(code == 0 for code in codes.values()), codes


def test_help_loads_none_of_the_heavy_modules(probe: dict[str, object]) -> None:
    assert probe["loaded"] == [], f"imported while only rendering help: {probe['loaded']}"


def test_the_probe_sees_a_heavy_import() -> None:
    """The probe can fail: numpy imported before the app is built shows up."""
    assert _probe("import numpy\n")["loaded"] == ["numpy"]


_RUN = """
import runpy, sys
sys.argv = ["dossier", *sys.argv[1:]]
try:
    runpy.run_module("dossier_cli.main", run_name="__main__")
except SystemExit:
    pass
sys.stderr.write("\\nLOADED " + " ".join(m for m in %r if m in sys.modules))
"""


def _loaded(*args: str, watch: tuple[str, ...]) -> tuple[str, list[str]]:
    """What the command printed on stdout, and which of ``watch`` it imported."""
    res = subprocess.run([sys.executable, "-c", _RUN % (watch,), *args], capture_output=True,
                         text=True, timeout=120, check=False)
    return res.stdout, res.stderr.rsplit("LOADED", 1)[-1].split()


def test_root_help_imports_neither_rich_nor_pydantic() -> None:
    """Plain help (typer's rich help imports rich's Markdown and traceback renderers): the root
    help lists every command with its whole first paragraph."""
    text, loaded = _loaded("--help", watch=("rich", "pydantic", "dossier.bundle"))
    assert loaded == []
    assert "Commands:" in text and "verify" in text and "[bold]" not in text
    assert "trial counts, warnings and the tuning host." in " ".join(text.split())  # not cut


def test_integrity_check_imports_neither_rich_nor_signing() -> None:
    golden = Path(__file__).parents[1] / "assets" / "golden" / "convnet-1.dossier"
    _, loaded = _loaded("verify", str(golden), "--integrity-only",
                        watch=("rich", "dossier.trust.signing", "dossier.bundle", "pydantic"))
    assert loaded == ["dossier.bundle", "pydantic"]  # the manifest is read: the probe sees it
