"""The PyTorch AOTInductor backend: :mod:`.backend` (build, load, production load), :mod:`.knobs`,
:mod:`.model` (signatures, ``module:factory`` references, exported programs: import its
helpers from there), :mod:`.build`, :mod:`.runner` (CUDA graphs), :mod:`.package` (metadata, normalized digest), :mod:`.policy`
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
from dossier.backends.torch_inductor.package import (
    META_PREFIX,
    normalized_digest,
    package_metadata,
)
from dossier.backends.torch_inductor.runner import TorchInductorRunner, load_package

__all__ = ["CACHE_ENV", "DTYPES", "INDUCTOR_KEYS", "KNOB_PREFIX", "META_PREFIX",
           "NATIVE_BUILD_ERRORS", "PRECISIONS", "TEMP_PREFIX", "BuildPlan", "TorchInductorBackend",
           "TorchInductorRunner", "build_cache", "load_package", "map_build_error",
           "matmul_precision", "normalized_digest", "package_metadata", "parse_value",
           "value_text"]
