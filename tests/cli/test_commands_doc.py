"""docs/commands.md, the commands at a glance, names every command of the CLI."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_commands_at_a_glance_lists_every_command() -> None:
    """docs/commands.md names every command of the CLI, each subcommand of a group too."""
    import typer.main

    from dossier_cli.main import app

    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    group = typer.main.get_command(app)
    missing = []
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        subs = getattr(cmd, "commands", None)
        names = [f"{name} {s}" for s in subs] if subs else [name]
        missing += [n for n in names if f"`dossier {n} " not in text and f"`dossier {n}`" not in text]
    assert missing == []
