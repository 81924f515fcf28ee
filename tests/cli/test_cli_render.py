"""What reaches the terminal is escaped (``dossier_cli/render.py``'s ``printable``): text from a
bundle's manifest or a registry's error message never brings set-title, clear-screen, colour or
C1 control sequences with it; every control character but tab and newline is shown as ``\\xNN``.

Every case here failed before its fix; the docstrings say what happened."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import _bundles as h
import pytest
from _hostile import CONTROLS, HOSTILE_TEXT, _craft, _no_controls, _ok_version
from conftest import isolate_registry

from dossier.errors import ExitCode


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_registry(monkeypatch, tmp_path)


@pytest.fixture
def hostile_text_bundle(bundle: Path) -> Path:
    def edit(raw: dict[str, Any]) -> None:
        raw["description"] = "release notes " + HOSTILE_TEXT
        raw["warnings"] = ["careful " + HOSTILE_TEXT]
        raw["tuning_host"]["hostname"] = "vm" + HOSTILE_TEXT
    return _craft(bundle, edit)


def test_inspect_escapes_terminal_sequences(hostile_text_bundle: Path) -> None:
    """Before: a set-title sequence, clear-screen and colours from the manifest were printed
    raw."""
    res = h.cli("inspect", hostile_text_bundle)
    assert res.exit_code == 0, h.said(res)
    assert "release notes \\x1b]0;pwned\\x07" in res.stdout
    assert _no_controls(res.stdout) and _no_controls(res.stderr)


def test_diff_escapes_terminal_sequences(hostile_text_bundle: Path) -> None:
    res = h.cli("diff", h.GOLDEN, hostile_text_bundle)
    assert res.exit_code == 0, h.said(res)
    assert "\\x1b" in res.stdout
    assert _no_controls(res.stdout) and _no_controls(res.stderr)


@pytest.mark.parametrize("command", ["pull", "verify"])
def test_pull_and_verify_ref_escape_a_registrys_error_message(hostile: Any, tmp_path: Path,
                                                              command: str) -> None:
    """The registry's own words (an OCI error message) reach the terminal escaped, C1 controls
    (a one-character CSI) included."""
    pytest.importorskip("oras")
    body = json.dumps({"errors": [{"code": "MANIFEST_UNKNOWN",
                                   "message": "gone " + HOSTILE_TEXT}]}).encode()

    def behave(handler: Any) -> None:
        if not _ok_version(handler):
            handler.send_response(404)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)

    server = hostile(behave)
    ref = f"127.0.0.1:{server.port}/ml/x:1"
    args = ["pull", ref, "--out", tmp_path / "out"] if command == "pull" else ["verify", ref]
    res = h.cli(*args, "--insecure")
    assert res.exit_code == ExitCode.NOT_FOUND, h.said(res)
    assert "gone" in res.stderr and "\\x9b2J" in res.stderr
    assert _no_controls(res.stdout) and _no_controls(res.stderr)


def test_printable_escapes_every_control_but_tab_and_newline() -> None:
    from dossier_cli.render import printable

    assert printable("a\tb\nc") == "a\tb\nc"
    assert printable(HOSTILE_TEXT) == "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mred\\x9b2J\\x0d"
    assert _no_controls(printable("".join(CONTROLS)))
