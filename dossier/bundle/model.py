"""Model identity: the model file and the external weight files it references."""

from __future__ import annotations

from pathlib import Path

from dossier.bundle.manifest import ExternalFile, ModelIdentity, check_relative_path
from dossier.errors import ModelError
from dossier.hashing import digest_file
from dossier.onnx_graph import external_tensors


def external_locations(model: Path) -> list[str]:
    """Locations (relative to the model's folder) of the external data an ONNX model uses.

    Walks every tensor of the graph and its subgraphs (initializers and tensor attributes) whose
    ``data_location`` is EXTERNAL. Other model formats have none. Raises ModelError for an
    unreadable ONNX file or a location that leaves the model's folder.
    """
    if model.suffix.lower() != ".onnx":
        return []
    import onnx  # lazily: only ONNX models need it

    try:
        proto = onnx.load(str(model), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, OSError, ValueError...
        raise ModelError(f"cannot read ONNX model {model}: {exc}") from exc
    found: set[str] = set()
    for tensor, location in external_tensors(proto):
        try:
            found.add(check_relative_path(location.replace("\\", "/")))
        except ValueError:  # noqa: PERF203 - the first one ends the loop
            raise ModelError(f"{model}: tensor {tensor.name!r} keeps its data at "
                             f"{location!r}, outside the model's folder") from None
    return sorted(found)


def model_identity(model: Path) -> ModelIdentity:
    """Name, size and xxh3-128 of ``model`` and of each external data file it references."""
    model = Path(model)
    if not model.is_file():
        raise ModelError(f"model file {model} does not exist")
    digest, size = digest_file(model)
    external = []
    for location in external_locations(model):
        path = model.parent / location
        if not path.is_file():
            raise ModelError(f"{model}: external data file {location} is missing ({path})")
        d, s = digest_file(path)
        external.append(ExternalFile(path=location, size=s, digest=d))
    return ModelIdentity(file_name=model.name, size=size, digest=digest, external_data=external)
