"""The torch-inductor backend's knobs.

``inductor:<key>`` sets ``torch._inductor.config.<key>`` (a curated list: :data:`INDUCTOR_KEYS`),
with defaults read from the installed torch; values are strings (``true``/``false`` for
booleans, ``default`` for None). ``device``, ``dtype`` (the model and its floating inputs are
cast inside the compiled module; floating outputs are cast back to the signature's dtype, so an
engine takes and returns what the model does) and ``float32_matmul_precision`` (applied while
building and around every run, since aten matmuls read it at run time) complete the route.
A route's ``inductor:<key>`` that is not in the database is passed to inductor as well, so a key
the installed torch lacks fails the build (``BuildError``) instead of being ignored.
"""

from __future__ import annotations

import os

from dossier.backends.interface import (
    BuildError,
)

KNOB_PREFIX = "inductor:"
DTYPES = ("float32", "bfloat16", "float16")
PRECISIONS = ("highest", "high", "medium")

_NUMERICS = True
INDUCTOR_KEYS: tuple[tuple[str, str, bool], ...] = (
    ("max_autotune", "benchmark GEMM/conv kernel choices while building (builds get much longer: "
     "238 s for ResNet-50 on an H200 against 14 s)", False),
    ("max_autotune_gemm_backends", "kernel families max_autotune chooses GEMMs from (only with "
     "-inductor:max_autotune=true)", False),
    ("epilogue_fusion", "fuse pointwise epilogues into GEMM templates", False),
    ("freezing", "treat weights as constants: constant folding, conv/BN folding, weight "
     "pre-packing and layout changes", False),
    ("layout_optimization", "pick channels-last layouts for convolutions", False),
    ("pattern_matcher", "pattern-based graph rewrites (e.g. attention into SDPA)", False),
    ("coordinate_descent_tuning", "tune Triton kernel block sizes by coordinate descent (longer "
     "builds)", False),
    ("triton.cudagraphs", "CUDA graphs in torch.compile's Python runtime; an AOTInductor package "
     "never captures CUDA graphs, so here it only changes graph partitioning", False),
    ("aggressive_fusion", "fuse nodes even without shared memory accesses", False),
    ("comprehensive_padding", "pad strides for aligned memory accesses", False),
    ("cpp.simdlen", "CPU vector width in bits (default: the widest this CPU has; 1 turns "
     "vectorisation off)", False),
    ("cpp.threads", "CPU threads of the generated kernels (-1: torch.get_num_threads())", False),
    ("cpp.enable_unsafe_math_opt_flag", "compile CPU kernels with -funsafe-math-optimizations",
     _NUMERICS),
    ("cpp.enable_floating_point_contract_flag", "-ffp-contract for CPU kernels (fused "
     "multiply-add contraction)", _NUMERICS),
    ("aot_inductor.precompile_headers", "precompiled headers for the C++ compile. dossier sets "
     "false unless the route says otherwise: with true, every new flag set leaves about 150 MB "
     "in the default torchinductor temp folder, whatever TORCHINDUCTOR_CACHE_DIR says", False),
)
"""(config key, help, changes numerics) of the inductor knobs offered, in display order."""
OWN_DEFAULTS = {"aot_inductor.precompile_headers": False}
"""Keys whose default is dossier's, not torch's (the backend always sets them)."""


# ------------------------------------------------------------------------------ value mapping
def value_text(value: object) -> str:
    """A config value as a knob value string: ``true``/``false``, ``default`` for None."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "default"
    return str(value)


def parse_value(text: str, default: object) -> object:
    """A knob value string as the config value, typed after the key's default (``default`` ->
    None); for a key unknown here (``default`` is ...), guessed from the text."""
    if isinstance(default, bool) or (default is ... and text in ("true", "false")):
        if text not in ("true", "false"):
            raise BuildError(f"value {text!r} is not true or false")
        return text == "true"
    if text == "default":
        return None
    if isinstance(default, int) or default is None or default is ...:
        try:
            return int(text)
        except ValueError:
            if isinstance(default, int) or default is None:
                raise BuildError(f"value {text!r} is not an integer") from None
    return text


def device_values(cuda: bool) -> tuple[str, ...]:
    return ("cuda", "cpu") if cuda else ("cpu",)


def key_values(key: str, default: object, cuda: bool) -> tuple[str, ...]:
    d = value_text(default)
    if isinstance(default, bool):
        values: tuple[str, ...] = ("false", "true")
    elif key == "max_autotune_gemm_backends":
        values = ("ATEN", "ATEN,TRITON", "TRITON") if cuda else ("ATEN", "ATEN,CPP", "CPP")
    elif key == "cpp.simdlen":
        values = ("default", "1", "256", "512")
    elif key == "cpp.threads":
        n = os.cpu_count() or 1
        values = ("-1", *(str(t) for t in (1, 2, 4, 8, 16, 32, 64) if t < n), str(n))
    elif key == "cpp.enable_floating_point_contract_flag":
        values = ("off", "on", "fast")
    else:
        values = ()
    return (d, *(v for v in dict.fromkeys(values) if v != d))


