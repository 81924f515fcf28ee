"""The version of dossier (its own module, so that modules recording it import nothing above
them: the package root lazily imports the serving API)."""

__version__ = "0.1.0"
