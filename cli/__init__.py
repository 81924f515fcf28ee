"""The ``dossier`` command line: a thin typer layer over the :mod:`dossier` library."""
