"""A loaded AOTInductor package, optionally replayed as CUDA graphs."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dossier.backends.interface import (
    EngineRuntimeError,
    Runner,
)
from dossier.backends.torch_inductor.build import short_error


class _PackageModel:
    """A loaded package called with positional tensors (what ``AOTICompiledModel`` does,
    without importing ``torch._inductor``: 1-3 s of every fresh process)."""

    def __init__(self, loader: Any) -> None:
        from torch.utils import _pytree

        self._loader = loader
        self._out_spec = _pytree.treespec_loads(loader.get_call_spec()[1])
        self._unflatten = _pytree.tree_unflatten

    def __call__(self, *args: Any) -> Any:
        return self._unflatten(self._loader.run(list(args)), self._out_spec)


def load_package(engine: Path, *, single_threaded: bool) -> Any:
    """``aoti_load_package`` without its host probe.

    ``aoti_load_package`` compares the package's device facts with this host's, which calls
    ``pick_vec_isa()``: it compiles and runs a test program per CPU instruction set (35 s on an
    H200 host, 3 s on a 2-core CPU host, in every fresh process), and imports
    ``torch._inductor`` (1-4 s), only to log a warning on a mismatch. dossier compares hosts
    itself, before a load (the fingerprint: a CPU package on a host without the instruction
    sets it was compiled for is INVALID), so every package is loaded by the package loader
    directly; torch versions without that loader go through ``aoti_load_package``.
    """
    import torch

    loader = getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None)
    if loader is not None and hasattr(loader, "run"):
        try:
            return _PackageModel(loader(str(engine), "model", single_threaded, 1, -1))
        except TypeError:  # another signature in this torch: the public entry point
            pass
    return torch._inductor.aoti_load_package(str(engine), run_single_threaded=single_threaded)


# ------------------------------------------------------------------------------ runner
@dataclass(frozen=True)
class _Graph:
    """One CUDA graph captured over a call on static input buffers (knob cuda_graph=on)."""

    graph: Any
    inputs: tuple[Any, ...]
    """The static input buffers the graph reads: new inputs are copied into them."""
    outputs: tuple[Any, ...]
    """The static outputs the graph writes (overwritten by every replay)."""


@dataclass(frozen=True)
class _Prepared:
    args: tuple[Any, ...]
    """The inputs on the engine's device, in argument order."""
    graph: _Graph | None = None
    """The graph of these inputs' shapes (one per shape, shared by inputs of equal shapes)."""


def _flat(out: Any) -> list[Any]:
    if isinstance(out, Mapping):
        return list(out.values())
    return list(out) if isinstance(out, (tuple, list)) else [out]


class TorchInductorRunner(Runner):
    """A loaded AOTInductor package.

    With ``cuda_graph`` the package (loaded with ``run_single_threaded=True``, whose model
    container does not synchronize on events) is warmed up on a side stream and captured into a
    CUDA graph over static input buffers, one graph per distinct set of input shapes. A call
    copies its inputs into the buffers, replays the graph and copies the outputs out (the
    static outputs are overwritten by the next replay): :meth:`run` and :meth:`timed` both do
    all three, so accuracy is checked on replayed outputs and the timing includes the copies.

    On CUDA every runner has a stream of its own: :meth:`run`, :meth:`timed` and the copies of
    :meth:`prepare` are issued on it and wait for it alone (never ``torch.cuda.synchronize``,
    which waits for every stream of the device), so several runners of one package called from
    as many threads (engine instances, ``-serving_sessions``) run side by side. A graph is
    captured on that stream in thread-local capture mode, so instances in other threads keep
    running. :meth:`run_tensors` stays on the caller's current stream.
    """

    def __init__(self, compiled: Any, device: str, inputs: Sequence[str],
                 outputs: Sequence[str], precision: str, cuda_graph: bool = False) -> None:
        import torch

        self._torch = torch
        self._graphs = cuda_graph and device.startswith("cuda")
        self._captured: dict[tuple[Any, ...], _Graph] = {}
        self._compiled = compiled
        self._device = device
        self._inputs = list(inputs)
        self._outputs = list(outputs)
        self._precision = precision
        self._cuda = device.startswith("cuda")
        self._stream: Any = None
        if self._cuda:
            self._stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
            self._start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self._end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

    @property
    def device(self) -> str:
        """Where the engine runs (``cpu`` or ``cuda``)."""
        return self._device

    def io_names(self) -> tuple[list[str], list[str]]:
        return list(self._inputs), list(self._outputs)

    @property
    def graphs(self) -> int:
        """CUDA graphs captured so far (one per distinct set of input shapes)."""
        return len(self._captured)

    def _own_stream(self) -> contextlib.AbstractContextManager[Any]:
        """This runner's CUDA stream as the current stream (nothing on CPU)."""
        if self._stream is None:
            return contextlib.nullcontext()
        return self._torch.cuda.stream(self._stream)

    def _apply_precision(self) -> None:
        # aten matmuls read the flag when they run, and several engines share one process
        if self._torch.get_float32_matmul_precision() != self._precision:
            self._torch.set_float32_matmul_precision(self._precision)

    def prepare_impl(self, inputs: Mapping[str, np.ndarray]) -> _Prepared:
        """Inputs as tensors on the engine's device, in the engine's argument order (once); with
        CUDA graphs, the graph of their shapes (captured on first sight of the shapes)."""
        if isinstance(inputs, _Prepared):
            return inputs
        self._check_names(inputs)
        torch = self._torch
        with self._own_stream():
            args = tuple(torch.from_numpy(np.ascontiguousarray(inputs[n])).to(self._device)
                         for n in self._inputs)
            if self._stream is not None:
                self._stream.synchronize()
            return self._ready(args)

    def _check_names(self, inputs: Mapping[str, Any]) -> None:
        missing = [n for n in self._inputs if n not in inputs]
        if missing:
            raise EngineRuntimeError(f"inputs {missing} are missing (the engine takes "
                                     f"{self._inputs})")

    def _ready(self, args: tuple[Any, ...]) -> _Prepared:
        """``args`` with the graph of their shapes (captured on first sight of the shapes)."""
        if not self._graphs:
            return _Prepared(args)
        key = tuple((tuple(a.shape), a.dtype) for a in args)
        if key not in self._captured:
            self._captured[key] = self._capture(args)
        return _Prepared(args, self._captured[key])

    def _capture(self, args: tuple[Any, ...]) -> _Graph:
        """Warm up on a side stream (as torch.cuda.graph requires), then capture one call on
        static copies of ``args`` on this runner's stream, in thread-local mode: instances in
        other threads keep running. Replays may run on any stream."""
        torch = self._torch
        self._apply_precision()
        mine = self._stream
        try:
            mine.wait_stream(torch.cuda.current_stream())  # args may come from the caller's
            with torch.cuda.stream(mine):
                static = tuple(a.clone() for a in args)
                side = torch.cuda.Stream()
                side.wait_stream(mine)
                with torch.cuda.stream(side):
                    for _ in range(3):
                        self._call(static)
                mine.wait_stream(side)
                mine.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=mine, capture_error_mode="thread_local"):
                    out = self._call(static)
            mine.synchronize()
        except EngineRuntimeError as exc:
            raise EngineRuntimeError(f"CUDA graph capture failed: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - capture refused by the runtime
            raise EngineRuntimeError(f"CUDA graph capture failed: {short_error(exc)}") from exc
        return _Graph(graph, static, tuple(_flat(out)))

    def _call(self, args: tuple[Any, ...]) -> Any:
        try:
            return self._compiled(*args)
        except Exception as exc:  # noqa: BLE001 - the AOTI runtime raises RuntimeError and more
            raise EngineRuntimeError(short_error(exc)) from exc

    def _execute(self, ready: _Prepared) -> Any:
        """One call: direct, or copy in, replay, copy out."""
        g = ready.graph
        if g is None:
            return self._call(ready.args)
        for static, new in zip(g.inputs, ready.args):
            static.copy_(new, non_blocking=True)
        g.graph.replay()
        return tuple(o.clone() for o in g.outputs)

    takes_tensors = True

    def run_tensors_impl(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Torch tensors in, torch tensors out on the engine's device: no copy through the host
        and no synchronization (the outputs are ordered on the current stream, as torch's own
        calls are). Inputs on another device are moved; with CUDA graphs they are copied into
        the static buffers and the outputs are copies of the static outputs, as in :meth:`run`."""
        torch = self._torch
        self._check_names(inputs)
        if not all(isinstance(inputs[n], torch.Tensor) for n in self._inputs):
            raise EngineRuntimeError("run_tensors takes torch tensors")
        args = tuple(inputs[n].to(self._device).contiguous() for n in self._inputs)
        self._apply_precision()
        return dict(zip(self._outputs, self._named(self._execute(self._ready(args)))))

    def _named(self, out: Any) -> list[Any]:
        """The outputs of one call in the metadata's order."""
        if isinstance(out, Mapping):
            try:
                flat = [out[n] for n in self._outputs]
            except KeyError as exc:
                raise EngineRuntimeError(f"the engine returned no output {exc}") from None
        else:
            flat = _flat(out)
        if len(flat) != len(self._outputs):
            raise EngineRuntimeError(f"the engine returned {len(flat)} outputs, its metadata "
                                     f"names {len(self._outputs)}")
        return flat

    def run_impl(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        prepared = self.prepare_impl(inputs)
        self._apply_precision()
        result = {}
        with self._own_stream():  # .cpu() waits for this stream: the outputs are complete
            flat = self._named(self._execute(prepared))
            for name, t in zip(self._outputs, flat):
                t = t.detach()
                if t.dtype in (self._torch.bfloat16,):
                    t = t.float()
                result[name] = t.cpu().numpy()
        return result

    def timed_impl(self, prepared: object) -> float:
        """Latency of one run in ms: CUDA events (then a sync) on a GPU, perf_counter_ns on CPU.
        With CUDA graphs the copies into the static inputs and out of the static outputs are
        inside the timed region."""
        ready = self.prepare_impl(prepared)  # type: ignore[arg-type]
        self._apply_precision()
        if self._cuda:
            with self._own_stream():
                self._start.record()
                self._execute(ready)
                self._end.record()
            self._end.synchronize()
            return float(self._start.elapsed_time(self._end))
        t0 = time.perf_counter_ns()
        self._execute(ready)
        return (time.perf_counter_ns() - t0) / 1e6

    def close_impl(self) -> None:
        self._captured.clear()
        self._compiled = None


