"""A deserialized TensorRT engine on the GPU (needs tensorrt and cuda-python at run time):
device buffers through cuda-python, timing with CUDA events on the engine's stream."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dossier.backends.interface import EngineRuntimeError, Runner


def cudart() -> Any:
    """cuda-python's runtime module (imported here, not at module import)."""
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        from cuda import cudart  # older cuda-python
    return cudart


def _check(cudart: Any, result: Any) -> Any:
    """Unpack a cuda-python ``(err, *values)`` result; EngineRuntimeError on a CUDA error."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        name = getattr(err, "name", str(err))
        raise EngineRuntimeError(f"CUDA error {name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


@dataclass
class _Bound:
    """Device buffers for one set of inputs (what :meth:`TensorRTRunner.prepare` returns)."""

    inputs: dict[str, tuple[int, tuple[int, ...]]]
    outputs: dict[str, tuple[int, tuple[int, ...], np.dtype]]


class TensorRTRunner(Runner):
    """A deserialized engine with one execution context, one CUDA stream and two events."""

    native_errors = (RuntimeError,)  # what pybind raises for a TensorRT failure

    def __init__(self, trt: Any, cudart: Any, runtime: Any, engine: Any, context: Any) -> None:
        self._trt, self._cudart = trt, cudart
        self._runtime, self._engine, self._context = runtime, engine, context
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self._inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in names if n not in self._inputs]
        self._dtypes = {n: np.dtype(trt.nptype(engine.get_tensor_dtype(n))) for n in names}
        self._stream = _check(cudart, cudart.cudaStreamCreate())
        self._start = _check(cudart, cudart.cudaEventCreate())
        self._end = _check(cudart, cudart.cudaEventCreate())
        self._prepared: list[_Bound] = []

    def io_names(self) -> tuple[list[str], list[str]]:
        return list(self._inputs), list(self._outputs)

    def _malloc(self, nbytes: int) -> int:
        return int(_check(self._cudart, self._cudart.cudaMalloc(max(nbytes, 1))))

    def _free(self, bound: _Bound) -> None:
        for ptr, *_ in (*bound.inputs.values(), *bound.outputs.values()):
            self._cudart.cudaFree(ptr)

    def _bind(self, inputs: Mapping[str, np.ndarray]) -> _Bound:
        cudart = self._cudart
        if set(inputs) != set(self._inputs):
            raise EngineRuntimeError(f"inputs {sorted(inputs)} do not match the engine's "
                                     f"{sorted(self._inputs)}")
        bound = _Bound({}, {})
        try:
            for name in self._inputs:
                arr = np.ascontiguousarray(inputs[name])
                if arr.dtype != self._dtypes[name]:
                    raise EngineRuntimeError(f"input {name!r} is {arr.dtype}, the engine takes "
                                             f"{self._dtypes[name]}")
                if not self._context.set_input_shape(name, tuple(arr.shape)):
                    raise EngineRuntimeError(f"input {name!r} shape {tuple(arr.shape)} is outside "
                                             "the engine's optimization profile")
                ptr = self._malloc(arr.nbytes)
                bound.inputs[name] = (ptr, tuple(arr.shape))
                _check(cudart, cudart.cudaMemcpy(ptr, arr.ctypes.data, arr.nbytes,
                                                 cudart.cudaMemcpyKind.cudaMemcpyHostToDevice))
            for name in self._outputs:
                shape = tuple(self._context.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise EngineRuntimeError(f"output {name!r} has a data-dependent shape "
                                             f"{shape}; this runner does not support those")
                dtype = self._dtypes[name]
                nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                bound.outputs[name] = (self._malloc(nbytes), shape, dtype)
        except BaseException:
            self._free(bound)
            raise
        return bound

    def _use(self, bound: _Bound) -> None:
        """Point the context at ``bound``'s buffers (host-side calls only)."""
        for name, (ptr, shape) in bound.inputs.items():
            self._context.set_input_shape(name, shape)
            self._context.set_tensor_address(name, ptr)
        for name, (ptr, _, _) in bound.outputs.items():
            self._context.set_tensor_address(name, ptr)

    def _execute(self) -> None:
        if not self._context.execute_async_v3(int(self._stream)):
            raise EngineRuntimeError("IExecutionContext.execute_async_v3 failed")

    def run_impl(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        cudart = self._cudart
        bound = self._bind(inputs)
        try:
            self._use(bound)
            self._execute()
            _check(cudart, cudart.cudaStreamSynchronize(self._stream))
            out: dict[str, np.ndarray] = {}
            for name, (ptr, shape, dtype) in bound.outputs.items():
                host = np.empty(shape, dtype=dtype)
                _check(cudart, cudart.cudaMemcpy(host.ctypes.data, ptr, host.nbytes,
                                                 cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost))
                out[name] = host
            return out
        finally:
            self._free(bound)

    def prepare_impl(self, inputs: Mapping[str, np.ndarray]) -> object:
        """Copy the inputs to the device once; output buffers are allocated alongside."""
        bound = self._bind(inputs)
        self._prepared.append(bound)
        return bound

    def timed_impl(self, prepared: object) -> float:
        """One inference on prepared device buffers, timed with CUDA events on the stream (ms).

        The context is pointed at the buffers before the start event, so host-side binding is
        not timed; the enqueue itself is (as in trtexec's GPU compute time)."""
        cudart = self._cudart
        if not isinstance(prepared, _Bound):
            raise TypeError("timed() takes what prepare() returned")
        self._use(prepared)
        _check(cudart, cudart.cudaEventRecord(self._start, self._stream))
        self._execute()
        _check(cudart, cudart.cudaEventRecord(self._end, self._stream))
        _check(cudart, cudart.cudaEventSynchronize(self._end))
        return float(_check(cudart, cudart.cudaEventElapsedTime(self._start, self._end)))

    def close_impl(self) -> None:
        cudart = self._cudart
        for bound in self._prepared:
            self._free(bound)
        self._prepared.clear()
        if self._stream is not None:
            cudart.cudaEventDestroy(self._start)
            cudart.cudaEventDestroy(self._end)
            cudart.cudaStreamDestroy(self._stream)
            self._stream = None
        self._context = self._engine = self._runtime = None


