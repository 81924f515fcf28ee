"""Serving scenarios run by MLPerf LoadGen (server, offline); the scenario itself is
:mod:`dossier.scenario`.

- :mod:`.models`: the records (a run's settings, a search's probes, a decision), a leaf;
- :mod:`.logs`: LoadGen's logs read back with limits;
- :mod:`.driver`: one LoadGen run in this process, N sessions answering from worker threads;
- :mod:`.child` / :mod:`.worker`: each run in a process of its own, bounded in time;
- :mod:`.search`: the highest rate meeting a bound, resumable from its record;
- :mod:`.decide`: the decision (repetitions, the A/A copy, the minimum effect, Holm);
- :mod:`.release`: the seam after a release's single-stream decision;
- :mod:`.evidence`, :mod:`.curve`: the bundle's files, and what ``explain`` draws;
- :mod:`.replay`, :mod:`.smoke`: ``verify --rebench`` and ``dossier run --scenario``;
- :mod:`.pool`: the sessions a bundle's route serves with, loaded for serving.
"""
