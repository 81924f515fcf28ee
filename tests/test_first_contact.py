"""First contact: what a new user runs first behaves as the README and the documentation say
(relative paths, a file where a folder is expected, help text, knob names with their dash, output
outside a terminal, the Makefile, the snippets of the README and of docs/, and exit codes)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from test_explain import make_bundle
from typer.testing import CliRunner

from dossier.errors import ExitCode
from dossier_cli.main import app

README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"


def _cli(*args: object, **kw):  # noqa: ANN202
    return CliRunner().invoke(app, [str(a) for a in args], **kw)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, samples_dir: Path) -> Path:
    return make_bundle(tmp_path_factory.mktemp("first"), samples_dir, "convnet")


def test_retune_with_a_relative_out(bundle: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = _cli("retune", bundle, "--out", "releases/", "--top", "1", "--quiet")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "releases" / "convnet-convnet-2.dossier" / "manifest.json").is_file()


def test_a_failed_retune_leaves_nothing(bundle: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("other.onnx").write_bytes(b"not the model")
    r = _cli("retune", bundle, "--out", "releases", "--model", "other.onnx")
    assert r.exit_code == ExitCode.INPUT and "is not the bundle's model" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.onnx"]


def test_tune_out_that_is_a_file(sample, tmp_path: Path) -> None:
    spec, _ = sample("convnet")
    target = tmp_path / "taken"
    target.write_text("x")
    r = _cli("tune", spec, "--out", target)
    assert r.exit_code == ExitCode.OUTPUT, r.output
    assert r.output.strip().startswith("error: --out") and len(r.output.strip().splitlines()) == 1
    assert target.read_text() == "x"


def test_explain_html_into_a_folder_and_file_mode(bundle: Path, tmp_path: Path) -> None:
    pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")
    folder = tmp_path / "reports"
    folder.mkdir()
    r = _cli("explain", bundle, "--html", folder)
    assert r.exit_code == ExitCode.OUTPUT and "is a folder" in r.output
    assert list(folder.iterdir()) == [] and list(tmp_path.iterdir()) == [folder]
    old = os.umask(0o022)
    try:
        assert _cli("explain", bundle, "--html", folder / "r.html").exit_code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((folder / "r.html").stat().st_mode) == 0o644
    assert [p.name for p in folder.iterdir()] == ["r.html"]


def test_help_keeps_the_selection_syntax() -> None:
    text = " ".join(_cli("knobs", "--help", env={"COLUMNS": "200"}).output.split())
    assert "-knob=[a|b] varies a knob" in text
    text = " ".join(_cli("tune", "--help", env={"COLUMNS": "200"}).output.split())
    assert "'-a=[x|y] -b=z'" in text


def test_knobs_takes_the_name_as_the_table_prints_it() -> None:
    for name in ("-optimizer:NchwcTransformer", "optimizer:NchwcTransformer"):
        r = _cli("knobs", name, "--json")
        assert r.exit_code == 0, r.output
        assert [k["name"] for k in json.loads(r.stdout)["knobs"]] == ["optimizer:NchwcTransformer"]
    r = _cli("knobs", "-optimizer:NoSuchThing")
    assert r.exit_code == ExitCode.INPUT and "unknown knob" in r.output


def test_no_hard_wrapping_outside_a_terminal(bundle: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    run = [sys.executable, "-m", "dossier_cli.main"]
    table = subprocess.run([*run, "knobs"], capture_output=True, text=True, env=env,
                           cwd=ROOT, check=True).stdout
    names = [k["name"] for k in json.loads(subprocess.run(
        [*run, "knobs", "--json"], capture_output=True, text=True, env=env, cwd=ROOT,
        check=True).stdout)["knobs"]]
    rows = [ln for ln in table.splitlines() if ln.startswith("│")]
    assert len(rows) == len(names)  # one line per knob: nothing folded
    for name, row in zip(names, rows):
        assert f"-{name} " in row and "…" not in row
    text = subprocess.run([*run, "explain", str(bundle)], capture_output=True, text=True,
                          env=env, cwd=ROOT, check=True).stdout
    lines = text.splitlines()
    rule = lines[lines.index("Decision rule") + 1]  # the rule is one line, however long
    assert len(rule) > 200 and rule.strip().endswith("else the baseline")


def test_make_sample_installs_no_torch_and_removes_a_stale_signature() -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")

    def dry(target: str) -> str:
        return subprocess.run(["make", "-n", "-B", target], capture_output=True, text=True,
                              cwd=ROOT, check=True).stdout

    assert "torch" not in dry("sample")
    assert "install -q 'torch==" in dry("setup") and "install -q 'torch==" in dry("test")
    assert "install -q 'torch" not in subprocess.run(["make", "-n", "-B", "setup", "TORCH="],
                                         capture_output=True, text=True, cwd=ROOT,
                                         check=True).stdout
    assert re.search(r"rm -rf .*out/convnet-1\.dossier\.sig\.json", dry("sample"))


def test_quick_tour_spec_snippet_is_the_file_it_names() -> None:
    page = (DOCS / "quickstart.md").read_text()
    m = re.search(r"A release spec \(`(samples/[\w/]+\.toml)`\).*?```toml\n(.*?)```", page,
                  re.S)
    assert m is not None
    assert m.group(2) == (ROOT / m.group(1)).read_text()


def test_readme_spec_snippet_runs_beside_the_sample(samples_dir: Path, tmp_path: Path) -> None:
    """The README's short spec, saved in the sample's folder as it says, is a spec `tune`
    takes: its dry run lists the routes of its selection, baseline first."""
    snippets = re.findall(r"```toml\n(.*?)```", README, re.S)
    assert len(snippets) == 1 and len(snippets[0].splitlines()) <= 10
    folder = tmp_path / "convnet"
    shutil.copytree(samples_dir / "convnet", folder)
    (folder / "mine.toml").write_text(snippets[0])
    r = _cli("tune", folder / "mine.toml", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    routes = json.loads(r.stdout)["routes"]
    assert len(routes) >= 2 and all("-optimizer:ConvBNFusion=" in x for x in routes)


def test_readme_is_short_and_its_links_resolve() -> None:
    assert len(README.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        assert (ROOT / link).exists(), link
    assert ". .venv/bin/activate" in README


def test_exit_code_page_is_complete() -> None:
    table = (DOCS / "exit-codes.md").read_text().split("# Exit codes", 1)[1].split("\n\n", 1)[0]
    codes = {int(c) for c in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert codes == {int(c) for c in ExitCode}  # schema --check's 1 is ExitCode.DRIFT
    app_help = " ".join(_cli("--help", env={"COLUMNS": "400"}).output.split())  # as one line
    for code in codes:
        assert re.search(rf"\b{code} [A-Za-z]", app_help), code


def test_cli_reference_page_is_current() -> None:
    """docs/cli.md is what docs/gen_cli.py writes from today's --help (the docs build checks it
    too, where mkdocs is installed)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_cli", DOCS / "gen_cli.py")
    assert spec and spec.loader
    gen_cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_cli)
    assert (DOCS / "cli.md").read_text() == gen_cli.render(), "run python docs/gen_cli.py"


# --------------------------------------------------------------- what a newcomer met (issue B)
TINY_SPEC_TIMING = """
[timing]
samples = 12
rounds = 6
block_warmup = 1
warmup_window = 2
warmup_min_runs = 1
warmup_max_s = 0.2
confirm_top = 1
trial_timeout_s = 60
confirm_rounds = 7
confirm_warmup = 2
confirm_runs = 5
confirm_block_s = 0.05
"""


def _spec(folder: Path, name: str = "tiny", *, tune: str = "", extra: str = "",
          timing: str = TINY_SPEC_TIMING) -> Path:
    """A spec for the conv-net sample in ``folder`` (two routes unless ``tune`` says)."""
    spec = folder / f"{name}.toml"
    spec.write_text(f'[release]\nname = "{name}"\n[model]\npath = "model.onnx"\n'
                    '[validation]\npath = "validation"\n[tune]\n'
                    + (tune or 'selection = "-graph_optimization_level=[all|disable_all]"\n')
                    + 'metric = "linf"\nthreshold = 1e-4\n' + timing + extra)
    return spec


def _dossier(*args: object, **kw) -> subprocess.CompletedProcess[str]:  # noqa: ANN003
    """The command as a shell runs it: a process whose stdout is a pipe, not a terminal."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run([sys.executable, "-m", "dossier_cli.main", *map(str, args)],
                          capture_output=True, text=True, env=env, **kw)


@pytest.fixture()
def convnet(samples_dir: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "convnet"
    shutil.copytree(samples_dir / "convnet", folder)
    return folder


def test_stdout_is_the_result_alone_outside_a_terminal(convnet: Path, tmp_path: Path) -> None:
    """`B=$(dossier release ...); dossier inspect "$B"` works: no empty line before the path
    (the progress bar printed one on stdout when stdout was not a terminal)."""
    spec = _spec(convnet)
    r = _dossier("release", spec, "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{tmp_path / 'out' / 'tiny-1.dossier'}\n"
    assert not r.stderr.startswith("\n") and "\n\n" not in r.stderr
    assert _dossier("inspect", r.stdout.strip()).returncode == 0
    t = _dossier("tune", spec, "--out", tmp_path / "run")
    assert t.returncode == 0, t.stderr
    assert t.stdout.splitlines()[0] == f"run: {tmp_path / 'run'}"
    rt = _dossier("retune", r.stdout.strip(), "--out", tmp_path / "next", "--top", "1")
    assert rt.returncode == 0, rt.stderr
    assert rt.stdout.startswith(f"wrote {tmp_path / 'next' / 'tiny-2.dossier'} ")


@pytest.mark.parametrize("threshold", ["-1", "nan", "0", "inf"])
def test_verify_refuses_a_threshold_that_is_not_above_zero(bundle: Path, threshold: str) -> None:
    r = _cli("verify", bundle, "--recheck", "--threshold", threshold)
    assert r.exit_code == ExitCode.INPUT, r.output
    assert r.output.startswith(f"error: --threshold {float(threshold)}: must be a number above 0")
    assert len(r.output.strip().splitlines()) == 1 and "pydantic" not in r.output


def test_verify_threshold_needs_recheck_and_must_be_stricter(bundle: Path) -> None:
    r = _cli("verify", bundle, "--threshold", "1e-5")
    assert r.exit_code == ExitCode.USAGE and "--threshold applies to --recheck" in r.output
    recorded = json.loads(_cli("inspect", bundle, "--json").stdout)["threshold"]
    r = _cli("verify", bundle, "--recheck", "--threshold", recorded * 10)
    assert r.exit_code == ExitCode.INPUT
    assert f"is looser than the bundle's {recorded:g}" in r.output
    r = _cli("verify", bundle, "--recheck", "--threshold", recorded)  # as strict: re-checked
    assert r.exit_code == 0, r.output
    assert "accuracy re-check passed: worst linf loss" in r.output


def test_verify_help_states_signatures_and_exit_codes() -> None:
    text = " ".join(_cli("verify", "--help", env={"COLUMNS": "200"}).output.split())
    assert 'the signer is checked against --trusted-key only (without one: "signer NOT checked")' \
        in text
    assert "3 bad input" in text and "2 usage" in text


def _help_texts() -> dict[str, str]:
    import typer.main

    def walk(cmd, path: tuple[str, ...]):  # noqa: ANN001, ANN202
        yield path
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, (*path, name))

    return {" ".join(p): _cli(*p, "--help", env={"COLUMNS": "120"}).output
            for p in walk(typer.main.get_command(app), ())}


def test_help_names_values_plainly() -> None:
    texts = _help_texts()
    assert len(texts) > 20
    for command, text in texts.items():
        for typer_style in ("{", "<path>", "<int", "<list[", "<str>", "<float"):
            assert typer_style not in text, (command, typer_style)
    assert "Usage: dossier release [OPTIONS] SPEC\n" in texts["release"]
    assert "-o, --out DIR" in texts["release"] and "-j, --build-jobs N" in texts["release"]
    assert "--trusted-key PUB" in texts["verify"]


@pytest.mark.parametrize("damage", ["model", "validation", "backend", "shapes", "reference"])
@pytest.mark.parametrize("command", ["release", "tune"])
def test_a_refused_spec_leaves_no_output_folder(convnet: Path, tmp_path: Path, damage: str,
                                                command: str) -> None:
    tune, extra = "", ""
    if damage == "model":
        (convnet / "model.onnx").unlink()
    elif damage == "validation":
        shutil.rmtree(convnet / "validation")
    elif damage == "backend":
        tune = 'backend = "no-such-backend"\nselection = "-a=[x|y]"\n'
    elif damage == "shapes":
        extra = "[[shapes]]\ninputs = { x = [4, 5, 32, 32] }\n"
    else:
        (convnet / "validation" / "pair-001" / "references.arrow").unlink()
    spec = _spec(convnet, tune=tune, extra=extra)
    out = tmp_path / "fresh" / "out"
    r = _cli(command, spec, "--out", out)
    assert r.exit_code == ExitCode.INPUT, r.output
    assert not (tmp_path / "fresh").exists(), sorted(str(p) for p in tmp_path.rglob("*"))


@pytest.mark.parametrize(("edit", "message"), [
    (("threshold = 1e-4", "treshold = 1e-4"), "tune: unknown key treshold (did you mean threshold?)"),
    (("[tune]", "[tunes]"), "unknown table [tunes] (did you mean [tune]?)"),
    (("samples = 12", "sample = 12"), "timing: unknown key sample (did you mean samples?)"),
    (("[release]", "[bogus]\n[release]"), "unknown table [bogus] (known: release, model"),
])
def test_spec_typos_are_named(convnet: Path, edit: tuple[str, str], message: str) -> None:
    spec = _spec(convnet)
    spec.write_text(spec.read_text().replace(*edit, 1))
    r = _cli("tune", spec, "--dry-run")
    assert r.exit_code == ExitCode.INPUT, r.output
    assert message in r.output and "Field required" not in r.output


def test_shape_entries_are_numbered_from_one_in_every_message(convnet: Path) -> None:
    ok = "[[shapes]]\ninputs = { x = [1, 3, 32, 32] }\n"
    r = _cli("tune", _spec(convnet, extra=ok + "[[shapes]]\nweight = -1\ninputs = { x = [1, 3, "
                                               "32, 32] }\n"), "--dry-run")
    assert r.exit_code == ExitCode.INPUT and "[[shapes]] entry 2: weight:" in r.output
    r = _cli("tune", _spec(convnet, extra=ok + "[[shapes]]\nwieght = 1\ninputs = { x = [1, 3, "
                                               "32, 32] }\n"), "--dry-run")
    assert "[[shapes]] entry 2: unknown key wieght (did you mean weight?)" in r.output
    r = _cli("tune", _spec(convnet, extra=ok + "[[shapes]]\ninputs = { x = [1, 5, 32, 32] }\n"),
             "--dry-run")  # checked against the model, by the search
    assert r.exit_code == ExitCode.INPUT and "[[shapes]] entry 2: input 'x'" in r.output


def _encoded(arrays: dict[str, object]) -> dict[str, object]:
    """Name -> array as Polygraphy's JSON encoder writes it (numpy.save bytes in base64)."""
    import base64
    import io

    import numpy as np

    out = {}
    for name, arr in arrays.items():
        buf = io.BytesIO()
        np.save(buf, np.asarray(arr), allow_pickle=False)
        out[name] = {"array": base64.b64encode(buf.getvalue()).decode(),
                     "polygraphy_class": "ndarray"}
    return out


def _run_results(runner: str, outputs: list[dict[str, object]]) -> dict[str, object]:
    """A RunResults JSON (polygraphy run --save-outputs) of one runner."""
    return {"lst": [[runner, [{"outputs": _encoded(o), "runtime": 0.001, "runner_name": runner,
                               "polygraphy_class": "IterationResult"} for o in outputs]]],
            "polygraphy_class": "RunResults"}


def test_validation_create_reads_polygraphy_folders_and_outputs(convnet: Path,
                                                                tmp_path: Path) -> None:
    import numpy as np

    from dossier.validation import load_validation_set

    model = convnet / "model.onnx"
    xs = [np.full((n, 3, 32, 32), 0.25 * n, np.float32) for n in (1, 2, 3)]
    r = _cli("validation", "create", tmp_path / "ort", "--model", model, "--reference",
             "onnxruntime-cpu", *[a for i, x in enumerate(xs) for a in
                                  ("-i", _npz(tmp_path / f"x{i}.npz", x=x))])
    assert r.exit_code == 0, r.output
    refs = [p.references for p in load_validation_set(tmp_path / "ort").pairs]
    inputs = tmp_path / "inputs"  # --save-inputs DIR: one file per iteration, 10 after 2
    inputs.mkdir()
    for i, x in zip((0, 2, 10), xs):
        (inputs / f"inputs_{i}.json").write_text(json.dumps([_encoded({"x": x})]))
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(_run_results("onnxrt-runner", refs)))
    r = _cli("validation", "create", tmp_path / "set", "--model", model, "-i", inputs,
             "-r", outputs)
    assert r.exit_code == 0, r.output
    made = load_validation_set(tmp_path / "set")
    assert [p.inputs["x"].shape[0] for p in made.pairs] == [1, 2, 3]
    for pair, ref in zip(made.pairs, refs):
        np.testing.assert_array_equal(pair.references["logits"], ref["logits"])
    folder = tmp_path / "outputs"  # --save-outputs DIR
    folder.mkdir()
    for i, ref in enumerate(refs):
        (folder / f"outputs_{i}.json").write_text(json.dumps(_run_results("onnxrt-runner", [ref])))
    r = _cli("validation", "create", tmp_path / "set2", "--model", model, "-i", inputs,
             "-r", folder)
    assert r.exit_code == 0, r.output
    two = tmp_path / "two.json"
    both = _run_results("trt-runner", refs)
    both["lst"] += _run_results("onnxrt-runner", refs)["lst"]  # type: ignore[operator]
    two.write_text(json.dumps(both))
    r = _cli("validation", "create", tmp_path / "set3", "--model", model, "-i", inputs, "-r", two)
    assert r.exit_code == ExitCode.INPUT
    assert "holds the outputs of 2 runners (trt-runner, onnxrt-runner)" in r.output
    r = _cli("validation", "create", tmp_path / "set4", "--model", model, "-i", inputs, "-r",
             _npz(tmp_path / "one.npz", logits=refs[0]["logits"]))
    assert r.exit_code == ExitCode.INPUT
    assert "3 pair(s) of inputs but 1 pair(s) of references (from 1 --references" in r.output
    assert not any((tmp_path / f"set{n}").exists() for n in (3, 4))


def _npz(path: Path, **arrays: object) -> Path:
    import numpy as np

    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def test_report_latency_axis_fits_the_samples_and_routes_wrap_between_knobs(
        bundle: Path, tmp_path: Path) -> None:
    pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")
    from dossier.formats.report import latency_axis

    fast = [0.17 + 0.001 * (i % 7) for i in range(100)]
    slow = [0.54 + 0.002 * (i % 5) for i in range(99)] + [50.0]  # one straggler
    axis = latency_axis([fast, slow])
    assert axis["type"] == "log" and 10 ** axis["range"][1] < 2 and 10 ** axis["range"][0] > 0.1
    assert "1 sample(s) beyond the axis" in axis["title_text"]
    axis = latency_axis([fast, [x * 1.5 for x in fast]])
    assert axis["type"] == "linear" and 0.1 < axis["range"][0] and axis["range"][1] < 0.3
    page = tmp_path / "r.html"
    assert _cli("explain", bundle, "--html", page).exit_code == 0
    html = page.read_text()
    axis = json.loads(re.search(r'"yaxis":(\{"title":\{"text":"ms per inference[^}]*\},'
                                r'[^}]*\})', html).group(1))  # type: ignore[union-attr]
    low, high = (10 ** v for v in axis["range"]) if axis["type"] == "log" else axis["range"]
    medians = [t["median_ms"] for t in json.loads(_cli("explain", bundle, "--json").stdout)
               ["trials"] if t.get("median_ms")]
    assert low > 0 and low < min(medians) and max(medians) < high  # not from zero, all shown
    assert axis["type"] == "log" or high < 3 * max(medians)
    assert '<span class="tok">-graph_optimization_level=all</span>' in html
    assert "span.tok{white-space:nowrap}" in html


def test_verify_of_another_hosts_fingerprint_names_it(bundle: Path) -> None:
    r = _cli("verify", bundle, "--host-fingerprint", bundle / "fingerprint.json",
             env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert f"on the host of {bundle / 'fingerprint.json'}" in " ".join(r.output.split())
    assert "on this host" not in r.output


def test_explain_payback_says_where_each_figure_came_from(bundle: Path) -> None:
    text = " ".join(_cli("explain", bundle, "--per-day", "1000",
                         env={"COLUMNS": "300"}).output.split())
    assert ("(inferences/day from --per-day; horizon and hosts from the spec's [deployment] or "
            "their defaults)") in text
    text = " ".join(_cli("explain", bundle, "--per-day", "1000", "--hosts", "2",
                         env={"COLUMNS": "300"}).output.split())
    assert ("(inferences/day from --per-day; hosts from --hosts; horizon from the spec's "
            "[deployment] or its default)") in text


def _interrupted(*args: object, after: str, wait: float = 0.0, cwd: Path) -> tuple[int, str]:
    """Run a command, and once a stderr line holds ``after`` (and ``wait`` s later) press
    Ctrl-C: SIGINT to its process group, as a terminal sends it. Its exit status and stderr."""
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    def ctrl_c_as_a_terminal_has_it() -> None:
        # a test worker may run with SIGINT ignored (pytest-xdist's do), and a Python started
        # with SIGINT ignored leaves it so: Ctrl-C would then be lost on the way
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    with subprocess.Popen([sys.executable, "-m", "dossier_cli.main", *map(str, args)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                          cwd=cwd, start_new_session=True,
                          preexec_fn=ctrl_c_as_a_terminal_has_it) as p:  # noqa: PLW1509
        assert p.stderr is not None
        lines = []
        for ln in p.stderr:
            lines.append(ln)
            if after in ln:
                break
        time.sleep(wait)
        os.killpg(p.pid, signal.SIGINT)
        lines += p.stderr.readlines()
        return p.wait(timeout=120), "".join(lines)


def test_readme_first_release_as_written_interrupted_and_resumed(samples_dir: Path,
                                                                 tmp_path: Path) -> None:
    """The README's three commands, run as written in a checkout whose samples are built (and
    whose out/ already holds make sample's bundle). Ctrl-C during the release names the folder
    and the command that resumes it, and that command does; Ctrl-C during verify --rebench names
    no tuning cache."""
    block = README.split("## A first release", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [ln.split("#", 1)[0].split()[1:] for ln in block.splitlines()
                if ln.startswith("dossier ")]
    assert [c[0] for c in commands] == ["release", "verify", "explain"]
    sample = tmp_path / "samples" / "convnet"
    shutil.copytree(samples_dir / "convnet", sample)
    timing = "\n".join(ln for ln in TINY_SPEC_TIMING.splitlines()  # the sample's 12 routes,
                       if not ln.startswith("confirm_"))            # timed briefly
    (sample / "release.toml").write_text((sample / "release.toml").read_text() + timing
                                         + "\nconfirm_rounds = 7\nconfirm_block_s = 0.2\n")
    (tmp_path / "out" / "convnet-1.dossier").mkdir(parents=True)  # as make sample left it
    release = commands[0]
    rc, err = _interrupted(*release, after="[  1] ", cwd=tmp_path)
    assert rc == ExitCode.INTERRUPTED, err
    out = Path(release[release.index("--out") + 1])
    assert err.strip().splitlines()[-1] == (
        f"interrupted; finished trials are kept in {out / '.runs' / 'convnet-1'}: run dossier "
        f"release {release[1]} --out {out} again to resume"), err
    for command in commands:  # the release resumes
        r = _dossier(*command, cwd=tmp_path)
        assert r.returncode == 0, (command, r.stderr)
        if command[0] == "release":
            assert "restored" in r.stderr and r.stdout == f"{out / 'convnet-1.dossier'}\n"
    rc, err = _interrupted("verify", out / "convnet-1.dossier", "--rebench", after="OK: ",
                           wait=0.5, cwd=tmp_path)
    assert rc == ExitCode.INTERRUPTED, err
    assert err.strip().splitlines()[-1] == ("interrupted; verify wrote nothing (run it again "
                                            "to check the bundle)")
    assert "tuning cache" not in err


def test_interrupted_tune_names_the_command_that_resumes_it(convnet: Path,
                                                            tmp_path: Path) -> None:
    selection = ('selection = "-graph_optimization_level=[all|basic|disable_all] '
                 '-optimizer:NchwcTransformer=[on|off] -optimizer:ConvBNFusion=[on|off]"\n'
                 'strategy = "full"\n')
    spec = _spec(convnet, tune=selection)
    run = tmp_path / "run"
    rc, err = _interrupted("tune", spec, "--out", run, after="[  1] ", cwd=tmp_path)
    assert rc == ExitCode.INTERRUPTED, err
    line = err.strip().splitlines()[-1]
    assert line == (f"interrupted; finished trials are kept in {run}: resume with dossier tune "
                    f"--continue {run}"), err
    again = _dossier(*line.split("resume with dossier ", 1)[1].split(), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "restored" in again.stderr and again.stdout.startswith(f"run: {run}\n")


def test_make_sample_builds_without_setuptools_warnings(tmp_path: Path) -> None:
    """The install step of `make sample` (an editable install runs the same build backend):
    no deprecation warning, no "package would be ignored"."""
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT,
                           check=True).stdout.split()
    src = tmp_path / "src"
    for f in files:
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    # this environment's setuptools when it meets [build-system] requires (no download), else
    # pip's isolated build environment with what pyproject.toml asks for (a fresh venv's
    # setuptools 65 rejects the license string)
    isolation = ["--no-build-isolation"] if _build_requirements_met() else []
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation,
                        "-v", str(src), "-w", str(tmp_path / "wheel")], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    log = r.stdout + r.stderr
    for warning in ("Warning", "deprecated", "would be ignored"):
        assert warning not in log, log[log.find(warning) - 500:log.find(warning) + 500]
    import zipfile

    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    assert "dossier/formats/templates/report.html.j2" in zipfile.ZipFile(wheel).namelist()


def _build_requirements_met() -> bool:
    """Whether this environment has what pyproject.toml's [build-system] requires."""
    from importlib import metadata

    from packaging.requirements import Requirement

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    for text in tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]:
        req = Requirement(text)
        try:
            if not req.specifier.contains(metadata.version(req.name), prereleases=True):
                return False
        except metadata.PackageNotFoundError:
            return False
    return True


def test_make_test_and_ci_are_described_as_they_are() -> None:
    makefile = (ROOT / "Makefile").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "(what CI runs)" not in makefile and "what CI runs" not in README
    for step in ("make typecheck", "make test", "mkdocs build --strict"):
        assert step in ci and step in README, step
    assert "chromium" in ci and "docker-registry" in ci
