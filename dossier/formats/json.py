"""The ``json`` format: the document's model as JSON (what ``--json`` prints).

The overview's schema is ``schemas/bundle-overview.schema.json``, the explanation's
``schemas/explanation.v1.schema.json``, the verify report's ``schemas/verify-report.schema.json``.
NaN and infinities are written as null, so the text is valid JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dossier.formats.base import Document, Format

if TYPE_CHECKING:
    from pydantic import BaseModel

    from dossier.audit.explain import Explanation
    from dossier.bundle.overview import Overview
    from dossier.verify import VerifyReport


def dump(model: BaseModel) -> str:
    """A model as indented JSON text, with a trailing newline."""
    return model.model_dump_json(indent=2) + "\n"


class JsonFormat(Format):
    """The document's model as JSON."""

    name = "json"
    documents = frozenset(Document)

    def overview(self, o: Overview) -> str:
        return dump(o)

    def explanation(self, e: Explanation, *, given: Sequence[str] = (),
                    samples: Mapping[int, Sequence[float]] | None = None) -> str:
        return dump(e)

    def verify_report(self, r: VerifyReport, *, show_all: bool = False,
                      where: str = "this host") -> str:
        return dump(r)
