"""A loaded engine (:class:`Runner`) and the two errors a backend's work ends in
(:class:`BuildError`, :class:`EngineRuntimeError`): the public methods check their inputs and map
the native errors of ``native_errors`` to these, once, so a subclass raises whatever its
compiler raises; dossier's own errors and MemoryError (a crashed trial) pass unchanged."""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

import numpy as np

from dossier.errors import (
    DossierError,
)


class BuildError(Exception):
    """The compiler failed to build a route (a ``build_failed`` trial outcome, not a tool error)."""


class EngineRuntimeError(Exception):
    """A built engine failed to load or run (a ``runtime_error`` trial outcome)."""


NativeErrors = tuple[type[Exception], ...]
_A = TypeVar("_A")
_R = TypeVar("_R")


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def passes_unchanged(exc: BaseException) -> bool:
    """dossier's own errors and MemoryError cross the public methods unchanged."""
    return isinstance(exc, (DossierError, BuildError, EngineRuntimeError, MemoryError))


def _check_feed(inputs: object) -> Mapping[str, np.ndarray]:
    if type(inputs) is dict:  # the common case, without the ABC check (a served call's cost)
        for k, v in inputs.items():
            if type(k) is not str or not isinstance(v, np.ndarray):
                break
        else:
            return inputs
    if not isinstance(inputs, Mapping) or not all(
            isinstance(k, str) and isinstance(v, np.ndarray) for k, v in inputs.items()):
        raise TypeError("a runner takes a mapping of input name -> numpy array")
    return inputs


class Runner(abc.ABC):
    """A loaded engine. :meth:`run`, :meth:`prepare`, :meth:`timed` and :meth:`close` check
    their inputs and map the native errors of :attr:`native_errors` to EngineRuntimeError
    around the ``*_impl`` methods a subclass provides."""

    native_errors: ClassVar[NativeErrors] = (Exception,)
    """Exception types the engine's library raises for a failure it reports."""
    _closed: bool = False

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once on host arrays; return host arrays."""
        return self._checked(self.run_impl, _check_feed(inputs))

    def prepare(self, inputs: Mapping[str, np.ndarray]) -> object:
        """Turn host inputs into whatever :meth:`timed` consumes (e.g. device buffers)."""
        return self._checked(self.prepare_impl, _check_feed(inputs))

    def timed(self, prepared: object) -> float:
        """Run once on what :meth:`prepare` returned; the latency in milliseconds."""
        return self._checked(self.timed_impl, prepared)

    takes_tensors: ClassVar[bool] = False
    """Whether :meth:`run_tensors` is provided: the engine takes and returns its framework's
    tensors on its own device, without a copy through the host."""

    def run_tensors(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Run once on framework tensors; return tensors on the engine's device, stream-ordered
        (no synchronization). Only where :attr:`takes_tensors`."""
        if not self.takes_tensors:
            raise EngineRuntimeError(f"{type(self).__name__} takes host arrays only")
        return self._checked(self.run_tensors_impl, inputs)

    def run_tensors_impl(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """What :meth:`run_tensors` does; provided where :attr:`takes_tensors`."""
        raise NotImplementedError(f"{type(self).__name__} sets takes_tensors but has no "
                                  "run_tensors_impl")

    def fast_run(self) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None:
        """What :meth:`run` does, for a caller that has checked the feed itself (a dict of
        every input name to a native-order numpy array) and holds the engine open: the native
        call and little else, its errors unmapped. None (the default) where the runner has
        none; :class:`dossier.serve.Engine` then calls :meth:`run`. On a CPU call of tens of
        microseconds every microsecond of Python around it shows."""
        return None

    def close(self) -> None:
        """Release the engine (once; later calls do nothing)."""
        if not self._closed:
            self._closed = True
            self.close_impl()

    @abc.abstractmethod
    def run_impl(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run once; return host arrays."""

    def prepare_impl(self, inputs: Mapping[str, np.ndarray]) -> object:
        """The default: the host inputs themselves."""
        return inputs

    def timed_impl(self, prepared: object) -> float:
        """The default times :meth:`run_impl` with ``perf_counter_ns``; device backends time
        with events."""
        t0 = time.perf_counter_ns()
        self.run_impl(prepared)  # type: ignore[arg-type]
        return (time.perf_counter_ns() - t0) / 1e6

    def close_impl(self) -> None:
        """Release what the engine holds; nothing by default."""

    def io_names(self) -> tuple[list[str], list[str]] | None:
        """The engine's input and output names, in its order, when the runner knows them."""
        return None

    def input_dtypes(self) -> dict[str, str] | None:
        """The numpy dtype name each input takes (``float32``), when the runner knows them:
        what a refused call is judged against."""
        return None

    def native_message(self, exc: Exception) -> str:
        """One line for a native error; the default: the first line of its message."""
        return first_line(exc)

    def _checked(self, impl: Callable[[_A], _R], arg: _A) -> _R:
        """``impl(arg)`` on an engine not yet released, native errors mapped."""
        if self._closed:
            raise EngineRuntimeError("the engine was released (close() was called)")
        try:
            return impl(arg)
        except Exception as exc:
            if passes_unchanged(exc) or not isinstance(exc, self.native_errors):
                raise
            raise EngineRuntimeError(self.native_message(exc)) from exc

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
