"""``verify --rebench`` of a bundle whose tuning header asks for days of timing: the settings are
clamped (``REBENCH_LIMITS``), ``--max-s`` bounds the whole re-timing and a measuring process
that fails names a log that is still there; an unreadable validation set is a bundle error.

The golden bundle (conftest's ``bundle``), resealed after each edit; test_verify.py re-times a
bundle tuned on this host. Every case here failed before its fix; the docstrings say how."""

from __future__ import annotations

import json
from pathlib import Path

import _bundles as h
from _hostile import _within

from dossier.errors import ExitCode


def _greedy_timing(bundle: Path) -> None:
    """Every timing setting of the tuning header at a value that runs for days; resealed."""
    cache = bundle / "tuning-cache.jsonl"
    lines = cache.read_text().splitlines()
    header = json.loads(lines[0])
    from dossier.measure.timing import TIMING_MAXIMA

    header["timing"].update({k: v for k, v in TIMING_MAXIMA.items()
                             if k not in ("warmup_tolerance", "min_effect",
                                          "trial_memory_limit_mb")})
    cache.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    h.reseal(bundle)


def test_rebench_clamps_a_bundles_timing_settings(bundle: Path) -> None:
    from dossier.bundle import open_bundle
    from dossier.verify import REBENCH_LIMITS, rebench_timing

    _greedy_timing(bundle)
    with open_bundle(bundle) as b:
        timing = rebench_timing(b.tuning_cache().header.timing, max_s=100)
    for name, limit in REBENCH_LIMITS.items():
        assert getattr(timing, name) <= limit, name
    assert timing.trial_timeout_s <= 100 / timing.confirm_processes


def test_rebench_within_max_s_keeps_its_log_where_it_says(bundle: Path, host: Path) -> None:
    """Before: a bundle's timing header made --rebench run for days with no option to bound
    it, and a failed measuring process named a log already deleted."""
    import re

    _greedy_timing(bundle)
    res = _within(120, lambda: h.cli("verify", bundle, "--host-fingerprint", host, "--rebench",
                                     "--max-s", "2"))
    assert not isinstance(res, BaseException), res
    assert res.exit_code == ExitCode.INPUT, h.said(res)
    assert "--max-s" in h.said(res)
    log = re.search(r"its log is (\S+\.log)", h.said(res))
    assert log is not None and Path(log.group(1)).is_file(), h.said(res)


def test_rebench_of_an_unreadable_validation_set_is_a_bundle_error(bundle: Path,
                                                                   host: Path) -> None:
    """Before: exit 4 ("the search could not produce a result")."""
    (bundle / "validation" / "pair-000" / "inputs.arrow").write_bytes(b"not arrow")
    h.reseal(bundle)
    res = h.cli("verify", bundle, "--host-fingerprint", host, "--rebench")
    assert res.exit_code == ExitCode.BUNDLE, h.said(res)
    assert "validation set cannot be read" in h.said(res)
