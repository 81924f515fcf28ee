"""The ``html`` format: the explanation as one self-contained HTML page with plots (see
:mod:`dossier.formats.report`; needs the ``report`` extra, plotly). Only ``explain`` has it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dossier.formats.base import Document, Format

if TYPE_CHECKING:
    from dossier.audit.explain import Explanation


class HtmlFormat(Format):
    """The HTML report of ``explain``."""

    name = "html"
    documents = frozenset({Document.explanation})

    def explanation(self, e: Explanation, *, given: Sequence[str] = (),
                    samples: Mapping[int, Sequence[float]] | None = None) -> str:
        from dossier.formats.report import render_report

        return render_report(e, samples or {})
