"""What a host is and what an engine needs of it: the verify policy primitives
(:mod:`.policy`: verdicts, rules, policies, the field-by-field diff of two fingerprints) that
backends contribute rules to and :mod:`dossier.verify` applies. It sits at the bottom of the
library: it imports no backend and nothing of verify/, so both can import it."""
