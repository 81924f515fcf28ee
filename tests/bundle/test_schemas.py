"""schemas/ (and the package's copy) are generated from the models and must not drift."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import _bundles as h
import pytest

from dossier.errors import ExitCode
from dossier.schema import (
    SCHEMAS,
    check_schemas,
    generate,
    packaged_dir,
    packaged_schema,
    write_schemas,
)

COMMITTED = h.REPO / "schemas"


def _diff(a: Path, b: Path) -> list[str]:
    names = sorted({p.name for p in a.glob("*.json")} | {p.name for p in b.glob("*.json")})
    return [n for n in names
            if not (a / n).is_file() or not (b / n).is_file()
            or (a / n).read_bytes() != (b / n).read_bytes()]


@pytest.mark.parametrize("committed", [COMMITTED, packaged_dir()], ids=["schemas", "installed"])
def test_committed_schemas_match_the_models(committed: Path, tmp_path: Path) -> None:
    write_schemas(tmp_path)
    drifted = _diff(tmp_path, committed)
    assert not drifted, (f"{committed} drifted from the models: {drifted}; regenerate with "
                         f"`dossier schema --out {committed.relative_to(h.REPO)}`")


def test_schema_check_command(tmp_path: Path) -> None:
    assert h.cli("schema", "--check", "--out", COMMITTED).exit_code == 0
    res = h.cli("schema", "--check")  # the installed copy
    assert res.exit_code == 0 and f"OK: {packaged_dir()} is up to date" in res.stderr
    work = tmp_path / "schemas"
    shutil.copytree(COMMITTED, work)
    manifest = work / "bundle-manifest.v1.schema.json"
    text = manifest.read_text()
    assert '"description"' in text
    manifest.write_text(text.replace('"description"', '"description" ', 1))  # any edit drifts
    (work / "fingerprint.schema.json").unlink()
    (work / "old.schema.json").write_text("{}\n")
    res = h.cli("schema", "--check", "--out", work)
    assert res.exit_code == ExitCode.DRIFT == 1
    assert [line.rsplit("/", 1)[-1] for line in res.stderr.splitlines()
            if line.startswith("drifted:")] == ["bundle-manifest.v1.schema.json",
                                                "fingerprint.schema.json", "old.schema.json"]
    res = h.cli("schema", "--out", work)
    assert res.exit_code == 0 and check_schemas(work) == []
    assert not (work / "old.schema.json").exists()


def test_schemas_are_deterministic_and_described() -> None:
    first, second = generate(), generate()
    assert first == second and set(first) == set(SCHEMAS)
    for name, text in first.items():
        assert text.endswith("}\n")
        data = json.loads(text)
        assert text == json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        assert data["$schema"].startswith("https://json-schema.org/")
        for title, model in [("(top)", data), *data.get("$defs", {}).items()]:
            for field, prop in model.get("properties", {}).items():
                ref = prop.get("$ref", "").rsplit("/", 1)[-1]  # pydantic leaves out a description
                described = prop.get("description") or data["$defs"].get(ref, {}).get(
                    "description")  # equal to the referenced model's own
                assert described, f"{name}: {title}.{field} has no description"


def test_manifest_schema_pins_the_format() -> None:
    schema = json.loads(generate()["bundle-manifest.v1.schema.json"])
    assert schema["additionalProperties"] is False
    assert schema["properties"]["format"]["const"] == "dossier-bundle"
    assert "dossier_id" in schema["required"] and "files" in schema["required"]
    spec = json.loads(generate()["release-spec.schema.json"])
    assert "base_dir" not in spec["properties"]  # set by the loader, never in release.toml


def test_packaged_schema_is_readable() -> None:
    assert packaged_schema("bundle-manifest.v1.schema.json")["title"] == "Manifest"


def test_spec_schema_lists_the_metrics_and_strategies_that_exist() -> None:
    """The Literals in the spec are the registries' names: every metric computes a loss, every
    strategy is registered (and nothing registered is missing from the schema)."""
    import numpy as np

    from dossier.strategies import STRATEGIES
    from dossier.validation import loss

    spec = json.loads(generate()["release-spec.schema.json"])
    tune = spec["$defs"]["TuneSection"]["properties"]
    assert set(tune["strategy"]["enum"]) == set(STRATEGIES)
    a = np.array([1.0, 2.0, 3.0])
    for metric in tune["metric"]["enum"]:
        assert loss(metric, a, a + 0.5) is not None
    assert {"onnxruntime", "tensorrt"} <= set(tune["backend"]["examples"])


def test_descriptions_come_from_attribute_docstrings_read_by_the_generator() -> None:
    """Models are made without parsing their source (pydantic's use_attribute_docstrings did, for
    every model class of every command); the generator reads a field's docstring, the
    nearest declaring class's, and leaves an explicit Field(description=...) alone."""
    from pydantic import BaseModel, Field

    from dossier.schema import field_docs, schema_of

    class Base(BaseModel):
        a: int = 0
        """Doc of a."""
        b: int = 0
        """Doc of b in the base."""

    class Child(Base):
        b: int = 1
        """Doc of b in the child."""
        c: int = Field(0, description="explicit")
        """Not used: the explicit description wins."""
        d: int = 0

    assert field_docs(Child) == {"a": "Doc of a.", "b": "Doc of b in the child."}
    props = schema_of(Child)["properties"]
    assert [props[k].get("description") for k in "abcd"] == [
        "Doc of a.", "Doc of b in the child.", "explicit", None]
    for model, _ in SCHEMAS.values():
        assert not model.model_config.get("use_attribute_docstrings"), model
