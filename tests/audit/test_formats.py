"""Output formats of inspect, explain and verify (dossier/formats/): one class per format chosen
by name; ``--format json`` is ``--json``; the Markdown is GitHub-flavoured tables that hold
whatever a bundle says; a figure reads the same under the same name in every format;
``--output`` is written whole or not at all."""

from __future__ import annotations

import errno
import json
import re
import shutil
from pathlib import Path

import _bundles as h
import jsonschema
import pytest
from conftest import cli
from markdown_it import MarkdownIt

from dossier.bundle import Overview, open_bundle
from dossier.bundle.overview import overview_of
from dossier.errors import ExitCode
from dossier.formats import Document, Format, FormatName, format_class, get_format
from dossier.formats import figures as fig
from dossier.formats.escaping import markdown as md
from dossier.formats.markdown import MarkdownFormat
from dossier.formats.text import TextFormat
from dossier.schema import packaged_schema

GOLDEN = h.GOLDEN
ANSI = re.compile(r"\x1b\[[0-9;]*m")
OLD_KEYS = ["bundle", "release", "version", "description", "dossier_id", "parent", "created_at",
            "format_version", "tool_version", "backend", "tuner_version", "model", "strategy",
            "selection", "metric", "threshold", "atol", "rtol", "validation_pairs",
            "engine_version", "baseline", "winner", "baseline_engine", "gain", "speedup",
            "result", "reason", "decision_rule", "runner_up", "accuracy_by_output", "aa",
            "confirm_aa", "load", "trials", "confirm_trials", "search_wall_s", "build_s_total",
            "warnings", "notes", "tuning_host"]
"""The keys ``inspect --json`` printed, in order, before the overview had a model."""


def _overview(path: Path = GOLDEN) -> Overview:
    with open_bundle(path, lazy=True) as b:
        return overview_of(b)


def _gfm(text: str) -> tuple[str, list[list[list[str]]]]:
    """The HTML a GitHub-flavoured parser makes of ``text``, and each table's rows of cells
    (header row first), as text."""
    parser = MarkdownIt("commonmark").enable("table")
    tokens = parser.parse(text)
    tables: list[list[list[str]]] = []
    row: list[str] | None = None
    for i, t in enumerate(tokens):
        if t.type == "table_open":
            tables.append([])
        elif t.type == "tr_open":
            row = []
        elif t.type == "tr_close" and row is not None:
            tables[-1].append(row)
            row = None
        elif t.type in ("th_open", "td_open") and row is not None:
            inline = tokens[i + 1]
            row.append(inline.content if inline.type == "inline" else "")
    return parser.render(text), tables


def _unescape(cell: str) -> str:
    """A cell's Markdown source as the text it shows (backslash escapes removed)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", cell)


# ---------------------------------------------------------------------------------- the axis
def test_each_format_is_a_class_chosen_by_name() -> None:
    for name in FormatName:
        cls = format_class(name)
        assert issubclass(cls, Format) and cls.name == name.value
        assert isinstance(get_format(name.value), cls)
    assert all(format_class(n).documents == frozenset(Document)
               for n in ("text", "json", "markdown"))
    html = get_format("html")
    assert Document.explanation in html.documents and Document.overview not in html.documents
    with pytest.raises(NotImplementedError, match="html format has no overview"):
        html.overview(_overview())
    with pytest.raises(ValueError):
        format_class("xml")


def test_each_format_renders_every_document_it_claims() -> None:
    """The base class's renderers refuse (NotImplementedError); a format claiming a document
    must have its own, and the CLI offers a format only for the documents it claims."""
    method = {Document.overview: "overview", Document.explanation: "explanation",
              Document.verify: "verify_report"}
    assert set(method) == set(Document)
    for name in FormatName:
        cls = format_class(name)
        for document, attr in method.items():
            own = getattr(cls, attr) is not getattr(Format, attr)
            assert own == (document in cls.documents), (name, document)


def test_inspect_json_is_the_overview_model_with_the_old_keys_and_its_schema() -> None:
    as_json, as_format = cli("inspect", GOLDEN, "--json"), cli("inspect", GOLDEN, "--format",
                                                              "json")
    assert as_json.exit_code == as_format.exit_code == 0
    assert as_json.stdout == as_format.stdout
    data = json.loads(as_json.stdout)
    # the old keys first, in their order; what came since is optional
    assert list(data)[:len(OLD_KEYS)] == OLD_KEYS
    assert list(data)[len(OLD_KEYS):] == ["shipped_latency", "baseline_latency", "conditions",
                                          "conditions_of", "data_sets", "holdout_check", "target",
                                          "target_note"]
    assert Overview.model_validate(data) == _overview()
    schema = packaged_schema("bundle-overview.schema.json")
    jsonschema.validate(data, schema)
    assert schema["additionalProperties"] is False and set(schema["required"]) == set(OLD_KEYS)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**data, "winner": {**data["winner"], "route": 3}}, schema)


def test_json_and_format_json_agree_for_explain_and_verify() -> None:
    for command in (("explain", GOLDEN), ("verify", GOLDEN, "--host-fingerprint",
                                          GOLDEN / "fingerprint.json")):
        a, b = cli(*command, "--json"), cli(*command, "--format", "json")
        assert a.exit_code == b.exit_code and a.stdout == b.stdout and json.loads(a.stdout)


def test_conflicting_or_missing_formats_are_usage_errors(tmp_path: Path) -> None:
    target = tmp_path / "report.md"
    for args, said in (
            (("inspect", GOLDEN, "--json", "--format", "markdown"), "--json is --format json"),
            (("inspect", GOLDEN, "--format", "html"), "inspect has no html output"),
            (("verify", GOLDEN, "--format", "html"), "verify has no html output"),
            (("inspect", GOLDEN, "--format", "xml"), "xml")):
        res = cli(*args, "--output", target)
        assert res.exit_code == ExitCode.USAGE and said in res.stderr, res.stderr
        assert not target.exists() and res.stdout == ""
    assert cli("inspect", GOLDEN, "--format", "MarkDown").exit_code == 0  # any case


# ------------------------------------------------------------------------- the same figures
def test_a_figure_is_the_same_under_the_same_name_in_text_and_markdown() -> None:
    o = _overview()
    text = cli("inspect", GOLDEN).stdout
    markdown = cli("inspect", GOLDEN, "--format", "markdown").stdout
    html, tables = _gfm(markdown)
    assert len(tables) == 1 and tables[0][0] == ["field", "value"]
    cells = [(_unescape(a), _unescape(b)) for a, b in tables[0][1:]]
    rows = fig.overview_rows(o)
    assert cells == rows and len(rows) > 10
    for label, value in rows:
        assert f"{label.ljust(12)} {value}" in text
    assert o.baseline_latency is not None  # the golden bundle's baseline, per inference
    baseline = o.baseline_latency.text()
    assert "ms per inference" in baseline and dict(rows)["baseline"].endswith(baseline)
    explain_text = cli("explain", GOLDEN).stdout
    explain_md = cli("explain", GOLDEN, "--format", "markdown").stdout
    assert baseline in explain_text
    assert baseline in _unescape(explain_md)


def test_text_is_the_same_with_or_without_colour() -> None:
    o = _overview()
    with open_bundle(GOLDEN, lazy=True) as b:
        from dossier.audit import explain

        e = explain(b)
    plain, coloured = TextFormat(), TextFormat(color=True)
    assert "\x1b[" not in plain.explanation(e)
    assert "\x1b[" in coloured.explanation(e)
    assert ANSI.sub("", coloured.explanation(e)) == plain.explanation(e)
    assert plain.overview(o) == cli("inspect", GOLDEN).stdout


# ---------------------------------------------------------------------------------- markdown
HOSTILE = "a|b <script>alert(1)</script> [x](http://evil) **bold** `code` \x1b[2J\nnext"


def test_markdown_holds_hostile_text_in_its_cell() -> None:
    """A description, a warning and a route with pipes, HTML, links, emphasis, a control
    character and a line break stay literal text, each in its one cell."""
    o = _overview()
    hostile = o.model_copy(update={
        "description": HOSTILE, "warnings": [HOSTILE, "- 1. # not a list"],
        "winner": o.winner.model_copy(update={"route": HOSTILE})})
    page = MarkdownFormat().overview(hostile)
    html, tables = _gfm(page)
    assert "<script" not in html and "<a " not in html and "<strong>" not in html
    assert "<code>" not in html and "\x1b" not in page and "<ul>" not in html
    assert len(tables) == 1 and all(len(r) == 2 for r in tables[0])
    cells = {_unescape(a): _unescape(b) for a, b in tables[0][1:] if a != "warning"}
    printable_hostile = HOSTILE.replace("\x1b", "\\x1b").replace("\n", " ")
    assert cells["shipped"] == printable_hostile + "  (the baseline)"
    warnings = [_unescape(b) for a, b in tables[0][1:] if a == "warning"]
    assert warnings == [printable_hostile, "- 1. # not a list"]
    assert html.count("<h2>") == 1 and printable_hostile.replace("<", "&lt;").replace(
        ">", "&gt;") in html


@pytest.mark.parametrize("text", ["-a=x -b=p", "- item", "1. one", "# h", "=== ", "> q", "+",
                                  "x | y", "a\\b", "~~s~~", "&amp;", "$x$", "12) z"])
def test_markdown_escape_shows_the_text_as_it_is(text: str) -> None:
    html = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(md(text))
    shown = re.sub(r"</?p>", "", html).strip()
    assert shown == text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").strip()


def test_explain_and_verify_markdown_are_tables_that_parse(tmp_path: Path) -> None:
    page = cli("explain", GOLDEN, "--format", "markdown").stdout
    html, tables = _gfm(page)
    assert html.startswith("<h2>convnet version 1: why this route</h2>")
    assert len(tables) >= 5 and all(len({len(r) for r in t}) == 1 for t in tables)
    assert ["knob", "baseline value", "value", "speedup", "p", "verdict", "measured",
            "trial"] in [
        t[0] for t in tables]
    res = cli("verify", GOLDEN, "--host-fingerprint", GOLDEN / "fingerprint.json", "--format",
              "markdown", "--all")
    assert res.exit_code == 0
    html, tables = _gfm(res.stdout)
    assert "<h2>verify: convnet-1 (onnxruntime) on the host of" in html
    assert "<strong>verdict: VALID</strong> (exit 0)" in html
    steps, env = tables
    assert steps[0] == ["step", "outcome", "detail"] and [r[0] for r in steps[1:]] == [
        "fetch", "signature", "integrity", "environment", "recheck", "rebench"]
    assert env[0] == ["field", "bundle", "host", "verdict", "reason"] and len(env) > 20
    assert all(r[3] == "VALID" for r in env[1:])


def test_a_refused_verify_is_reported_in_markdown(tmp_path: Path) -> None:
    bundle = h.copy_bundle(GOLDEN, tmp_path)
    (bundle / "knobs.json").write_text("{}")  # altered: integrity fails
    out = tmp_path / "summary.md"
    res = cli("verify", bundle, "--format", "markdown", "--output", out)
    assert res.exit_code == ExitCode.BUNDLE
    html, tables = _gfm(out.read_text())
    assert ": refused</h2>" in html and "<strong>refused</strong> (exit 6)" in html
    assert any(r[:2] == ["integrity", "failed"] and "knobs.json" in r[2] for r in tables[0])


def test_explain_markdown_of_a_search_with_rejected_trials(tmp_path_factory: pytest.TempPathFactory,
                                                           samples_dir: Path) -> None:
    from test_explain import make_bundle

    bundle = make_bundle(tmp_path_factory.mktemp("formats"), samples_dir, "faulty")
    text = cli("explain", bundle).stdout
    html, tables = _gfm(cli("explain", bundle, "--format", "markdown").stdout)
    rejected = next(t for t in tables if t[0][:3] == ["trial", "outcome", "route"])
    assert len(rejected) > 1
    for trial, outcome, route, *_ in rejected[1:]:  # the same trials as the text says
        assert f"{_unescape(trial)} {_unescape(outcome)} {_unescape(route)}" in text


# ---------------------------------------------------------------------------------- --output
def test_output_writes_the_report_instead_of_stdout(tmp_path: Path) -> None:
    for command, fmt in (("inspect", "markdown"), ("explain", "text"), ("inspect", "json")):
        target = tmp_path / f"{command}.{fmt}"
        res = cli(command, GOLDEN, "--format", fmt, "--output", target)
        assert res.exit_code == 0 and res.stdout == "" and f"wrote {target}" in res.stderr
        assert target.read_text() == cli(command, GOLDEN, "--format", fmt).stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["explain.text", "inspect.json",
                                                          "inspect.markdown"]


def test_output_is_whole_or_not_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "summary.md"
    target.write_text("the old summary\n")
    folder = tmp_path / "reports"
    folder.mkdir()
    res = cli("inspect", GOLDEN, "--format", "markdown", "--output", folder)
    assert res.exit_code == ExitCode.OUTPUT and "is a folder" in res.stderr
    assert list(folder.iterdir()) == []

    import dossier.formats.output as output

    def full(path: Path, data: bytes) -> None:
        Path(path).write_bytes(data[: len(data) // 2])  # half of it, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(output, "write_durable", full)
    res = cli("inspect", GOLDEN, "--format", "markdown", "--output", target)
    assert res.exit_code == ExitCode.DISK_FULL, res.stderr
    assert target.read_text() == "the old summary\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reports", "summary.md"]


def test_explain_html_on_stdout_or_into_a_file(tmp_path: Path) -> None:
    pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")
    page = tmp_path / "report.html"
    res = cli("explain", GOLDEN, "--format", "html", "--output", page)
    assert res.exit_code == 0 and res.stdout == ""
    text = page.read_text()
    assert text.lstrip().lower().startswith("<!doctype html") and "</html>" in text
    res = cli("explain", GOLDEN, "--format", "html")
    assert res.exit_code == 0 and res.stdout.lstrip().lower().startswith("<!doctype html")
    also = tmp_path / "also.html"  # --html FILE still writes the page beside the text
    res = cli("explain", GOLDEN, "--html", also, "--format", "markdown")
    assert res.exit_code == 0 and res.stdout.startswith("## convnet version 1")
    assert also.read_text().lstrip().lower().startswith("<!doctype html")


def test_integrity_only_text_prints_no_report(tmp_path: Path) -> None:
    res = cli("verify", GOLDEN, "--integrity-only")
    assert res.exit_code == 0 and res.stdout == "" and "OK:" in res.stderr
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    res = cli("verify", GOLDEN, "--integrity-only", "--format", "markdown")
    assert res.exit_code == 0 and ": integrity checked</h2>" in _gfm(res.stdout)[0]
