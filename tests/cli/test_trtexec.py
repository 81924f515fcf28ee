"""dossier.backends.tensorrt.trtexec: reading, judging and writing trtexec tuning caches.

The cache text below follows the documented format of TensorRT 11.1's ``--tuningCacheFile``
(header fields and iteration fields as trtexec's writeTuningCacheHeader/Iteration write them,
per the source reading in the project's reference notes). It is written by hand, not captured
from a trtexec run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dossier.backends.tensorrt.trtexec import (
    LAST_PAIR,
    METRICS,
    TrtexecCacheError,
    TrtexecHeader,
    TrtexecIteration,
    hash_header_files,
    make_trtexec_header,
    read_trtexec_cache,
    to_trial_records,
    to_trtexec_iterations,
    trtexec_winner,
    write_trtexec_cache,
)
from dossier.cache import FileIdentity
from dossier.errors import DossierError, InputError, OutputError
from dossier.hashing import digest_file
from dossier.routes import Route
from dossier.trial import Outcome, TimingSummary, TrialRecord

EPSILON = 0.01


def _header(**files: object) -> dict:
    return {
        "tuner_version": "2.19.15",
        "accuracy_algorithm": "L0",
        "accuracy_parameter": {"atol": 1e-05, "rtol": 1e-05, "epsilon": EPSILON},
        "searching_algorithm": "fast",
        "command_line": "trtexec --onnx=model.onnx --tuneBuildRoutes='...' --tuningCacheFile=c.jsonl",
        "default_build_route": "-conv_use_long_w=on -kgen:codegen:cuda_tile=0 -kgen:tiling=auto "
                               "-match_ragged_mha=off",
        "tuning_expr": "-conv_use_long_w=[on|off] -kgen:tiling=[none|aggressive] "
                       "-kgen:codegen:cuda_tile=[0|1]",
        "files": {"onnx": "/data/model.onnx", "save_engine": "/data/best.plan",
                  "inputs": {"x": "/data/x.bin"}, "ref_outputs": {"y": "/data/y.bin"}, **files},
        "argv": ["/usr/bin/trtexec", "--onnx=/data/model.onnx", "--saveEngine=/data/best.plan"],
    }


# A fast search: the baseline, then one-offs right to left. Row 1 is a failed build, row 2 a
# crash, row 3 an accuracy failure (crash false, exit status 1, loss >= epsilon) that is the
# fastest of all, row 4 the fastest admissible route.
ITERATIONS = [
    {"iter": 0, "build_route": "-conv_use_long_w=on -kgen:codegen:cuda_tile=0 -kgen:tiling=auto",
     "crash": False, "error_message": "", "accuracy_loss": {"y": 0.0, "z": 0.001},
     "gpu_time": 1.5},
    {"iter": 1, "build_route": "-conv_use_long_w=on -kgen:codegen:cuda_tile=1 -kgen:tiling=auto",
     "crash": True, "error_message": "IBuilderConfig::setBuildRoute failed for: "
     "-conv_use_long_w=on -kgen:codegen:cuda_tile=1 -kgen:tiling=auto",
     "accuracy_loss": None, "gpu_time": None},
    {"iter": 2, "build_route": "-conv_use_long_w=on -kgen:codegen:cuda_tile=0 -kgen:tiling=none",
     "crash": True, "error_message": "child terminated by signal 11", "accuracy_loss": None,
     "gpu_time": None},
    {"iter": 3, "build_route": "-conv_use_long_w=on -kgen:codegen:cuda_tile=0 "
     "-kgen:tiling=aggressive", "crash": False, "error_message": "child exited with status 1",
     "accuracy_loss": {"y": 0.25, "z": 0.0}, "gpu_time": 0.9},
    {"iter": 4, "build_route": "-conv_use_long_w=off -kgen:codegen:cuda_tile=0 -kgen:tiling=auto",
     "crash": False, "error_message": "", "accuracy_loss": {"y": 0.002, "z": 0.0},
     "gpu_time": 1.2},
]


def _cache_text(header: dict | None = None, rows: list[dict] | None = None) -> str:
    lines = [json.dumps(header or _header())] + [json.dumps(r) for r in (rows or ITERATIONS)]
    return "\n".join(lines) + "\n"


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    path = tmp_path / "tuning-cache.jsonl"
    path.write_text(_cache_text())
    return path


# ------------------------------------------------------------------------------------ reading

def test_read_header_and_iterations(cache):
    header, its = read_trtexec_cache(cache)
    assert header.tuner_version == "2.19.15"
    assert header.metric == "l0"
    assert header.epsilon == EPSILON
    assert header.searching_algorithm == "fast"
    assert header.files.inputs == {"x": "/data/x.bin"}
    assert [it.iter for it in its] == [0, 1, 2, 3, 4]
    assert its[3].accuracy_loss == {"y": 0.25, "z": 0.0}
    assert its[1].gpu_time is None


def test_metric_mapping():
    assert METRICS == {"L0": "l0", "L1": "l1", "L2": "l2", "LInf": "linf", "Cosine": "cos"}
    for trt_name, ours in METRICS.items():
        h = TrtexecHeader.model_validate({**_header(), "accuracy_algorithm": trt_name})
        assert h.metric == ours


def test_unknown_fields_are_kept(tmp_path):
    path = tmp_path / "c.jsonl"
    rows = [{**ITERATIONS[0], "wall_ms": 12}]
    path.write_text(_cache_text({**_header(), "gpu": "H200"}, rows))
    header, its = read_trtexec_cache(path)
    assert header.model_extra == {"gpu": "H200"}
    assert its[0].model_extra == {"wall_ms": 12}


def test_torn_final_line_is_ignored(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(_cache_text() + '{"iter": 5, "build_route": "-conv_use_lo')
    _, its = read_trtexec_cache(path)
    assert len(its) == len(ITERATIONS)


def test_unterminated_but_complete_final_line_is_kept(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(_cache_text().rstrip("\n"))
    assert len(read_trtexec_cache(path)[1]) == len(ITERATIONS)


def test_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(_cache_text().replace("\n", "\n\n", 2))
    assert len(read_trtexec_cache(path)[1]) == len(ITERATIONS)


def test_header_only(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(_header()) + "\n")
    assert read_trtexec_cache(path)[1] == []


def test_error_message_null_reads_as_empty(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(_cache_text(rows=[{**ITERATIONS[0], "error_message": None}]))
    assert read_trtexec_cache(path)[1][0].error_message == ""


@pytest.mark.parametrize("text, message", [
    ("", "line 1, the header, is empty"),
    ("\n" + _cache_text(), "line 1, the header, is empty"),
    ("not json\n", "line 1 is not JSON"),
    ("[1,2]\n", "line 1 is not a trtexec tuning cache header"),
    (json.dumps({k: v for k, v in _header().items() if k != "tuner_version"}) + "\n",
     "line 1 is not a trtexec tuning cache header \\(tuner_version"),
    (json.dumps({**_header(), "accuracy_algorithm": "L3"}) + "\n", "accuracy_algorithm"),
    (json.dumps({**_header(), "searching_algorithm": "random"}) + "\n", "searching_algorithm"),
    (json.dumps({**_header(), "accuracy_parameter": {"atol": 0, "rtol": 0}}) + "\n",
     "accuracy_parameter.epsilon"),
    (json.dumps({**_header(), "argv": "trtexec --onnx=m.onnx"}) + "\n", "argv"),
    (_cache_text(rows=[ITERATIONS[0], {"iter": 1, "crash": False}, ITERATIONS[2]]),
     "line 3 is not a trtexec iteration \\(build_route"),
    (_cache_text(rows=[{**ITERATIONS[0], "crash": "false"}, ITERATIONS[1]]),
     "line 2 is not a trtexec iteration \\(crash"),
    (_cache_text(rows=[{**ITERATIONS[0], "iter": -1}, ITERATIONS[1]]), "line 2 .*iter"),
    (_cache_text(rows=[{**ITERATIONS[0], "gpu_time": "1.5"}, ITERATIONS[1]]), "gpu_time"),
    (_cache_text() + "garbage\n" + json.dumps(ITERATIONS[0]) + "\n", "line 7 is not JSON"),
    (json.dumps({"kind": "header", "cache_format": 1}) + "\n", "is a dossier tuning cache"),
])
def test_malformed_cache(tmp_path, text, message):
    path = tmp_path / "c.jsonl"
    path.write_text(text)
    with pytest.raises(TrtexecCacheError, match=message) as info:
        read_trtexec_cache(path)
    assert isinstance(info.value, InputError)


def test_non_utf8_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(json.dumps(_header()).encode() + b"\n\xff\xfe{}\n")
    with pytest.raises(TrtexecCacheError, match="line 2 is not UTF-8"):
        read_trtexec_cache(path)


def test_missing_file(tmp_path):
    with pytest.raises(TrtexecCacheError, match="cannot read"):
        read_trtexec_cache(tmp_path / "absent.jsonl")


# ------------------------------------------------------------------------------------ judging

def test_outcomes_and_reasons(cache):
    header, its = read_trtexec_cache(cache)
    recs = to_trial_records(header, its)
    assert [r.outcome for r in recs] == [Outcome.OK, Outcome.BUILD_FAILED, Outcome.CRASHED,
                                         Outcome.REJECTED, Outcome.OK]
    assert recs[0].reason is None and recs[4].reason is None
    assert recs[1].reason.startswith("IBuilderConfig::setBuildRoute failed")
    assert recs[2].reason == "child terminated by signal 11"
    assert recs[3].reason == ("output 'y' l0 loss 0.25 >= threshold 0.01 "
                              "(child exited with status 1)")
    assert [r.role for r in recs] == ["baseline"] + ["search"] * 4
    assert [r.index for r in recs] == [0, 1, 2, 3, 4]


def test_records_do_not_pretend_to_be_statistics(cache):
    recs = to_trial_records(*read_trtexec_cache(cache))
    ok = recs[4]
    assert ok.timing is None and ok.comparison is None and ok.samples_ms is None
    assert ok.extra["trtexec_gpu_time_ms"] == "1.2"
    assert ok.extra["trial_s"] == "unknown"
    assert ok.started_at == "unknown"
    assert ok.losses == {LAST_PAIR: {"y": 0.002, "z": 0.0}}
    assert "last" in ok.extra["losses"]
    assert ok.worst_loss == 0.002
    assert ok.extra["trtexec_iter"] == "4"
    assert recs[1].losses is None and "trtexec_gpu_time_ms" not in recs[1].extra


def test_routes_are_canonical(cache):
    recs = to_trial_records(*read_trtexec_cache(cache))
    assert recs[3].route == "-conv_use_long_w=on -kgen:codegen:cuda_tile=0 -kgen:tiling=aggressive"
    assert recs[3].route == Route.parse(ITERATIONS[3]["build_route"]).text()
    assert recs[3].extra["trtexec_build_route"] == ITERATIONS[3]["build_route"]


def test_winner_is_fastest_passing_row(cache):
    header, its = read_trtexec_cache(cache)
    assert trtexec_winner(its, header.epsilon) == 4  # row 3 is faster but failed accuracy


def _it(gpu: float | None, loss: float | None = 0.0, crash: bool = False, msg: str = "",
        i: int = 0) -> TrtexecIteration:
    return TrtexecIteration(iter=i, build_route="-a=x", crash=crash, error_message=msg,
                            accuracy_loss=None if loss == "none" else {"y": loss},
                            gpu_time=gpu)


def test_winner_rules():
    assert trtexec_winner([], EPSILON) is None
    assert trtexec_winner([_it(1.0, crash=True)], EPSILON) is None
    # strict `<`: the first of equal times wins
    assert trtexec_winner([_it(2.0), _it(1.0), _it(1.0)], EPSILON) == 1
    # loss == epsilon fails (trtexec fails at >=)
    assert trtexec_winner([_it(2.0), _it(1.0, loss=EPSILON)], EPSILON) == 0
    # non-zero exit with passing losses is excluded too
    assert trtexec_winner([_it(2.0), _it(1.0, msg="child exited with status 1")], EPSILON) == 0
    # a null (NaN) loss is not below epsilon here
    assert trtexec_winner([_it(2.0), _it(1.0, loss=None)], EPSILON) == 0
    # no references: no losses, every non-crashed row qualifies
    assert trtexec_winner([_it(2.0, loss="none"), _it(1.0, loss="none")], EPSILON) == 1
    assert trtexec_winner([_it(None)], EPSILON) is None


def test_other_outcomes():
    header = TrtexecHeader.model_validate({**_header(), "searching_algorithm": "full"})
    its = [_it(1.0, loss=None), _it(1.0, msg="child exited with status 1"),
           _it(None, crash=True), _it(None, crash=True, msg="Engine build FAILED"),
           _it(1.0, loss="none")]
    recs = to_trial_records(header, its)
    assert [r.outcome for r in recs] == [Outcome.REJECTED, Outcome.RUNTIME_ERROR,
                                         Outcome.CRASHED, Outcome.BUILD_FAILED, Outcome.OK]
    assert "null" in recs[0].reason
    assert recs[1].reason == "child exited with status 1"
    assert recs[2].reason == "trtexec recorded a crash without a message"
    assert recs[0].role == "search"  # a full search has no baseline row
    assert recs[0].worst_loss is None


def test_unparseable_route_is_an_input_error():
    header = TrtexecHeader.model_validate(_header())
    bad = TrtexecIteration(iter=0, build_route="conv_use_long_w", crash=False)
    with pytest.raises(TrtexecCacheError, match="does not parse"):
        to_trial_records(header, [bad])


# ------------------------------------------------------------------------------------ writing

def test_export_then_read_round_trip(cache, tmp_path):
    header, its = read_trtexec_cache(cache)
    recs = to_trial_records(header, its)
    out = tmp_path / "export.jsonl"
    write_trtexec_cache(out, header, recs)
    header2, its2 = read_trtexec_cache(out)
    assert header2 == header
    assert list(json.loads(out.read_text().splitlines()[0])) == list(_header())  # field order
    assert len(its2) == len(its)
    for a, b in zip(its, its2):
        assert Route.parse(a.build_route) == Route.parse(b.build_route)
        assert (a.iter, a.crash, a.accuracy_loss, a.gpu_time) == \
            (b.iter, b.crash, b.accuracy_loss, b.gpu_time)
    assert trtexec_winner(its2, header2.epsilon) == trtexec_winner(its, header.epsilon)
    recs2 = to_trial_records(header2, its2)
    assert [r.outcome for r in recs2] == [r.outcome for r in recs]
    assert [r.route for r in recs2] == [r.route for r in recs]


def _record(index: int, outcome: Outcome, **kw: object) -> TrialRecord:
    return TrialRecord(index=index, route=f"-a={index}", outcome=outcome, trial_s=1.0,
                       started_at="2026-07-07T00:00:00Z", **kw)


def _timing(median: float) -> TimingSummary:
    return TimingSummary(n=60, median_ms=median, ci_low_ms=median * 0.9, ci_high_ms=median * 1.1,
                         mean_ms=median, p10_ms=median * 0.9, p90_ms=median * 1.1, warmup_runs=10)


def test_export_of_dossier_records():
    losses = {"pair-000": {"y": 0.5, "z": 0.1}, "pair-001": {"y": 0.002, "z": None}}
    recs = [_record(0, Outcome.OK, losses=losses, timing=_timing(2.0)),
            _record(1, Outcome.REJECTED, reason="output 'y' loss 0.5 >= 0.01", losses=losses,
                    timing=_timing(1.0)),
            _record(2, Outcome.BUILD_FAILED, reason="no tactic"),
            _record(3, Outcome.TIMEOUT, reason="ran past 600 s"),
            _record(4, Outcome.RUNTIME_ERROR, reason="CUDA error", losses=losses),
            _record(5, Outcome.CRASHED, reason="signal 9"),
            _record(6, Outcome.OK)]
    its = to_trtexec_iterations(recs)
    assert [it.crash for it in its] == [False, False, True, True, True, True, False]
    assert its[0].accuracy_loss == {"y": 0.002, "z": None}  # the last pair only
    assert its[0].gpu_time == 2.0 and its[0].error_message == ""
    assert its[1].error_message == "output 'y' loss 0.5 >= 0.01"
    assert its[4].accuracy_loss is None and its[4].gpu_time is None
    assert its[6].accuracy_loss is None and its[6].gpu_time is None
    assert [it.iter for it in its] == list(range(7))


def test_write_refuses_to_overwrite(cache, tmp_path):
    header, _ = read_trtexec_cache(cache)
    with pytest.raises(OutputError, match="exists"):
        write_trtexec_cache(cache, header, [])
    write_trtexec_cache(cache, header, [], overwrite=True)
    assert read_trtexec_cache(cache)[1] == []
    with pytest.raises(OutputError, match="cannot write"):
        write_trtexec_cache(tmp_path / "no-dir" / "x.jsonl", header, [])


def test_make_header_from_dossier_names(tmp_path):
    h = make_trtexec_header(tuner_version="2.19.15", metric="cos", atol=0, rtol=0,
                            epsilon=0.001, strategy="mixed", default_build_route="-a=x",
                            tuning_expr="-a=[x|y]", onnx="/m.onnx", inputs={"x": "/x.bin"})
    assert h.accuracy_algorithm == "Cosine" and h.metric == "cos"
    assert h.searching_algorithm == "mixed"
    path = tmp_path / "c.jsonl"
    write_trtexec_cache(path, h, [_record(0, Outcome.OK, timing=_timing(1.0))])
    header, its = read_trtexec_cache(path)
    assert header == h and its[0].gpu_time == 1.0
    with pytest.raises(InputError, match="no trtexec equivalent"):
        make_trtexec_header(tuner_version="1", metric="psnr", atol=0, rtol=0, epsilon=1,
                            strategy="fast", default_build_route="", tuning_expr="")
    with pytest.raises(InputError, match="no trtexec equivalent"):
        make_trtexec_header(tuner_version="1", metric="l0", atol=0, rtol=0, epsilon=1,
                            strategy="random", default_build_route="", tuning_expr="")


# ------------------------------------------------------------------------------- header files

def test_hash_header_files(tmp_path):
    onnx_file = tmp_path / "model.onnx"
    onnx_file.write_bytes(b"onnx bytes")
    x = tmp_path / "x.bin"
    x.write_bytes(b"\x00" * 16)
    header = TrtexecHeader.model_validate(_header(
        onnx=str(onnx_file), save_engine=None, inputs={"x": str(x), "/x/2": str(tmp_path)},
        ref_outputs={"y": str(tmp_path / "absent.bin")}))
    got = hash_header_files(header)
    digest, size = digest_file(onnx_file)
    assert got["onnx"] == FileIdentity(path=str(onnx_file), size=size, digest=digest)
    assert got["inputs:x"].size == 16
    assert got["inputs:/x/2"] is None  # a folder is not a file
    assert got["ref_outputs:y"] is None
    assert got["save_engine"] is None
    assert set(got) == {"onnx", "save_engine", "inputs:x", "inputs:/x/2", "ref_outputs:y"}


# ----------------------------------------------------------------------------------- property

@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trtexec-fuzz") / "cache.jsonl"


def _read_or_dossier_error(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    try:
        header, its = read_trtexec_cache(path)
        to_trial_records(header, its)
        trtexec_winner(its, header.epsilon)
    except DossierError:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=2048))
def test_arbitrary_bytes_never_escape_as_other_errors(scratch, data):
    _read_or_dossier_error(scratch, data)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8),
                                                                      children, max_size=4),
    max_leaves=12)
_iteration_like = st.fixed_dictionaries(
    {"iter": st.integers(-2, 5), "build_route": st.text(max_size=30), "crash": _json},
    optional={"error_message": _json, "accuracy_loss": _json | st.dictionaries(
        st.text(max_size=4), st.floats() | st.none(), max_size=3), "gpu_time": _json})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(_iteration_like | _json, max_size=5), tail=st.binary(max_size=40))
def test_structured_lines_never_escape_as_other_errors(scratch, rows, tail):
    body = "\n".join(json.dumps(r) for r in [_header(), *rows]).encode() + b"\n" + tail
    _read_or_dossier_error(scratch, body)
