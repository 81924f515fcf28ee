"""The CLI's help text: the selection syntax as trtexec writes it, values named plainly (SPEC,
DIR, N rather than typer's {spec}, <path>, <int range>), and what verify checks and exits with.
What rendering help imports is tests/cli/test_cli_start.py."""

from __future__ import annotations

from conftest import cli

from dossier_cli.main import app


def test_help_keeps_the_selection_syntax() -> None:
    text = " ".join(cli("knobs", "--help", columns=200).output.split())
    assert "-knob=[a|b] varies a knob" in text
    text = " ".join(cli("tune", "--help", columns=200).output.split())
    assert "'-a=[x|y] -b=z'" in text


def test_verify_help_states_signatures_and_exit_codes() -> None:
    text = " ".join(cli("verify", "--help", columns=200).output.split())
    assert 'the signer is checked against --trusted-key only (without one: "signer NOT checked")' \
        in text
    assert "3 bad input" in text and "2 usage" in text


def _help_texts() -> dict[str, str]:
    import typer.main

    def walk(cmd, path: tuple[str, ...]):  # noqa: ANN001, ANN202
        yield path
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, (*path, name))

    return {" ".join(p): cli(*p, "--help", columns=120).output
            for p in walk(typer.main.get_command(app), ())}


def test_help_names_values_plainly() -> None:
    texts = _help_texts()
    assert len(texts) > 20
    for command, text in texts.items():
        for typer_style in ("{", "<path>", "<int", "<list[", "<str>", "<float"):
            assert typer_style not in text, (command, typer_style)
    assert "Usage: dossier release [OPTIONS] SPEC\n" in texts["release"]
    assert "-o, --out DIR" in texts["release"] and "-j, --build-jobs N" in texts["release"]
    assert "--trusted-key PUB" in texts["verify"]
