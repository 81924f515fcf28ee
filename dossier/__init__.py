"""dossier: tune compiled inference engines, bundle them with their evidence, verify them on
target hosts, and explain why a build route was chosen."""

__version__ = "0.1.0"
