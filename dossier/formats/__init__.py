"""Output formats of ``inspect``, ``explain`` and ``verify``: one renderer class per format,
chosen by name (:func:`get_format`).

Each format renders a document to a string; nothing here prints. The documents are the
:class:`~dossier.bundle.overview.Overview` (``inspect``), the
:class:`~dossier.audit.explain.Explanation` (``explain``) and the
:class:`~dossier.verify.VerifyReport` (``verify``). The formats:

- ``text``: the terminal report (:mod:`dossier.formats.text`), coloured only when asked;
- ``json``: the document's model as JSON (:mod:`dossier.formats.json`), as ``--json`` prints it;
- ``markdown``: GitHub-flavoured Markdown with tables, for a CI job summary
  (``$GITHUB_STEP_SUMMARY``) or a pull-request comment (:mod:`dossier.formats.markdown`);
- ``html``: the self-contained HTML report, for ``explain`` only (:mod:`dossier.formats.html`).

The figures shown by more than one format come from :mod:`dossier.formats.figures`, so a
figure reads the same, under the same name, in each. Importing this package is cheap (no
pydantic, no rich): a format's module is imported when :func:`get_format` first asks for it.
"""

from __future__ import annotations

import importlib

from dossier.formats.base import Document, Format, FormatName

_CLASSES = {FormatName.text: ("dossier.formats.text", "TextFormat"),
            FormatName.json: ("dossier.formats.json", "JsonFormat"),
            FormatName.markdown: ("dossier.formats.markdown", "MarkdownFormat"),
            FormatName.html: ("dossier.formats.html", "HtmlFormat")}
"""Format name -> (module, class), imported on first use."""


def format_class(name: FormatName | str) -> type[Format]:
    """The class of the format named ``name``; ValueError for an unknown name."""
    module, cls = _CLASSES[FormatName(name)]
    found: type[Format] = getattr(importlib.import_module(module), cls)
    return found


def get_format(name: FormatName | str, *, color: bool = False,
               width: int | None = None) -> Format:
    """The format named ``name``. ``color`` and ``width`` apply to ``text`` (ANSI colours for
    a terminal; the width tables fold to, default: never folded); the others ignore them."""
    return format_class(name)(color=color, width=width)


__all__ = ["Document", "Format", "FormatName", "format_class", "get_format"]
