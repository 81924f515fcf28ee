"""The measurement: timing settings and procedure (:mod:`.timing`), the confirmation's
statistics (:mod:`.confirmation`), the speed verdict (:mod:`.verdict`), the host's conditions
(:mod:`.conditions`), one latency per route (:mod:`.latency`) and the speedup figure
(:mod:`.figure`). Nothing here starts a process: :mod:`dossier.jobs` does."""
