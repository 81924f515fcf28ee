"""``dossier run --scenario``: the smoke test of a release's server or offline scenario after a
rollout (:func:`smoke`; the replay itself is :func:`dossier.scenarios.replay.replay`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dossier.scenarios.evidence import recorded
from dossier.scenarios.replay import Replay, replay


def smoke(source: str | Path, **verify: Any) -> Replay:
    """``dossier run --scenario``: the bundle at ``source`` verified (``verify``: the keyword
    arguments of :func:`dossier.serve.opened`), and one LoadGen run of its recorded scenario
    at its recorded rate. InputError (exit 3) for a bundle released without one."""
    from dossier import serve
    from dossier.errors import InputError

    options: dict[str, Any] = {k: (str(v) if isinstance(v, Path) else [str(x) for x in v]
                   if isinstance(v, (list, tuple)) else v)
               for k, v in verify.items() if v is not None}
    with serve.opened(source, read_validation=False, **options) as (_, bundle):
        decision = recorded(bundle)
    if decision is None:
        raise InputError(f"{source} was released for single-stream: it records no server or "
                         "offline scenario to replay", hint="leave out --scenario")
    return replay(str(source), decision, search=False, verify=options)
