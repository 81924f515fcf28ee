"""Route text and selection parsing (trtexec --tuneBuildRoutes syntax)."""

from __future__ import annotations

import pytest

from dossier.errors import SelectionError
from dossier.knobs import Knob, KnobDatabase
from dossier.routes import Route, Selection

DB = KnobDatabase(backend="test", tuner_version="1", knobs=(
    Knob(name="alpha", values=("a", "b", "c"), default="a"),
    Knob(name="beta", values=("on", "off"), default="on"),
    Knob(name="ns:gamma", values=("1", "2"), default="2"),
    Knob(name="width", values=None, default="0", value_hint="int32_t"),
))


def test_route_text_is_sorted_by_name_and_round_trips() -> None:
    r = Route.of({"beta": "off", "alpha": "c"})
    assert r.text() == "-alpha=c -beta=off"
    assert Route.parse(r.text(), DB) == r
    assert str(Route.of({})) == "(default route)"


def test_route_effective_and_non_default() -> None:
    r = Route.parse("-alpha=a -beta=off", DB)
    assert r.effective(DB) == {"alpha": "a", "beta": "off", "ns:gamma": "2", "width": "0"}
    assert r.non_default(DB) == {"beta": "off"}


def test_selection_parses_varied_and_pinned_in_user_order() -> None:
    s = Selection.parse("-beta=[off|on]  -alpha=c -ns:gamma=[1|2] -width=64", DB)
    assert [(i.knob, i.values, i.pinned) for i in s.items] == [
        ("beta", ("off", "on"), False), ("alpha", ("c",), True),
        ("ns:gamma", ("1", "2"), False), ("width", ("64",), True)]
    assert s.text() == "-beta=[off|on] -alpha=c -ns:gamma=[1|2] -width=64"
    # trtexec baseline: pinned knobs pinned, varied knobs at the database default
    assert s.baseline(DB).as_dict() == {"alpha": "c", "beta": "on", "ns:gamma": "2", "width": "64"}


@pytest.mark.parametrize(("text", "message"), [
    ("", "the selection is empty"),
    ("   ", "the selection is empty"),
    ("-alhpa=[a|b]", "unknown knob -alhpa"),
    ("-alpha=[a|z]", "value 'z' is not allowed for -alpha"),
    ("-alpha=z", "value 'z' is not allowed for -alpha"),
    ("-alpha=[a|b] -alpha=c", "appears twice"),
    ("-alpha=[a|a]", "listed twice"),
    ("-alpha=[]", "empty value"),
    ("-alpha=[a|]", "empty value"),
    ("-alpha=", "empty value"),
    ("alpha=[a|b]", "is not -knob=value"),
    ("-alpha", "is not -knob=value"),
    ("-width=[1|2]", "unbounded values (int32_t) and cannot be swept"),
])
def test_selection_errors(text: str, message: str) -> None:
    with pytest.raises(SelectionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Selection.parse(text, DB)


def test_unknown_knob_suggests_close_names() -> None:
    with pytest.raises(SelectionError) as info:
        Selection.parse("-btea=[on|off]", DB)
    assert "did you mean -beta" in info.value.diagnostics()


def test_unbounded_knob_can_be_pinned_to_any_value() -> None:
    assert Selection.parse("-width=12345", DB).items[0].values == ("12345",)
