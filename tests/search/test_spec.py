"""Release specs (``dossier/spec.py``) as untrusted input: every number is bounded (no
overflow, no minutes of arithmetic, no ``inf`` timeout, weight or tolerance), and a model path
that is a link loop or too long, or a FIFO in place of the spec, is one line, exit 3.

Every case here failed before its fix; the docstrings say what happened."""

from __future__ import annotations

import time
from pathlib import Path

import _bundles as h
import pytest
from _hostile import _fifo, _within

from dossier.errors import ExitCode, SpecError

# --------------------------------------------------------------------------------- numbers
SPEC = """[release]
name = "x"
[model]
path = "m.onnx"
[validation]
path = "v"
[tune]
selection = "-a=[x|y]"
threshold = 0.1
"""
NUMBERS = {
    "rounds = 2000": ("[timing]\nrounds = 2000", "timing"),
    "rounds = 10**8": ("[timing]\nrounds = 100000000", "timing"),
    "trial_timeout_s = inf": ("[timing]\ntrial_timeout_s = inf", "timing"),
    "warmup_max_s = inf": ("[timing]\nwarmup_max_s = inf", "timing"),
    "min_effect = inf": ("[timing]\nmin_effect = inf", "timing"),
    "confirm_block_s = 1e300": ("[timing]\nconfirm_block_s = 1e300", "timing"),
    "memory limit 2**60 MB": ("[timing]\ntrial_memory_limit_mb = 1152921504606846976", "timing"),
    "samples = 10**12": ("[timing]\nsamples = 1000000000000", "timing"),
    "shape weight inf": ('[[shapes]]\nweight = inf\ninputs = {x = [1, 2]}', "weight"),
    "shape dimension 2**70": ('[[shapes]]\ninputs = {x = [1, 1180591620717411303424]}',
                              "inputs"),
    "shape dimension 0": ('[[shapes]]\ninputs = {x = [0, 2]}', "inputs"),
    "atol = 1e308": ("", "atol"),
    "atol = inf": ("", "atol"),
    "rtol = inf": ("", "rtol"),
    "inferences_per_day = inf": ("[deployment]\ninferences_per_day = inf", "inferences_per_day"),
    "horizon_days = 1e300": ("[deployment]\nhorizon_days = 1e300", "horizon_days"),
    "release version 2**40": ("", "version"),
}


@pytest.mark.parametrize("case", sorted(NUMBERS))
def test_spec_numbers_are_bounded(tmp_path: Path, case: str) -> None:
    """Before: rounds = 2000 was an OverflowError traceback, rounds = 1e23 ran for minutes
    computing 2**rounds, inf timeouts, weights and tolerances were accepted (then every trial
    died, or the accuracy check was off), a 2**70 dimension crashed at bundling."""
    from dossier.spec import load_spec

    extra, where = NUMBERS[case]
    text = SPEC
    if case.startswith(("atol", "rtol")):
        text = text.replace("threshold = 0.1", f"threshold = 0.1\n{case}")
    if case.startswith("release version"):
        text = text.replace('name = "x"', 'name = "x"\nversion = 1099511627776')
    (tmp_path / "release.toml").write_text(text + extra + "\n")
    t0 = time.monotonic()
    with pytest.raises(SpecError, match=where):
        load_spec(tmp_path / "release.toml")
    assert time.monotonic() - t0 < 5


def test_a_spec_with_rounds_2000_gets_one_line_even_with_dry_run(samples_dir: Path,
                                                                  tmp_path: Path) -> None:
    spec = h.write_spec(tmp_path / "release.toml", samples_dir / "convnet",
                        timing={**h.SMALL_TIMING, "rounds": 2000})
    res = h.cli("tune", spec, "--out", tmp_path / "run", "--dry-run")
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    assert res.stderr.count("\n") == 1 and "timing.rounds = 2000" in res.stderr


# ----------------------------------------------------------------------------------- paths
def _spec(tmp_path: Path, model: str) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(f'[release]\nname = "a"\n[model]\npath = "{model}"\n[validation]\n'
                    'path = "validation"\n[tune]\nbackend = "onnxruntime"\n'
                    'selection = "-graph_optimization_level=[all|basic]"\nmetric = "linf"\n'
                    "threshold = 1e-4\n")
    return path


@pytest.mark.parametrize("case", ["a symbolic link loop", "a name over NAME_MAX", "a FIFO"])
def test_a_hostile_spec_path_gets_one_line(tmp_path: Path, case: str) -> None:
    """Before: a model path that is a symbolic link loop or longer than NAME_MAX was exit 70
    with a traceback; a FIFO in place of the spec blocked for ever."""
    if case == "a symbolic link loop":
        (tmp_path / "loop").symlink_to(tmp_path / "loop")
        spec = _spec(tmp_path, str(tmp_path / "loop"))
    elif case == "a name over NAME_MAX":
        spec = _spec(tmp_path, "x" * 300 + ".onnx")
    else:
        spec = _fifo(tmp_path / "spec.toml")
    res = _within(20, lambda: h.cli("tune", spec, "--dry-run"))
    assert not isinstance(res, BaseException), res
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    assert "Traceback" not in h.said(res)
