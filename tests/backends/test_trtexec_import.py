"""``dossier import trtexec`` and ``dossier export trtexec-cache``
(:mod:`dossier.backends.tensorrt.importer`).

Fixtures are written by hand, not captured from TensorRT:

- the tuning caches follow the documented format of TensorRT 11.1's ``--tuningCacheFile``
  (header and iteration fields as trtexec's writeTuningCacheHeader/Iteration write them, per the
  source reading in the project's reference notes, section 2);
- the knob database follows the documented ``all_build_routes`` JSON (section 3);
- the plan files are built from the documented plan header layout (u32 tag 0x74727466, u32
  serialization version 0, TensorRT major.minor.patch.build at bytes 24..27) followed by
  filler bytes: they are not engines and are never deserialized.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from conftest import cli
from test_trtexec import ITERATIONS
from typer.testing import CliRunner

from dossier.audit import explain
from dossier.backends import default_policy
from dossier.backends.tensorrt.importer import (
    export_trtexec_cache,
    import_trtexec,
    unknown_fingerprint,
)
from dossier.backends.tensorrt.trtexec import TrtexecIteration, read_trtexec_cache, trtexec_winner
from dossier.bundle import check_integrity, open_bundle
from dossier.bundle.overview import overview_of
from dossier.cache import TuningCache
from dossier.errors import ExitCode
from dossier.fingerprint import CpuInfo, Fingerprint, GpuInfo, OsInfo, PythonInfo
from dossier.routes import Route
from dossier.verify.policy import Verdict, diff
from dossier_cli.main import app

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "assets" / "golden" / "convnet-1.dossier"
EPSILON = 0.01
TRT = (11, 1, 0, 106)

# The documented-format rows of tests/cli/test_trtexec.py: a fast search over three knobs. Row 1 is
# a failed build, row 2 a crash (signal), row 3 an accuracy failure (crash false, exit status 1,
# a loss >= epsilon) that is the fastest of all, row 4 the fastest passing route: the winner.
ROWS = ITERATIONS
WINNER = 4
DEFAULT_ROUTE = ("-conv_use_long_w=on -kgen:codegen:cuda_tile=0 -kgen:tiling=auto "
                 "-match_ragged_mha=off")
EXPR = "-conv_use_long_w=[on|off] -kgen:tiling=[none|aggressive] -kgen:codegen:cuda_tile=[0|1]"
KNOB_JSON = {  # the documented all_build_routes shape, knobs in TensorRT's order
    "tuner_version": "2.19.15",
    "tuner_options": [
        {"option": "-conv_use_long_w", "allowed_values": "-conv_use_long_w=[on|off]",
         "default_value": "on", "help": "Convert Conv [N, C, X, 1] to ..."},
        {"option": "-kgen:codegen:cuda_tile", "allowed_values": "-kgen:codegen:cuda_tile=[0|1|2]",
         "default_value": "0", "help": "cuda tile codegen"},
        {"option": "-kgen:tiling", "allowed_values": "-kgen:tiling=[auto|none|aggressive]",
         "default_value": "auto", "help": "tiling"},
        {"option": "-match_ragged_mha", "allowed_values": "-match_ragged_mha=[on|off]",
         "default_value": "off", "help": "ragged MHA"},
        {"option": "-peep:max", "allowed_values": "-peep:max=int32_t", "default_value": "8",
         "help": "unbounded"},
    ],
}


def plan_bytes(version: tuple[int, int, int, int] = TRT, serialization: int = 0) -> bytes:
    """A file with the documented TensorRT plan header, then filler (not an engine)."""
    return struct.pack("<II", 0x74727466, serialization) + bytes(16) + bytes(version) + \
        b"filler, not a serialized engine" * 4


def tiny_onnx(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph), str(path))
    return path


def write_cache(folder: Path, rows: list[dict] | None = None, **header: object) -> Path:
    """A trtexec tuning cache (documented format) naming files in ``folder``."""
    files = {"onnx": str(folder / "resnet.onnx"), "save_engine": str(folder / "best.plan"),
             "inputs": {"x": str(folder / "x.bin")}, "ref_outputs": {"y": str(folder / "y.bin")}}
    head = {
        "tuner_version": "2.19.15", "accuracy_algorithm": "L0",
        "accuracy_parameter": {"atol": 1e-05, "rtol": 1e-05, "epsilon": EPSILON},
        "searching_algorithm": "fast",
        "command_line": f"trtexec --onnx={folder}/resnet.onnx --tuneBuildRoutes='{EXPR}' ...",
        "default_build_route": DEFAULT_ROUTE, "tuning_expr": EXPR, "files": files,
        "argv": ["/usr/bin/trtexec", f"--onnx={folder}/resnet.onnx",
                 f"--saveEngine={folder}/best.plan",
                 f"--loadInputs=x:{folder}/x.bin", f"--loadRefOutputs=y:{folder}/y.bin",
                 "--refPair=0", f"--loadInputs=x:{folder}/x1.bin",
                 f"--loadRefOutputs=y:{folder}/y1.bin", "--refPair=1"],
        **header,
    }
    path = folder / "tuning-cache.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [head, *(rows or ROWS)]) + "\n")
    return path


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A trtexec tuning run's files: model, pair 0's raw files, the winner's plan, the cache."""
    folder = tmp_path / "trt"
    folder.mkdir()
    tiny_onnx(folder / "resnet.onnx")
    (folder / "x.bin").write_bytes(b"\x00" * 16)
    (folder / "y.bin").write_bytes(b"\x01" * 16)
    (folder / "best.plan").write_bytes(plan_bytes())
    write_cache(folder)
    return folder


def imported(run: Path, out: Path, *extra: object) -> Path:
    res = cli("import", "trtexec", "--tuning-cache", run / "tuning-cache.jsonl",
              "--engine", run / "best.plan", "--out", out, *extra)
    assert res.exit_code == 0, res.stderr
    bundle = Path(res.stdout.strip())
    assert bundle.is_dir()
    return bundle


# ------------------------------------------------------------------------------------ import
def test_explain_names_trtexecs_winner_and_every_rejection(run: Path, tmp_path: Path) -> None:
    bundle = imported(run, tmp_path / "out")
    assert bundle.name == "resnet-1.dossier"  # the ONNX file's stem, version 1
    header, its = read_trtexec_cache(run / "tuning-cache.jsonl")
    winner = trtexec_winner(its, header.epsilon)
    assert winner == WINNER
    route = Route.parse(ROWS[WINNER]["build_route"]).text()

    res = cli("explain", bundle, "--json")
    assert res.exit_code == 0, res.stderr
    e = json.loads(res.stdout)
    d = e["decision"]
    assert (d["shipped_index"], d["shipped_route"]) == (winner, route)
    # gain: a route other than the baseline ships (trtexec's rule chose it; nothing was shown)
    assert d["statistically_checked"] is False and d["gain"] is (winner != 0)
    assert d["result"] == "not statistically checked" and d["why_not"] == []
    assert "lowest gpu_time" in d["rule"] and "strict <" in d["rule"]
    assert "warm-up" in d["rule"] and "no significance test" in d["rule"]
    assert e["imported_from"] == "trtexec tuning cache"
    assert e["environment"] is None and e["head_to_head"] is None
    rejected = {r["index"]: r for r in e["rejected"]}
    assert set(rejected) == {1, 2, 3}
    assert rejected[1]["outcome"] == "build_failed"
    assert rejected[1]["error"].startswith("IBuilderConfig::setBuildRoute failed")
    assert (rejected[2]["outcome"], rejected[2]["error"]) == ("crashed",
                                                              "child terminated by signal 11")
    assert rejected[3]["outcome"] == "rejected" and rejected[3]["error"] is None
    assert rejected[3]["failures"] == [{"pair": "last-pair", "output": "y", "loss": 0.25,
                                        "threshold": EPSILON}]

    text = cli("explain", bundle)
    assert text.exit_code == 0, text.stderr
    out = " ".join(text.stdout.split())
    assert f"not statistically checked: {route} ships (trial {winner})" in out
    assert "output 'y': l0 loss 0.25 >= threshold 0.01" in out
    assert "error: child terminated by signal 11" in out
    assert "error: IBuilderConfig::setBuildRoute failed" in out
    assert "unknown: the trtexec tuning cache records no host" in out


def test_inspect_says_not_statistically_checked(run: Path, tmp_path: Path) -> None:
    bundle = imported(run, tmp_path / "out")
    res = cli("inspect", bundle)
    assert res.exit_code == 0, res.stderr
    assert "speedup      not statistically checked" in res.stdout
    assert "tuning host  hostname unknown" in res.stdout
    assert "search unknown" in res.stdout and "search 0.0 s" not in res.stdout
    # the TensorRT version that built the plan, beside trtexec's tuner version
    assert "backend      tensorrt 11.1.0.106 (the plan's TensorRT; tuner 2.19.15)" in res.stdout
    o = json.loads(cli("inspect", bundle, "--json").stdout)
    assert o["result"] == "not statistically checked" and o["speedup"] is None
    assert o["winner"]["trial_index"] == WINNER and not o["winner"]["is_baseline"]
    assert o["gain"] is True and o["search_wall_s"] is None
    assert o["baseline_engine"] is False
    assert o["validation_pairs"] == 2  # one per --loadRefOutputs in argv
    assert any("not statistically checked" in w for w in o["warnings"])
    assert any("inferred" in w for w in o["warnings"])  # no --knobs


def test_bundle_contents(run: Path, tmp_path: Path) -> None:
    bundle = imported(run, tmp_path / "out")
    with open_bundle(bundle) as b:
        m = b.manifest
        assert check_integrity(b)
        assert (bundle / m.engines.shipped.path).read_bytes() == plan_bytes()
        assert m.engines.baseline is None  # trtexec keeps only the winner's engine
        facts, flags = m.engines.shipped.facts, m.engines.shipped.flags
        assert facts["plan_trt_version"] == facts["tensorrt_version"] == "11.1.0.106"
        assert flags == {"version_compatible": False, "hardware_compatible": False,
                         "tuning_host_unknown": True}
        assert m.model_included and (bundle / "model" / "resnet.onnx").is_file()
        assert m.backend == "tensorrt" and m.tuner_version == "2.19.15"
        # the original cache, verbatim, and what the import found
        assert (bundle / "trtexec" / "tuning-cache.jsonl").read_bytes() == \
            (run / "tuning-cache.jsonl").read_bytes()
        record = json.loads((bundle / "trtexec" / "import.json").read_text())
        assert record["header_files"]["inputs:x"]["size"] == 16
        assert record["header_files"]["ref_outputs:y"]["size"] == 16
        assert record["winner"]["row"] == WINNER
        assert record["knob_database"].startswith("inferred")
        db = json.loads((bundle / "knobs.json").read_text())
        assert "inferred" in db["tuner_version"]
        assert [k["name"] for k in db["knobs"]][:4] == ["conv_use_long_w",
                                                        "kgen:codegen:cuda_tile", "kgen:tiling",
                                                        "match_ragged_mha"]
        cache = b.tuning_cache()
        assert [t.role for t in cache.trials] == ["baseline"] + ["search"] * 4
        assert cache.decision is not None and cache.decision.shipped_index == WINNER
        assert cache.sessions == []  # trtexec records no wall time; none is invented
        assert all(t.timing is None and t.comparison is None for t in cache.trials)


def test_tuning_host_is_unknown_and_verify_does_not_say_valid(run: Path,
                                                              tmp_path: Path) -> None:
    bundle = imported(run, tmp_path / "out")
    fp = Fingerprint.model_validate_json((bundle / "fingerprint.json").read_bytes())
    assert fp == unknown_fingerprint()
    assert fp.hostname is None and fp.cpu.model is None and fp.os.system is None
    assert fp.packages == {} and fp.gpus == [] and fp.python.version == "unknown"

    res = cli("verify", bundle, "--integrity-only")
    assert res.exit_code == 0, res.stderr
    # on a host with a GPU and TensorRT: never VALID, every field "cannot be compared"
    gpu_host = tmp_path / "gpu-host.json"
    gpu_host.write_text(Fingerprint(
        collected_at="now", hostname="h", python=PythonInfo(version="3.12.0",
                                                            implementation="CPython"),
        cpu=CpuInfo(model="EPYC", cores=16), os=OsInfo(system="Linux"),
        packages={"tensorrt": "11.1.0.106"},
        gpus=[GpuInfo(index=0, name="NVIDIA H200", compute_capability="9.0")]
    ).model_dump_json())
    res = cli("verify", bundle, "--json", "--host-fingerprint", gpu_host)
    assert res.exit_code == ExitCode.SUBOPTIMAL, res.stderr
    report = json.loads(res.stdout)
    assert report["verdict"] == "SUBOPTIMAL"
    changed = [f for f in report["findings"] if f["bundle_value"] != f["host_value"]]
    assert len(changed) >= 3
    for f in changed:
        assert f["verdict"] == "SUBOPTIMAL" and "cannot be compared" in f["reason"], f
    # said once, not once per field
    assert len(report["reasons"]) == 1 and report["reasons"][0].startswith(f"{len(changed)} fields")
    text = cli("verify", bundle, "--host-fingerprint", gpu_host).stdout
    assert text.count("cannot be compared") == 2  # the table's one row and the one reason
    # a TensorRT plan on a host with no GPU and no TensorRT must not be used at all
    cpu_host = tmp_path / "cpu-host.json"
    cpu_host.write_text(Fingerprint(
        collected_at="now", hostname="h", python=PythonInfo(version="3.12.0",
                                                            implementation="CPython"),
        cpu=CpuInfo(model="EPYC", cores=16), os=OsInfo(system="Linux")).model_dump_json())
    res = cli("verify", bundle, "--json", "--host-fingerprint", cpu_host)
    assert res.exit_code == ExitCode.INVALID, res.stderr
    report = json.loads(res.stdout)
    invalid = {f["field"] for f in report["findings"] if f["verdict"] == "INVALID"}
    assert invalid == {"requires.gpu", "requires.tensorrt"}


def test_policy_unknown_tuning_host_is_never_valid() -> None:
    host = Fingerprint(collected_at="now", hostname="h",
                       python=PythonInfo(version="3.12.0", implementation="CPython"),
                       cpu=CpuInfo(model="EPYC", cores=16), os=OsInfo(system="Linux"),
                       packages={"tensorrt": "11.1.0.106"})
    for backend in ("tensorrt", "onnxruntime"):
        findings = diff(unknown_fingerprint(), host, default_policy(backend),
                        {"tuning_host_unknown": True})
        changed = [f for f in findings if f.changed]
        assert changed and {f.verdict for f in changed} == {Verdict.SUBOPTIMAL}
    # without the flag an absent field is judged as a change by its own rule, as before
    plain = diff(unknown_fingerprint(), host, default_policy("tensorrt"))
    assert {f.field: f.verdict for f in plain}["packages.tensorrt"] is Verdict.INVALID


@pytest.mark.parametrize("content", [b"\x08\x0e:?" + b"onnx protobuf" * 8,  # an ONNX file
                                     plan_bytes()[:20],  # truncated plan header
                                     plan_bytes(serialization=7)],  # unknown header layout
                         ids=["not-a-plan", "truncated", "unknown-layout"])
def test_non_plan_engine_is_refused_and_nothing_written(run: Path, tmp_path: Path,
                                                        content: bytes) -> None:
    bad = run / "not.plan"
    bad.write_bytes(content)
    out = tmp_path / "out"
    res = cli("import", "trtexec", "--tuning-cache", run / "tuning-cache.jsonl",
              "--engine", bad, "--out", out)
    assert res.exit_code == ExitCode.INPUT
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--engine" in lines[0] and "plan" in lines[0], res.stderr
    assert not out.exists()


def test_without_engine_is_refused(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = cli("import", "trtexec", "--tuning-cache", run / "tuning-cache.jsonl", "--out", out)
    assert res.exit_code == ExitCode.INPUT
    assert "--engine" in res.stderr and "best.plan" in res.stderr  # names the header's file
    assert not out.exists()


def test_no_passing_row_is_refused(run: Path, tmp_path: Path) -> None:
    write_cache(run, [ROWS[1], ROWS[2], ROWS[3]])
    res = cli("import", "trtexec", "--tuning-cache", run / "tuning-cache.jsonl", "--engine",
              run / "best.plan", "--out", tmp_path / "out")
    assert res.exit_code == ExitCode.TUNE and "no iteration passed" in res.stderr
    assert not (tmp_path / "out").exists()


def test_missing_model_is_refused_then_given(run: Path, tmp_path: Path) -> None:
    moved = run / "moved.onnx"
    (run / "resnet.onnx").rename(moved)
    args = ["import", "trtexec", "--tuning-cache", run / "tuning-cache.jsonl", "--engine",
            run / "best.plan", "--out", tmp_path / "out"]
    res = cli(*args)
    assert res.exit_code == ExitCode.INPUT and "--model" in res.stderr
    res = cli(*args, "--model", moved, "--name", "rn50", "--version", "3", "--no-model")
    assert res.exit_code == 0, res.stderr
    with open_bundle(tmp_path / "out" / "rn50-3.dossier") as b:
        assert not b.manifest.model_included and b.manifest.model.file_name == "moved.onnx"
        assert not (b.path / "model").exists()


def test_knob_json_is_used_and_checked(run: Path, tmp_path: Path) -> None:
    knobs = run / "knobs.json"
    knobs.write_text(json.dumps(KNOB_JSON))
    bundle = imported(run, tmp_path / "out", "--knobs", knobs)
    db = json.loads((bundle / "knobs.json").read_text())
    assert db["tuner_version"] == "2.19.15" and len(db["knobs"]) == 5
    with open_bundle(bundle) as b:
        assert not any("inferred" in w for w in b.manifest.warnings)

    other = run / "other.json"
    other.write_text(json.dumps({**KNOB_JSON, "tuner_version": "2.17.83"}))
    res = cli("import", "trtexec", "--tuning-cache", run / "tuning-cache.jsonl", "--engine",
              run / "best.plan", "--knobs", other, "--out", tmp_path / "o2")
    assert res.exit_code == ExitCode.INPUT and "2.17.83" in res.stderr
    changed = run / "changed.json"
    options = [dict(o) for o in KNOB_JSON["tuner_options"]]  # type: ignore[union-attr]
    options[2]["default_value"] = "none"
    changed.write_text(json.dumps({**KNOB_JSON, "tuner_options": options}))
    res = cli("import", "trtexec", "--tuning-cache", run / "tuning-cache.jsonl", "--engine",
              run / "best.plan", "--knobs", changed, "--out", tmp_path / "o2")
    assert res.exit_code == ExitCode.INPUT and "default_build_route" in res.stderr
    assert not (tmp_path / "o2").exists()


def test_full_search_without_the_default_route_and_a_baseline_engine(run: Path,
                                                                     tmp_path: Path) -> None:
    # `full` over listed values that exclude the default tiling: no row builds the baseline
    rows = [{**r, "iter": i} for i, r in enumerate([ROWS[3], ROWS[2]])]
    rows.append({"iter": 2, "build_route": "-conv_use_long_w=off -kgen:codegen:cuda_tile=0 "
                 "-kgen:tiling=none", "crash": False, "error_message": "",
                 "accuracy_loss": {"y": 0.0, "z": 0.0}, "gpu_time": 2.0})
    write_cache(run, rows, searching_algorithm="full")
    res = cli("import", "trtexec", "--tuning-cache", run / "tuning-cache.jsonl", "--engine",
              run / "best.plan", "--baseline-engine", run / "best.plan", "--out",
              tmp_path / "o1")
    assert res.exit_code == ExitCode.INPUT and "baseline" in res.stderr
    bundle = imported(run, tmp_path / "out")
    with open_bundle(bundle) as b:
        facts = explain(b)
        assert all(t.role == "search" for t in b.tuning_cache().trials)
    assert facts.decision.shipped_index == 2 and facts.aa_check is None
    assert facts.knob_effects == [] and not facts.knob_model.fitted


def test_baseline_engine_ships_when_given(run: Path, tmp_path: Path) -> None:
    (run / "best.plan.iter0").write_bytes(plan_bytes(version=(11, 1, 0, 7)))
    bundle = imported(run, tmp_path / "out", "--baseline-engine", run / "best.plan.iter0")
    with open_bundle(bundle) as b:
        base = b.manifest.engines.baseline
        assert base is not None and base.trial_index == 0 and base.path.endswith(".baseline.plan")
        assert base.facts["plan_trt_version"] == "11.1.0.7"
        assert overview_of(b).baseline_engine is True
        assert check_integrity(b)


def test_winner_that_is_the_baseline_is_both_engines(run: Path, tmp_path: Path) -> None:
    write_cache(run, [ROWS[0], ROWS[1], {**ROWS[4], "gpu_time": 1.9}])
    bundle = imported(run, tmp_path / "out")
    with open_bundle(bundle) as b:
        assert b.manifest.engines.baseline == b.manifest.engines.shipped
        assert overview_of(b).winner.is_baseline is True


# ------------------------------------------------------------------------------------ export
def test_round_trip_export_of_an_imported_bundle(run: Path, tmp_path: Path) -> None:
    bundle = imported(run, tmp_path / "out")
    target = tmp_path / "exported.jsonl"
    res = cli("export", "trtexec-cache", bundle, "--out", target)
    assert res.exit_code == 0, res.stderr
    assert "lost in the export" in res.stderr
    header, its = read_trtexec_cache(target)
    header0, its0 = read_trtexec_cache(run / "tuning-cache.jsonl")
    assert header == header0
    assert [it.model_dump() for it in its] == [it.model_dump() for it in its0]
    assert trtexec_winner(its, header.epsilon) == WINNER
    again = cli("export", "trtexec-cache", bundle, "--out", target)
    assert again.exit_code == ExitCode.OUTPUT and "exists" in again.stderr


def test_round_trip_keeps_mixed_phase_two_iters(run: Path, tmp_path: Path) -> None:
    rows = [*ROWS[:2], {**ROWS[4], "iter": 0}, {**ROWS[0], "iter": 1}]  # phase 2 restarts iter
    write_cache(run, rows, searching_algorithm="mixed")
    bundle = imported(run, tmp_path / "out")
    done = export_trtexec_cache(bundle, tmp_path / "x.jsonl")
    assert done.original
    _, its = read_trtexec_cache(tmp_path / "x.jsonl")
    assert [it.iter for it in its] == [0, 1, 0, 1]
    assert [TrtexecIteration.model_validate(r) for r in rows] == its


def test_export_of_the_ort_sample_bundle(tmp_path: Path) -> None:
    target = tmp_path / "ort.jsonl"
    res = cli("export", "trtexec-cache", GOLDEN, "--out", target)
    assert res.exit_code == 0, res.stderr
    err = " ".join(res.stderr.split())
    for lost in ("every validation pair's loss but the last", "raw timing samples",
                 "fingerprint", "median"):
        assert lost in err
    header, its = read_trtexec_cache(target)
    cache = TuningCache.open(GOLDEN / "tuning-cache.jsonl")
    main = [t for t in cache.trials if t.role != "confirm"]
    assert header.metric == cache.header.metric and header.epsilon == cache.header.threshold
    assert header.tuning_expr == cache.header.selection and header.argv == []
    assert len(its) == len(main)
    winner = trtexec_winner(its, header.epsilon)
    fastest = min((t for t in main if t.admissible), key=lambda t: t.timing.median_ms)
    assert winner is not None and main[winner].route == fastest.route
    assert its[winner].gpu_time == fastest.timing.median_ms
    # the default route lists every knob of the bundle's database
    with open_bundle(GOLDEN) as b:
        knobs = json.loads(b.file("knobs.json").read_text())["knobs"]
    assert len(header.default_build_route.split()) == len(knobs)


def test_export_refuses_what_is_not_a_search(tmp_path: Path) -> None:
    res = cli("export", "trtexec-cache", tmp_path, "--out", tmp_path / "x.jsonl")
    assert res.exit_code == ExitCode.INPUT
    assert not (tmp_path / "x.jsonl").exists()


# ----------------------------------------------------------------------------- the backend
def test_knobs_tensorrt_says_how_to_install() -> None:
    import importlib.util

    if importlib.util.find_spec("tensorrt") and importlib.util.find_spec("cuda"):
        pytest.skip("TensorRT is installed here")
    res = cli("knobs", "--backend", "tensorrt")
    assert res.exit_code == ExitCode.BACKEND_UNAVAILABLE
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install tensorrt cuda-python" in lines[0], res.stderr


def test_import_library_call(run: Path, tmp_path: Path) -> None:
    written = import_trtexec(run / "tuning-cache.jsonl", tmp_path / "out",
                             engine=run / "best.plan", name="lib", version=2)
    assert written.path.name == "lib-2.dossier"
    assert written.manifest.summary.result == "not statistically checked"


def test_retune_of_an_import_is_refused(run: Path, tmp_path: Path) -> None:
    bundle = imported(run, tmp_path / "out")
    res = cli("retune", bundle, "--out", tmp_path / "next")
    assert res.exit_code == ExitCode.INPUT and "no validation set" in res.stderr
    assert not (tmp_path / "next").exists()


def test_verify_recheck_and_rebench_refuse_an_import_with_one_line(run: Path,
                                                                   tmp_path: Path) -> None:
    """An imported bundle has no validation set and no baseline engine: one line, exit 3."""
    bundle = imported(run, tmp_path / "out")
    for flag, words in (("--recheck", "no validation set"), ("--rebench", "no baseline engine")):
        r = CliRunner().invoke(app, ["verify", str(bundle), flag])
        assert r.exit_code == 3, (flag, r.output)
        assert words in r.output
