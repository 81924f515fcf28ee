"""Re-tune a released bundle on this host and write the next release version.

The search starts from the bundle's best routes (the shipped route, the runner-up and the other
admissible routes, best first), measured right after the baseline, then runs the bundle's own
strategy over its own selection. The new bundle's ``parent`` is the old dossier id.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dossier.backends import describe
from dossier.bundle import (
    Bundle,
    Manifest,
    WrittenBundle,
    check_integrity,
    check_target,
    open_bundle,
    write_bundle,
)
from dossier.cache import CacheHeader
from dossier.errors import InputError, IntegrityError
from dossier.hashing import digest_file
from dossier.names import inside
from dossier.run_folder import release_folder
from dossier.trial import TrialRecord
from dossier.tuner import TuneObserver, TuneResult, tune


@dataclass
class Retuned:
    """A finished re-tune."""

    tune: TuneResult
    bundle: WrittenBundle
    parent: str
    warm_start: list[str]


def warm_routes(trials: Sequence[TrialRecord], shipped: str, runner_up: str | None,
                baseline: str) -> list[str]:
    """The shipped route, the runner-up, then every other admissible search route by its
    recorded speedup (best first); the baseline is measured anyway and left out."""
    speedups = [(t.comparison.speedup, t.route) for t in trials
                if t.role == "search" and t.admissible and t.comparison]
    ranked = [route for _, route in sorted(speedups, key=lambda x: -x[0])]  # stable: ties in order
    out: list[str] = []
    for route in [shipped, runner_up, *ranked]:
        if route and route != baseline and route not in out:
            out.append(route)
    return out


def retune(bundle_path: Path, out_dir: Path, *, model: Path | None = None,
           work: Path | None = None, observer: TuneObserver | None = None,
           top: int = 3) -> Retuned:
    """Re-run the search of ``bundle_path`` here, warm-started from its ``top`` best routes,
    and bundle the result as the next version under ``out_dir``.

    The model is the one stored in the bundle, or ``model``, whose xxh3-128 must match the
    bundle's model identity. The bundle must pass its integrity check first.
    """
    out_dir = Path(out_dir).absolute()  # the spec rebuilt below resolves paths against "/"
    work = Path(work).absolute() if work else None
    with open_bundle(Path(bundle_path)) as b:
        report = check_integrity(b)
        if not report:
            raise IntegrityError(f"{b.source}: {report}")
        m = b.manifest
        if not (b.path / "validation").is_dir():  # a trtexec import carries none
            raise InputError(f"{b.source} has no validation set to re-tune against",
                             hint="tune the model with a release spec and a validation set")
        header = b.tuning_cache().header
        trials = b.tuning_cache().trials
        # the bundle it would write first: a second re-tune into OUT names that bundle, not
        # the work folder the first one left
        check_target(out_dir, m.release, m.release_version + 1)
        run = Path(work) if work else inside(
            out_dir, release_folder(out_dir, m.release, m.release_version + 1), str(b.source))
        if run.exists() and any(run.iterdir()):
            from dossier.errors import OutputError

            raise OutputError(f"work folder {run} is not empty",
                              hint="remove it, or give another --work")
        inputs = run.parent / f".{run.name}.inputs"
        created = [d for d in (out_dir, run.parent) if not d.exists()]
        try:
            return _retune(b, m, header, trials, run, inputs, out_dir, model, observer, top)
        except BaseException:
            # nothing of a re-tune that did not finish a trial is worth keeping
            shutil.rmtree(inputs, ignore_errors=True)
            if not any(t.admissible for t in _trials_in(run)):
                shutil.rmtree(run, ignore_errors=True)
                for d in sorted(created, key=lambda p: -len(p.parts)):
                    with contextlib.suppress(OSError):
                        d.rmdir()
            raise


def _trials_in(run: Path) -> list[TrialRecord]:
    from dossier.cache import TuningCache
    from dossier.errors import DossierError
    from dossier.run_folder import CACHE_NAME

    try:
        return TuningCache.open(run / CACHE_NAME).trials if (run / CACHE_NAME).is_file() else []
    except DossierError:
        return []


def _retune(b: Bundle, m: Manifest, header: CacheHeader, trials: list[TrialRecord], run: Path,
            inputs: Path, out_dir: Path, model: Path | None, observer: TuneObserver | None, top: int) -> Retuned:
    shutil.rmtree(inputs, ignore_errors=True)
    inputs.mkdir(parents=True)
    if model is not None:
        digest, _ = digest_file(Path(model))
        if digest != m.model.digest:
            raise InputError(f"--model {model} is not the bundle's model "
                             f"(xxh3-128 {digest}, the bundle's is {m.model.digest})")
        model_path = Path(model).resolve()
    elif m.model_included:
        src = b.path / "model"
        shutil.copytree(src, inputs / "model")
        model_path = inside(inputs / "model", inputs / "model" / m.model.file_name,
                            str(b.source))
    else:
        raise InputError(f"{b.source} does not include its model",
                         hint="give the model with --model; its hash must match the bundle's")
    shutil.copytree(b.path / "validation", inputs / "validation")
    warm = warm_routes(trials, m.summary.shipped_route, m.summary.runner_up_route,
                       m.summary.baseline_route)[:top]
    base = header.spec
    spec = base.model_copy(update={
        "release": base.release.model_copy(update={"version": m.release_version + 1}),
        "model": base.model.model_copy(update={"path": str(model_path)}),
        "validation": base.validation.model_copy(update={"path": str(inputs / "validation")}),
    })
    result = tune(spec, run, observer=observer, warm_start=warm, parent=m.dossier_id)
    written = write_bundle(run, out_dir, parent=m.dossier_id, describe=describe)
    return Retuned(result, written, m.dossier_id, warm)
