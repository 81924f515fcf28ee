"""Logging: the library logs through module loggers and configures nothing; the CLI's -v, -vv
and --log-file route the records; long commands end with Polygraphy's closing line; a failed
trial's worker log is named by tune's progress line and by explain."""

from __future__ import annotations

import importlib
import io
import json
import logging
import pkgutil
import re
import sys
from pathlib import Path

import pytest
from conftest import cli, write_tiny_timing

import dossier
from dossier.errors import ExitCode
from dossier_cli import logs


def _faulty_spec(sample, selection: str) -> Path:  # type: ignore[no-untyped-def]
    """The conv-net sample on the fault-injecting backend, tiny timing."""
    spec_path, _ = sample("convnet")
    text = spec_path.read_text()
    text = re.sub(r'(?m)^backend = .*$', 'backend = "faulty"', text)
    text = re.sub(r'(?m)^strategy = .*$', 'strategy = "fast"', text)
    text = re.sub(r'(?m)^selection = .*$', f'selection = "{selection}"', text)
    spec_path.write_text(text)
    write_tiny_timing(spec_path)
    return spec_path


def test_the_library_configures_no_handler() -> None:
    """Every module of the library imported: no logger of dossier has a handler or a level of
    its own (the program that uses dossier decides where records go)."""
    for mod in pkgutil.walk_packages(dossier.__path__, "dossier."):
        if mod.name.startswith(("dossier.backends.tensorrt", "dossier.backends.torch_inductor",
                                "dossier.executors.ray")):
            continue  # optional libraries
        importlib.import_module(mod.name)
    loggers = [logging.getLogger(n) for n in logging.root.manager.loggerDict
               if n == "dossier" or n.startswith("dossier.")]
    assert any(lg.name == "dossier.tuner" for lg in loggers)
    for lg in loggers:
        assert lg.handlers == [] and lg.level == logging.NOTSET, lg.name


def test_the_closing_line() -> None:
    assert logs.closing_line(["tune", "a b.toml"], 0, 12.34) == \
        "PASSED | dossier tune 'a b.toml' | 12.3 s"
    assert logs.closing_line(["verify", "x"], 6, 0.04) == "FAILED (exit 6) | dossier verify x | 0.0 s"


def test_without_v_stderr_is_unchanged(tmp_path: Path) -> None:
    """No -v and no terminal: a failing command says its one line and nothing more."""
    res = cli("verify", tmp_path / "nothing")
    assert res.exit_code == ExitCode.BUNDLE
    assert res.stderr.splitlines() == [ln for ln in res.stderr.splitlines() if "nothing" in ln]
    assert "FAILED" not in res.stderr and "INFO" not in res.stderr


def test_v_logs_the_steps_and_closes_with_the_exit_code(tmp_path: Path) -> None:
    res = cli("-v", "verify", tmp_path / "nothing")
    assert res.exit_code == ExitCode.BUNDLE  # unchanged by the closing line
    lines = res.stderr.splitlines()
    assert any(ln.startswith("INFO dossier.verify.pipeline: ") and "integrity: failed" in ln for ln in lines)
    assert not any(ln.startswith("DEBUG") for ln in lines)
    assert re.fullmatch(r"FAILED \(exit 6\) \| dossier -v verify \S+nothing \| \d+\.\d s",
                        lines[-1]), lines[-1]
    # a command run afterwards in the same process starts with the handlers of its own
    assert logging.getLogger("dossier").handlers == []
    again = cli("verify", tmp_path / "nothing")
    assert "INFO" not in again.stderr


def test_help_and_short_commands_have_no_closing_line() -> None:
    assert "PASSED" not in cli("-v", "tune", "--help").stderr
    res = cli("-v", "knobs", "--backend", "faulty", "--json")
    assert res.exit_code == 0 and "PASSED" not in res.stderr


def test_a_log_file_that_cannot_be_written(tmp_path: Path) -> None:
    res = cli("--log-file", tmp_path / "no" / "such" / "x.log", "verify", tmp_path)
    assert res.exit_code == ExitCode.OUTPUT
    assert len(res.stderr.splitlines()) == 1 and "cannot write the log file" in res.stderr


def test_a_release_with_failed_trials(sample, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """--log-file gets every record (DEBUG included) and the closing line; the progress line of
    a crashed trial names its worker log; explain names it too; the finished search keeps
    only the logs of failed trials that said something."""
    spec = _faulty_spec(sample, "-fault=[none|segv|raise]")
    log_file = tmp_path / "dossier.log"
    out = tmp_path / "out"
    res = cli("--log-file", log_file, "release", spec, "--out", out)
    assert res.exit_code == 0, res.output
    assert "PASSED" not in res.stderr and "INFO" not in res.stderr  # not a terminal, no -v
    text = log_file.read_text()
    assert " DEBUG dossier.jobs.child: trial-0000: trial process " in text
    assert re.search(r" INFO dossier\.tuner: trial 0 \(baseline\) .* started; its log: \S+"
                     r"trial-0000\.log", text)
    assert re.search(r" INFO dossier_cli\.status: PASSED \| dossier --log-file \S+ release ", text)

    work = out / ".runs" / "convnet-1" / ".work"
    crashed = [ln for ln in res.stderr.splitlines() if " crashed " in ln]
    assert len(crashed) == 1 and crashed[0].endswith("log: " + str(work / "trial-0001.log"))
    assert "Segmentation fault" in (work / "trial-0001.log").read_text()  # faulthandler
    failed_build = next(ln for ln in res.stderr.splitlines() if "build_failed" in ln)
    assert "log: " not in failed_build  # it printed nothing: no log to read
    assert sorted(p.name for p in work.iterdir()) == ["trial-0001.log"]

    facts = json.loads(cli("explain", out / "convnet-1.dossier", "--json").stdout)
    by_index = {t["index"]: t["log"] for t in facts["trials"]}
    assert by_index[1] == str(work / "trial-0001.log")
    assert [v for k, v in by_index.items() if k != 1] == [None] * (len(by_index) - 1)
    assert {r["index"]: r["log"] for r in facts["rejected"]}[1] == str(work / "trial-0001.log")

    # the bundle elsewhere: no run folder beside it, no log named
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    (out / "convnet-1.dossier").rename(moved / "convnet-1.dossier")
    facts = json.loads(cli("explain", moved / "convnet-1.dossier", "--json").stdout)
    assert all(t["log"] is None for t in facts["trials"])


@pytest.mark.parametrize("flags,debug", [(["-v"], False), (["-vv"], True)])
def test_verbosity_levels(sample, tmp_path: Path, flags: list[str], debug: bool) -> None:  # type: ignore[no-untyped-def]
    spec = _faulty_spec(sample, "-fault=[none]")
    res = cli(*flags, "tune", spec, "--out", tmp_path / "run", "--quiet")
    assert res.exit_code == 0, res.output
    lines = res.stderr.splitlines()
    assert any(ln.startswith("INFO dossier.tuner: trial 0 (baseline)") for ln in lines)
    assert any(ln.startswith("DEBUG dossier.jobs.child: ") for ln in lines) is debug
    assert lines[-1].startswith(f"PASSED | dossier {flags[0]} tune ")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_the_closing_line_without_v(monkeypatch: pytest.MonkeyPatch) -> None:
    for stream, shown in ((_Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        logs.close_command("tune", ["tune", "spec.toml"], 4, 2.0)
        logs.close_command("explain", ["explain", "b"], 0, 2.0)  # not a long command
        assert stream.getvalue() == ("FAILED (exit 4) | dossier tune spec.toml | 2.0 s\n"
                                     if shown else "")
