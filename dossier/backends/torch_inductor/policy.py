"""The verify rules of AOTInductor packages (CPU or CUDA).

Engine fact: ``cpu_package`` (the .pt2 package was compiled for the CPU).
"""

from __future__ import annotations

from dossier.host.policy import INVALID, PLATFORM_RULES, SUB, VALID, Rule, gpu_tuning_rules
from dossier.host.policy import rule as _r

_NO_GPU = "A CPU package does not use the GPU, so GPU differences do not matter."
_OWN: list[Rule] = [
    _r("gpu*", VALID, _NO_GPU, when="cpu_package"),
    _r("gpu.count", INVALID, "The package was compiled for a GPU and this host has none.",
       when="gpu_lost"),
    _r("gpu.count", VALID, "The engine runs on one GPU, so the number of GPUs does not matter "
       "while there is one."),
    _r("packages.torch", INVALID, "An AOTInductor package must be loaded by the PyTorch version "
       "that compiled it."),
    _r("cuda_runtime", VALID, _NO_GPU, when="cpu_package", otherwise=INVALID,
       otherwise_reason="The package's GPU kernels were compiled against another CUDA runtime."),
    _r("cudnn", VALID, _NO_GPU, when="cpu_package", otherwise=SUB, otherwise_reason="Operators "
       "that fall back to ATen may call cuDNN, whose version changes their speed."),
    _r("gpu[*].compute_capability", INVALID, "The package's GPU kernels were compiled for "
       "another GPU architecture (compute capability) and do not run on this one."),
    _r("cpu.isa_flags", INVALID, "A CPU package is compiled with -march=native for the tuning "
       "host's instruction set, and this CPU lacks or differs in some of it.",
       when="cpu_package", otherwise=VALID, otherwise_reason="A GPU package does not depend on "
       "the CPU's instruction-set extensions."),
    _r("cpu.model", SUB, "The CPU kernels were generated and tuned on another CPU model.",
       when="cpu_package", otherwise=VALID, otherwise_reason="A GPU package's speed hardly "
       "depends on the CPU model."),
    _r("cpu.*cores", SUB, "The CPU kernels' threading was tuned for another number of cores.",
       when="cpu_package"),
    _r("compiler", SUB, "AOTInductor uses the host C++ compiler when it recompiles, and another "
       "compiler may generate different code."),
    _r("compiler_path", VALID, "Where the compiler lives does not change the package."),
    _r("compiler_libstdcxx", VALID, "The shipped package's own libstdc++ linkage is in its build "
       "facts; this host's compiler only matters when it recompiles."),
    _r("os.glibc", SUB, "The compiled library was linked on another glibc; check that it loads, "
       "since an older glibc can lack symbols it needs."),
]


RULES: list[Rule] = [
    *_OWN, *gpu_tuning_rules("kernels"), *PLATFORM_RULES,
    _r("python.*", SUB, "The package was built and tuned under another Python version, whose "
       "runtime overheads differ."),
]
