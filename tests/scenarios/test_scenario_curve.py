"""The latency-throughput chart ``explain`` draws for a scenario, on facts a test writes."""

from __future__ import annotations

from dossier.scenarios.curve import CurvePoint, ScenarioFacts, chart


def _facts() -> ScenarioFacts:
    pts = [CurvePoint(config="one", qps=q, latency_ms=ms, met=ms <= 5)
           for q, ms in ((100, 1.0), (200, 2.0), (400, 30.0))]
    pts += [CurvePoint(config="two", qps=q, latency_ms=ms, met=ms <= 5)
            for q, ms in ((100, 0.8), (300, 1.5), (600, 4.0), (800, 50.0))]
    return ScenarioFacts(scenario="server: p99 <= 5 ms", bound_ms=5.0, percentile=99,
                         percentile_shown=99, baseline="one", shipped="two",
                         metric_qps={"one": 200.0, "two": 600.0}, points=pts, why="because")


def test_the_chart_marks_the_bound_the_runs_and_the_shipped_point() -> None:
    lines = chart(_facts())
    body = "\n".join(lines)
    assert lines[0].startswith("  p99 latency (ms, log scale) against QPS completed; bound 5 ms")
    assert sum(1 for x in lines if "-" * 40 in x and "|" in x) == 1  # the bound's row
    assert body.count("*") == 1  # the shipped point, where B met 600 QPS
    assert "a" in body and "b" in body  # runs that missed the bound: lower case
    assert "  A: one (single-stream choice): 200 QPS" in lines
    assert "  B: two (ships): 600 QPS" in lines
    star_row = next(x for x in lines if "*" in x)
    bound_row = next(x for x in lines if "-" * 40 in x and "|" in x)
    assert lines.index(star_row) > lines.index(bound_row)  # below the bound: lower latency


def test_a_chart_without_latencies_says_so() -> None:
    f = _facts().model_copy(update={"points": []})
    assert chart(f)[0] == "  (no LoadGen run reported a latency)"
