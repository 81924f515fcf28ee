"""``dossier explain``'s text for a search, read from its tuning cache (the bundle stays on the
machine that ran it; this needs only the cache that ``run.sh`` brings back in
``caches-TAG.tar.gz``). Facts only a bundle holds (the host fingerprint, the dossier id) are
absent.

    python bench/h200/explain_cache.py RUN/tuning-cache.jsonl > explain.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str]) -> int:
    from dossier.audit.explain import explain_search
    from dossier.cache import TuningCache
    from dossier.errors import DossierError
    from dossier_cli.cmd_explain import render_explanation

    try:  # read only: a torn last line is ignored, not cut off
        cache = TuningCache.open(Path(argv[1]))
    except DossierError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    if cache.decision is None:
        print(f"{argv[1]}: the search did not finish (no decision)", file=sys.stderr)
        return 1
    render_explanation(explain_search(cache.header, cache.trials, cache.sessions,
                                      cache.decision))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
