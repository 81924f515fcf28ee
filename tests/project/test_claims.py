"""The tables docs/results.md and docs/timing.md lead with are what bench/claims.py writes from
bench/results: a figure in them that no results file holds, or a results file changed under
them, fails here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _claims() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_claims", ROOT / "bench" / "claims.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_claims"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("doc", ["results", "timing"])
def test_the_docs_lead_with_the_table_the_script_writes(doc: str) -> None:
    claims = _claims()
    text = claims.DOCS[doc].read_text(encoding="utf-8")
    assert claims.current(text) == claims.table(doc), (
        f"docs/{doc}.md's claims table is stale: run python bench/claims.py --write")
    # it leads: nothing but the title and a paragraph or two before it
    assert text.index(claims.BEGIN) < 1200


def test_each_row_is_read_from_its_results_file(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Change a results file and the table changes with it."""
    claims = _claims()
    results = tmp_path / "results"
    results.mkdir()
    for c in claims.CLAIMS:
        (results / c.file).write_bytes((claims.RESULTS / c.file).read_bytes())
    before = claims.table("timing")
    f = results / "calibration-x1.05.json"
    d = json.loads(f.read_text())
    d["shipped"]["hits"] = 7
    f.write_text(json.dumps(d))
    monkeypatch.setattr(claims, "RESULTS", results)
    after = claims.table("timing")
    assert "shipped 10 of 10 (true speedup 1.05x)" in before
    assert "shipped 7 of 10 (true speedup 1.05x)" in after and after != before

