"""The measurement: timing settings and procedure (:mod:`.timing`), the confirmation's
statistics (:mod:`.confirmation`), the reading that judges itself (:mod:`.reading`: its
level, its verdict against the minimum effect, its text), the host's conditions
(:mod:`.conditions`), one latency per route (:mod:`.latency`) and the speedup figure
(:mod:`.figure`). Nothing here starts a process: :mod:`dossier.jobs` does."""
