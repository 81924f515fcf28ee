"""A run folder's layout: the files ``dossier tune`` writes there (the bundle carries the same
three records under the same names), where a release keeps its run folder, and "a run folder
or its tuning cache" read as one path."""

from __future__ import annotations

from pathlib import Path

CACHE_NAME = "tuning-cache.jsonl"
"""The search record (the tuning cache)."""
KNOBS_NAME = "knobs.json"
"""The knob database the search used."""
FINGERPRINT_NAME = "fingerprint.json"
"""The tuning host."""
ENGINES = "engines"
"""The folder of built engines."""
WORK = ".work"
"""Trial requests, results and logs."""
RUNS = ".runs"
"""Under a release's output folder: the run folders of its searches."""


def trial_name(index: int) -> str:
    """The name trial ``index``'s files are named by (its engine, request, result and log):
    ``trial-0007``."""
    return f"trial-{index:04d}"


def holdout_name(index: int) -> str:
    """The name the hold-out check of trial ``index``'s engine is named by (its request,
    result and log): ``holdout-0007``."""
    return f"holdout-{index:04d}"


def cache_file(source: Path) -> Path:
    """The tuning cache of ``source``: a run folder's, or ``source`` itself."""
    source = Path(source)
    return source / CACHE_NAME if source.is_dir() else source


def release_folder(out_dir: Path, name: str, version: int) -> Path:
    """Where ``dossier release`` (and ``retune``) keeps the run folder of release ``name``
    version ``version``: ``OUT/.runs/NAME-VERSION``."""
    return Path(out_dir) / RUNS / f"{name}-{version}"


SCENARIO = "scenario"
"""The run folder's (and the bundle's) folder of a scenario's evidence
(:mod:`dossier.scenarios.evidence`)."""


def scenario_files(run_dir: Path) -> list[tuple[Path, str]]:
    """The scenario's files of a run folder, as (path, bundle path); none without a scenario
    decision. Regular files only (a link is not followed into the bundle)."""
    folder = Path(run_dir) / SCENARIO
    if not (folder / "decision.json").is_file():
        return []
    return [(p, p.relative_to(run_dir).as_posix()) for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()]
