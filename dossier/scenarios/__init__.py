"""Serving scenarios run by MLPerf LoadGen (server, offline): the driver that serves an engine
to LoadGen from N sessions (:mod:`.driver`), the process each run is bounded in (:mod:`.child`),
LoadGen's logs read back with limits (:mod:`.logs`), the search for the highest rate meeting a
bound (:mod:`.search`). The scenario itself is :mod:`dossier.scenario`."""
