"""The verify rules of ONNX Runtime engines (an optimized model in ORT format, CPU provider).

Engine facts: ``layout_optimized`` (the model was optimized at the layout/all level; never an
OpenVINO route, whose engine is the ONNX model, compiled where it is loaded),
``openvino`` (the route runs on OpenVINO's CPU device, ``-execution_provider=openvino``).
"""

from __future__ import annotations

from dossier.host.policy import INVALID, SUB, VALID, Rule
from dossier.host.policy import rule as _r

_VERSION = ("The optimized model was written by another ONNX Runtime version, and its format "
                "and kernels are tied to the version that produced it.")
RULES: list[Rule] = [
    _r("packages.onnxruntime", INVALID, _VERSION),
    _r("packages.onnxruntime-gpu", INVALID, _VERSION),
    _r("packages.onnxruntime-openvino", INVALID, _VERSION),
    _r("packages.onnxruntime-ep-openvino", INVALID, "The route runs on OpenVINO's CPU device "
       "through this plug-in, which compiles the model when the session is made: another "
       "version compiles it otherwise, and without it the route cannot run.", when="openvino",
       otherwise=VALID, otherwise_reason="The route runs on ONNX Runtime's CPU provider; the "
       "OpenVINO plug-in is not used."),
    _r("cpu.isa_flags", INVALID, "The model was optimized at the layout level, which bakes "
       "ISA-specific NCHWc kernels into it (ONNX Runtime warns it may contain hardware specific "
       "optimizations), and this CPU has another instruction set.", when="layout_optimized",
       otherwise=SUB, otherwise_reason="This CPU has another instruction set, so ONNX Runtime "
       "picks other kernels and the tuned settings may no longer be the fastest."),
    _r("cpu.model", SUB, "A different CPU model has other caches and clocks, so the tuned "
       "settings may no longer be the fastest."),
    _r("cpu.vendor", SUB, "A CPU from another vendor runs other kernels at other speeds, so the "
       "tuned settings may no longer be the fastest."),
    _r("cpu.cores", SUB, "The thread-count settings were tuned for another number of CPUs."),
    _r("cpu.physical_cores", SUB, "The thread-count settings were tuned for another number of "
       "physical cores."),
    _r("os.machine", INVALID, "The optimized model and its settings were produced for another "
       "CPU architecture."),
    _r("packages.numpy", VALID, "NumPy only prepares inputs and outputs; the engine does not "
       "depend on its version."),
    _r("gpu*", VALID, "The CPU execution provider does not use the GPU."),
]
