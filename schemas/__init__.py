"""The JSON Schema files of every format dossier writes or reads, generated from the models by
``dossier schema --out schemas`` (never edited by hand). Installed as ``dossier.schemas``."""
