"""The formats' vocabulary: their names, the documents they render and the base class each
format implements (:mod:`dossier.formats` finds a format by name)."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from dossier.audit.explain import Explanation
    from dossier.bundle.overview import Overview
    from dossier.verify import VerifyReport


class FormatName(str, enum.Enum):
    """The names of the output formats (``--format``)."""

    text = "text"
    json = "json"
    markdown = "markdown"
    html = "html"


class Document(str, enum.Enum):
    """What a format renders: one document per command."""

    overview = "overview"
    """``inspect``."""
    explanation = "explanation"
    """``explain``."""
    verify = "verify"
    """``verify``."""


class Format:
    """An output format: renders each document it supports to a string.

    A format that does not render a document leaves it out of :attr:`documents` (the CLI refuses
    that ``--format`` in one line before rendering); asked all the same, it raises
    :class:`NotImplementedError`."""

    name: ClassVar[str]
    """The format's name (``--format NAME``)."""
    documents: ClassVar[frozenset[Document]] = frozenset(Document)
    """The documents it renders."""

    def __init__(self, *, color: bool = False, width: int | None = None) -> None:
        """``color`` and ``width`` apply to ``text`` (see :func:`get_format`)."""

    def overview(self, o: Overview) -> str:
        """The ``inspect`` overview."""
        raise NotImplementedError(f"the {self.name} format has no overview")

    def explanation(self, e: Explanation, *, given: Sequence[str] = (),
                    samples: Mapping[int, Sequence[float]] | None = None) -> str:
        """The explanation; ``given``: the volume flags on the command line (the payback says
        where its volume came from); ``samples``: each trial's raw timings (the HTML plots)."""
        raise NotImplementedError(f"the {self.name} format has no explanation")

    def verify_report(self, r: VerifyReport, *, show_all: bool = False,
                      where: str = "this host") -> str:
        """The verify report; ``show_all``: list unchanged fields too; ``where``: the host
        judged, in words."""
        raise NotImplementedError(f"the {self.name} format has no verify report")
