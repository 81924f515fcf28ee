"""The PyTorch AOTInductor backend: :mod:`.backend` (build, load, production load), :mod:`.knobs`,
:mod:`.model` (signatures, ``module:factory`` references, exported programs), :mod:`.build`,
:mod:`.runner` (CUDA graphs), :mod:`.package` (metadata, normalized digest), :mod:`.policy`
(verify rules). Importing it does not import torch."""

from dossier.backends.torch_inductor.backend import TorchInductorBackend
from dossier.backends.torch_inductor.build import (
    CACHE_ENV,
    NATIVE_BUILD_ERRORS,
    TEMP_PREFIX,
    BuildPlan,
    build_cache,
    map_build_error,
    matmul_precision,
)
from dossier.backends.torch_inductor.knobs import (
    DTYPES,
    INDUCTOR_KEYS,
    KNOB_PREFIX,
    PRECISIONS,
    parse_value,
    value_text,
)
from dossier.backends.torch_inductor.model import (
    EXPORTED_SUFFIXES,
    SIGNATURE_MEMBER,
    dynamic_shapes,
    example_inputs,
    exported_signature,
    factory_signature,
    is_model_reference,
    load_exported,
    load_factory,
    save_exported,
    signature_from_dict,
    signature_to_dict,
    wrap_module,
)
from dossier.backends.torch_inductor.package import (
    META_PREFIX,
    normalized_digest,
    package_metadata,
)
from dossier.backends.torch_inductor.runner import TorchInductorRunner, load_package

__all__ = ["CACHE_ENV", "DTYPES", "EXPORTED_SUFFIXES", "INDUCTOR_KEYS", "KNOB_PREFIX",
           "META_PREFIX", "NATIVE_BUILD_ERRORS", "PRECISIONS", "SIGNATURE_MEMBER", "TEMP_PREFIX",
           "BuildPlan", "TorchInductorBackend", "TorchInductorRunner", "build_cache",
           "dynamic_shapes", "example_inputs", "exported_signature", "factory_signature",
           "is_model_reference", "load_exported", "load_factory", "load_package",
           "map_build_error", "matmul_precision", "normalized_digest", "package_metadata",
           "parse_value", "save_exported", "signature_from_dict", "signature_to_dict",
           "value_text", "wrap_module"]
