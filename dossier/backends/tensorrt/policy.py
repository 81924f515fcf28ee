"""The verify rules of TensorRT plans, and what any host needs to run one.

Engine facts: ``version_compatible`` / ``hardware_compatible`` (the plan's compatibility flags).
"""

from __future__ import annotations

from dossier.fingerprint import Fingerprint
from dossier.host.policy import (
    INVALID,
    PLATFORM_RULES,
    SUB,
    VALID,
    Finding,
    Rule,
    Verdict,
    gpu_tuning_rules,
)
from dossier.host.policy import rule as _r


def _trt_version(pattern: str) -> Rule:
    return _r(pattern, SUB, "The plan was built version-compatible, so a newer TensorRT runtime "
              "loads it, but it may run slower than a plan built by this version.",
              when="version_compatible", otherwise=INVALID, otherwise_reason="A TensorRT plan "
              "loads only in the TensorRT version that built it unless built version-compatible.")


_OWN: list[Rule] = [
    _r("gpu.count", INVALID, "The plan was built for a GPU and this host has none.",
       when="gpu_lost"),
    _r("gpu.count", VALID, "The plan runs on one GPU, so the number of GPUs does not matter "
       "while there is one."),
    _trt_version("packages.tensorrt*"),
    _trt_version("engine.tensorrt_version"),
    _r("gpu[*].compute_capability", SUB, "The plan was built hardware-compatible, so it runs on "
       "this architecture, but with fewer tactics it may be slower than a native build.",
       when="hardware_compatible", otherwise=INVALID, otherwise_reason="TensorRT plans do not "
       "move between GPU architectures, and this GPU has another compute capability."),
    _r("cuda_runtime", SUB, "TensorRT's kernels run on another CUDA runtime, whose performance "
       "may differ."),
    _r("cudnn", SUB, "Where the plan uses cuDNN tactics, another cuDNN version may run them "
       "at another speed."),
]
RULES: list[Rule] = [*_OWN, *gpu_tuning_rules("TensorRT's timed tactics"), *PLATFORM_RULES]


def requirement_findings(host: Fingerprint) -> list[Finding]:
    """What a TensorRT plan needs on any host, whatever its tuning host was (so also when the
    tuning host is unknown): an NVIDIA GPU and the TensorRT runtime. Each missing requirement is
    an INVALID finding."""
    out = []
    if not host.gpus:
        out.append(Finding(field="requires.gpu", bundle_value="an NVIDIA GPU", host_value="none",
                           verdict=Verdict.INVALID, reason="A TensorRT plan runs only on an "
                           "NVIDIA GPU, and this host has none."))
    if not any(name.startswith("tensorrt") for name in host.packages):
        out.append(Finding(field="requires.tensorrt", bundle_value="TensorRT",
                           host_value="not installed", verdict=Verdict.INVALID,
                           reason="A TensorRT plan is loaded by the TensorRT runtime, which is "
                           "not installed on this host."))
    return out
