"""Jobs and their processes: the worker protocol and request factory (:mod:`.requests`),
the per-trial worker (:mod:`.worker`), its child process (:mod:`.child`), build jobs
(:mod:`.builds`) and the confirmation's measuring processes (:mod:`.measuring`)."""
