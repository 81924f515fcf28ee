"""Package layout (the metadata is in pyproject.toml).

- ``dossier/`` (every subpackage found) is the library;
- ``cli/`` is installed as ``dossier_cli`` (the console script ``dossier``), not as a generic
  top-level ``cli``;
- ``dossier/formats/templates/`` (the HTML report's template) is a data package, listed by name;
- ``schemas/``, the one committed copy of the JSON Schema files, is installed as
  ``dossier/schemas/`` (``dossier.schema.packaged_schema`` reads it there).
"""

from setuptools import find_packages, setup

setup(
    # dossier.formats.templates holds the report's Jinja2 template (data, no __init__.py)
    packages=[*find_packages(include=["dossier", "dossier.*"]), "dossier.formats.templates",
              "dossier_cli", "dossier.schemas"],
    package_dir={"dossier_cli": "cli", "dossier.schemas": "schemas"},
)
