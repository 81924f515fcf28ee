"""Serve what was measured: :func:`load` verifies a bundle, then loads its shipped engine exactly
as dossier timed it, and returns an :class:`Engine`::

    import dossier

    engine = dossier.load("registry.example.com/ml/convnet:1", require_signature=True,
                          trusted_key="keys/dossier.pub")
    outputs = engine({"input": batch})            # named numpy arrays in, named arrays out
    print(engine.route, engine.bundle_id, engine.report.verdict)

Before any engine byte reaches a native loader (deserializing an engine runs native code),
:func:`dossier.verify.verified` checks the signature (under the rules of ``verify
--require-signature``), every file's integrity (one read; an archive or a registry reference is
extracted into a private temporary folder and checked as it is written) and this host's
environment verdict: INVALID refuses with :class:`~dossier.errors.InvalidHostError` (exit 11),
SUBOPTIMAL warns (:class:`SuboptimalWarning`) or refuses when asked
(:class:`~dossier.errors.SuboptimalHostError`, exit 10).

The engine is then loaded by the backend's own loader, the one every trial and the independent
re-timing load it with, as the bundle's manifest records it
(:meth:`dossier.backends.Backend.load_shipped`): ONNX Runtime with the route's session options
(graph optimizations off, the load-time knobs applied); AOTInductor by the package loader (a
CUDA package without inductor's CPU-ISA probe), refused in one line when the package carries
its own libstdc++ and it is not preloaded, with one CUDA graph per input shape for a
``-cuda_graph=on`` route; TensorRT by deserializing the plan (host code allowed for a
version-compatible engine, as its recorded load says) and creating one execution context. One
backend instance serves the whole load: the verification resolves it, and the load uses it.

Time to first inference: the steps that do not depend on each other overlap. This host's
fingerprint (a second, most of it the C++ compiler's probe of an AOTInductor bundle) is collected
in a background thread while the calling thread imports the backend's runtime (``import
torch``: seconds; :meth:`dossier.backends.Backend.import_runtime`, which touches no device and
no engine) and then checks the signature and every file's integrity; the environment step
takes the fingerprint when it is done. No engine byte is read before the checks and the verdict
have passed: the runtime import is given the backend alone, never the bundle. A bundle refused
by its checks has still had its runtime imported.

Threads: an :class:`Engine` may be shared by threads. Calls are serialized by its lock (a
captured CUDA graph replays over static buffers, and a TensorRT execution context runs one
inference at a time), which is also how dossier timed it: one call at a time. A server that
wants calls in parallel loads one Engine per worker thread or process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dossier.errors import (
    DossierError,
    EngineFailedError,
    InputError,
    InvalidHostError,
    SuboptimalHostError,
)
from dossier.host.policy import Verdict
from dossier.verify import VerifyOptions, VerifyReport, verified, with_report

if TYPE_CHECKING:
    import numpy as np

    from dossier.backends.interface import Backend, Runner
    from dossier.bundle import Bundle
    from dossier.fingerprint import Fingerprint

OnSuboptimal = Literal["warn", "refuse", "ignore"]

logger = logging.getLogger(__name__)


class SuboptimalWarning(UserWarning):
    """:func:`load` of an engine whose verdict on this host is SUBOPTIMAL: it is fit to run,
    but its tuning may no longer be the fastest here (re-measure with ``verify --rebench``)."""


class Engine:
    """A verified engine, loaded as it was timed. Call it with named arrays (numpy arrays, or
    anything ``numpy.asarray`` takes) and get named numpy arrays back. An engine that runs on
    torch (AOTInductor) also takes torch tensors, on any device, and then returns torch tensors
    on its own device with no copy through the host and no synchronization (the outputs are
    ordered on the current CUDA stream, as torch's own calls are): what a serving process on
    a GPU wants, and what the tuner timed. Safe to share between threads: calls are serialized
    by :attr:`lock`."""

    def __init__(self, runner: Runner, *, inputs: Sequence[str], outputs: Sequence[str],
                 route: str, bundle_id: str, backend: str, report: VerifyReport,
                 shapes: Sequence[Mapping[str, Sequence[int]]] = ()) -> None:
        self._runner = runner
        import numpy as np

        from dossier.backends.interface import EngineRuntimeError

        self._inputs = tuple(inputs)
        self._names = frozenset(self._inputs)
        self._outputs = tuple(outputs)
        self._ndarray, self._native = np.ndarray, EngineRuntimeError
        self._tensors = runner.takes_tensors
        self._route, self._bundle_id, self._backend = route, bundle_id, backend
        self._report = report
        self._shapes = tuple(shapes)  # the validation pairs' input shapes (what failed calls
        # are judged against: inputs that fit none of them are the caller's mistake)
        self.lock = threading.Lock()
        """Held for every call and for :meth:`close`."""
        self._fast = runner.fast_run()
        """The runner's native call for a feed checked here (None: none, or closed)."""
        try:
            self._dtypes = runner.input_dtypes()  # what a refused call is judged against
        except Exception:  # noqa: BLE001 - a runner that cannot say: judged without
            self._dtypes = None

    @property
    def inputs(self) -> tuple[str, ...]:
        """Input names, in the engine's order."""
        return self._inputs

    @property
    def outputs(self) -> tuple[str, ...]:
        """Output names, in the engine's order."""
        return self._outputs

    @property
    def route(self) -> str:
        """The build route of the shipped engine (its load-time knobs are applied)."""
        return self._route

    @property
    def bundle_id(self) -> str:
        """The dossier id of the bundle it came from."""
        return self._bundle_id

    @property
    def backend(self) -> str:
        """The compiler backend."""
        return self._backend

    @property
    def report(self) -> VerifyReport:
        """The verification it passed."""
        return self._report

    def __call__(self, feed: Mapping[str, Any] | None = None, /,
                 **named: Any) -> dict[str, Any]:
        """Run once: ``engine({"x": x})`` or ``engine(x=x)``. Numpy arrays in, numpy arrays
        out; torch tensors in (every input), torch tensors out where the engine runs on torch.
        Arrays of the other byte order (``>f4`` on a little-endian host) are converted to this
        host's first. InputError (exit 3) for a feed that is no mapping, a missing or an
        unknown input, one that is not an array (or whose ``__array__`` raises), a call the
        runtime refuses on an input of a dtype the engine does not take (``input 'x' is
        float64; the engine takes float32 (cast it)``), or on inputs whose rank or fixed
        dimensions differ from every validation pair's; EngineFailedError (exit 11) when the
        engine fails otherwise. Both carry the runtime's whole message, but for a dtype, which
        is said in dossier's words."""
        fast = self._fast
        if fast is not None and not named and type(feed) is dict:
            # the common call, a dict of native-order arrays, checked as below in fewer steps:
            # the runtime refuses a missing or an unknown input, said then as below
            for v in feed.values():
                if type(v) is not self._ndarray or not v.dtype.isnative:
                    break
            else:
                with self.lock:
                    if self._fast is not None:  # not closed meanwhile
                        try:
                            return fast(feed)
                        except Exception as exc:  # the runtime's, said in dossier's words
                            self._check_names(feed)
                            raise self._failed(exc, feed) from exc
        if feed is not None and not isinstance(feed, Mapping):
            raise InputError(f"the engine takes named inputs, a dict of name to array, not "
                             f"a {type(feed).__name__}",
                             hint=f"call it as engine({{{self._inputs[0]!r}: array}})"
                             if self._inputs else None)
        given = ({**feed, **named} if feed else named) if named else (feed or {})
        self._check_names(given)
        if self._tensors and all(map(_is_tensor, given.values())):
            with self.lock:
                try:
                    return self._runner.run_tensors(given)
                except (InputError, EngineFailedError):
                    raise
                except Exception as exc:  # the runtime's, said in dossier's words
                    raise self._failed(exc, given) from exc
        arrays = given
        for v in given.values():
            if type(v) is not self._ndarray or not v.dtype.isnative:
                arrays = {n: _host_array(n, v) for n, v in given.items()}
                break
        with self.lock:
            try:
                return self._runner.run(arrays)
            except (InputError, EngineFailedError):
                raise
            except Exception as exc:  # the runtime's, said in dossier's words
                raise self._failed(exc, arrays) from exc

    def _check_names(self, given: Mapping[str, Any]) -> None:
        """InputError for a missing or an unknown input."""
        if given.keys() != self._names:
            missing = [n for n in self._inputs if n not in given]
            extra = sorted(n for n in given if n not in self._names)
            raise InputError(f"the engine takes inputs {list(self._inputs)}"
                             + (f"; missing {missing}" if missing else "")
                             + (f"; unknown {extra}" if extra else ""))

    def _failed(self, exc: Exception, given: Mapping[str, Any]) -> DossierError:
        """A failed call: InputError when the inputs fit none of the validation pairs' shapes
        (rank, or a dimension every pair has the same), else EngineFailedError; with the
        runtime's whole message."""
        native = exc.__cause__ if isinstance(exc, self._native) and exc.__cause__ else exc
        message = str(native).strip() or type(native).__name__
        wrong = _wrong_dtype(given, self._dtypes)
        if wrong is not None:
            return InputError(wrong, hint="cast the inputs to the dtype the engine takes, e.g. "
                              "array.astype(numpy.float32)")
        shapes = {n: tuple(getattr(v, "shape", ())) for n, v in given.items()}
        misfit = _misfit(shapes, self._shapes)
        if misfit is not None:
            return InputError(f"the engine of {self._bundle_id} refused the inputs ({misfit}): "
                              f"{message}", hint="pass inputs shaped as the validation set's "
                              "(dossier inspect shows them)")
        return EngineFailedError(f"the engine of {self._bundle_id} failed: {message}")

    def close(self) -> None:
        """Release the engine (later calls raise EngineFailedError)."""
        with self.lock:
            self._fast = None
            self._runner.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Engine({self._backend}, route={self._route!r}, bundle_id={self._bundle_id}, "
                f"inputs={list(self._inputs)}, outputs={list(self._outputs)})")


def _is_tensor(value: Any) -> bool:
    """A torch tensor (without importing torch: a serving host of ONNX Runtime has none)."""
    return type(value).__module__.startswith("torch") and callable(getattr(value, "detach",
                                                                           None))


def _wrong_dtype(given: Mapping[str, Any], want: Mapping[str, str] | None) -> str | None:
    """Which input of a refused call has a dtype the engine does not take, in words (None:
    each has the one it takes, or it cannot be told). Without the runner's dtypes: an input of
    float64, complex, object or another dtype no engine takes as given."""
    for name, value in given.items():
        dtype = getattr(value, "dtype", None)
        if dtype is None or not hasattr(dtype, "kind"):
            continue
        expected = want.get(name) if want else None
        if expected is not None and str(dtype) != expected:
            return f"input {name!r} is {dtype}; the engine takes {expected} (cast it)"
        if expected is None and (dtype.kind in "cOSUVMm" or str(dtype) == "float64"):
            return f"input {name!r} is {dtype}, which the engine refused (cast it)"
    return None


def _host_array(name: str, value: Any) -> np.ndarray:
    """``value`` as a numpy array in this host's byte order; InputError when it is none."""
    import numpy as np

    try:
        detach = getattr(value, "detach", None)
        if isinstance(value, np.ndarray):
            array = value
        elif callable(detach):  # a torch tensor, on any device
            array = np.asarray(detach().cpu().numpy())
        else:
            array = np.asarray(value)
        if array.dtype.hasobject:
            raise InputError(f"input {name!r} is not an array of numbers ({array.dtype})")
        return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))
    except InputError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise InputError(f"input {name!r} is not an array: {exc}") from exc
    except Exception as exc:  # an object whose __array__ (or tensor copy) raises its own
        raise InputError(f"input {name!r} cannot be read as an array: "
                         f"{type(exc).__name__}: {exc}") from exc


def _misfit(given: Mapping[str, tuple[int, ...]],
            recorded: Sequence[Mapping[str, Sequence[int]]]) -> str | None:
    """How the shapes ``given`` differ from every one of the ``recorded`` pairs' (None when
    one fits in rank and in every dimension that is the same in all pairs, or when nothing
    was recorded)."""
    if not recorded:
        return None
    for name, shape in given.items():
        seen = [tuple(r[name]) for r in recorded if name in r]
        if not seen:
            continue
        if all(len(s) != len(shape) for s in seen):
            return f"{name} has shape {list(shape)}, rank {len(shape)}; the validation set's " \
                   f"has rank {len(seen[0])}, e.g. {list(seen[0])}"
        fixed = [i for i in range(len(seen[0])) if len({s[i] for s in seen
                                                        if len(s) == len(seen[0])}) == 1]
        if len(shape) == len(seen[0]) and any(shape[i] != seen[0][i] for i in fixed):
            return f"{name} has shape {list(shape)}; the validation set's is {list(seen[0])}"
    return None


def _keys(trusted_key: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None
          ) -> tuple[Path, ...]:
    if trusted_key is None:
        return ()
    if isinstance(trusted_key, (str, os.PathLike)):
        return (Path(trusted_key),)
    return tuple(Path(k) for k in trusted_key)


def load(source: str | os.PathLike[str], *, require_signature: bool = False,
         trusted_key: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
         policy: str | os.PathLike[str] | None = None,
         on_suboptimal: OnSuboptimal = "warn", signature: str | os.PathLike[str] | None = None,
         host: Fingerprint | str | os.PathLike[str] | None = None, insecure: bool = False,
         registry_cache: str | os.PathLike[str] | None = None) -> Engine:
    """Verify the bundle at ``source`` (a folder, a ``.dossier.tar``, or a registry reference
    pulled and cached as ``verify REF`` does), then load its shipped engine as it was timed.

    ``trusted_key``: one Ed25519 public key (PEM) or several; a signature beside the bundle (or
    ``signature``, or the registry's referrers) is checked whenever there is one, and with
    ``require_signature`` an unsigned bundle is refused (SignatureError, exit 13). ``policy``: a
    TOML policy file, as ``verify --policy``. ``on_suboptimal``: ``"warn"``
    (:class:`SuboptimalWarning`), ``"refuse"`` (SuboptimalHostError) or ``"ignore"``. ``host``:
    judge this fingerprint instead of this host's (a fleet host's fingerprint, for tests).

    Raises what :func:`dossier.verify.verify` raises, InvalidHostError for an INVALID verdict,
    BackendUnavailableError when the backend's library is not installed here, and
    EngineFailedError when the engine does not load. The verification report is on every
    refusal: :func:`dossier.verify.refused_report`.
    """
    with opened(source, require_signature=require_signature, trusted_key=trusted_key,
                policy=policy, on_suboptimal=on_suboptimal, signature=signature, host=host,
                insecure=insecure, registry_cache=registry_cache,
                read_validation=False) as (engine, _):
        return engine


@contextlib.contextmanager
def opened(source: str | os.PathLike[str], *, require_signature: bool = False,
           trusted_key: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
           policy: str | os.PathLike[str] | None = None,
           on_suboptimal: OnSuboptimal = "warn", signature: str | os.PathLike[str] | None = None,
           host: Fingerprint | str | os.PathLike[str] | None = None, insecure: bool = False,
           registry_cache: str | os.PathLike[str] | None = None, read_validation: bool = True
           ) -> Iterator[tuple[Engine, Bundle]]:
    """:func:`load`, with the verified bundle kept open for the ``with`` block (to read its
    validation set, as ``dossier run --check`` does; ``read_validation=False`` when the block
    does not). The engine outlives the block."""
    if not os.fspath(source):
        raise InputError("no bundle given (the source is empty)",
                         hint="name a bundle folder, a .dossier.tar or a registry reference")
    if on_suboptimal not in ("warn", "refuse", "ignore"):
        raise InputError(f"on_suboptimal must be 'warn', 'refuse' or 'ignore', "
                         f"not {on_suboptimal!r}")
    handed = _Handed()
    options = VerifyOptions(
        trusted_keys=_keys(trusted_key), require_signature=require_signature,
        policy=Path(policy) if policy is not None else None,
        signature=Path(signature) if signature is not None else None,
        host=host if host is None or not isinstance(host, (str, os.PathLike)) else Path(host),
        insecure=insecure,
        registry_cache=Path(registry_cache) if registry_cache is not None else None,
        read_validation=read_validation, extract=True,  # the engine loaded is the copy whose bytes were checked
        check_records=False,
        prepare_backend=handed)  # while the fingerprint is collected and files checked
    with verified(source, options) as (bundle, report):
        _apply_verdict(report, on_suboptimal)
        yield _load(bundle, report, handed.backend), bundle


class _Handed:
    """:func:`opened`'s ``prepare_backend``: keeps the backend instance the verification
    resolved (the load uses it) and imports its runtime, which reads no engine and touches
    no device. Raises nothing: a runtime that is missing or fails to import is reported by
    the load, after the checks."""

    def __init__(self) -> None:
        self.backend: Backend | None = None

    def __call__(self, backend: Backend) -> None:
        self.backend = backend
        try:
            backend.import_runtime()
        except Exception as exc:  # said in the load's own words, after the checks
            logger.debug("importing the runtime of %r ahead of the load failed: %s",
                         backend.name, exc)


def _apply_verdict(report: VerifyReport, on_suboptimal: OnSuboptimal) -> None:
    why = "; ".join(report.reasons[:3]) or "no reason recorded"
    if report.verdict is Verdict.INVALID:
        raise with_report(InvalidHostError(
            f"{report.release} ({report.source}) is INVALID on this host: {why}",
            hint="rebuild or re-tune it for this host (dossier retune)"), report)
    if report.verdict is Verdict.SUBOPTIMAL:
        text = f"{report.release} ({report.source}) is SUBOPTIMAL on this host: {why}"
        if on_suboptimal == "refuse":
            raise with_report(SuboptimalHostError(
                text, hint="re-measure it here (dossier verify --rebench) or re-tune it"),
                report)
        if on_suboptimal == "warn":
            warnings.warn(text, SuboptimalWarning, stacklevel=3)


def _load(bundle: Bundle, report: VerifyReport, backend: Backend | None) -> Engine:
    """The shipped engine of a verified bundle, by ``backend`` (the instance the verification
    handed over), as its manifest entry records it."""
    from dossier.backends import get_backend, not_served
    from dossier.backends.interface import EngineRuntimeError

    m = bundle.manifest
    shipped = m.engines.shipped
    if backend is None:  # not handed over: it failed to import ahead of the checks
        backend = get_backend(m.backend)
    refused = not_served(m.backend, backend)  # the verdict said so already: never loaded
    if refused is not None:
        raise with_report(InvalidHostError(f"{m.name}: {refused}"), report)
    try:
        route = backend.check_recorded_route(shipped.route)  # checked by the verdict too
        if shipped.load is None:  # a bundle older than format 1.1, or imported from trtexec
            _configure_from_header(bundle, backend)
        runner = backend.load_shipped(bundle.file(shipped.path), route, shipped.load,
                                      shipped.facts)
        names = runner.io_names()
    except DossierError as exc:
        raise with_report(exc, report) from None
    except Exception as exc:  # EngineRuntimeError, or a runtime's own: one line, exit 11
        native = exc.__cause__ if isinstance(exc, EngineRuntimeError) and exc.__cause__ else exc
        raise with_report(EngineFailedError(f"{m.name}: the verified engine did not load here: "
                                            f"{str(native).strip() or type(native).__name__}"),
                          report) from exc
    shapes = _recorded_shapes(bundle)
    if names is None:  # a runner that does not say: the validation set's inputs
        names = (sorted(shapes[0]) if shapes else [], [])
    return Engine(runner, inputs=names[0], outputs=names[1], route=shipped.route,
                  bundle_id=m.dossier_id, backend=m.backend, report=report, shapes=shapes)


def _configure_from_header(bundle: Bundle, backend: Backend) -> None:
    """For a shipped engine with no recorded load: ``backend`` configured with the tuning
    header's ``[builder]`` options and ``[[shapes]]``, as the trial's worker was (TensorRT:
    runtime platform, version compatibility). A header without builder options leaves
    nothing for a load to depend on (a fresh instance has those options) and is not parsed
    (parsing it imports the release spec's models, and pyarrow with them)."""
    from dossier.run_folder import CACHE_NAME

    path = bundle.file(CACHE_NAME)
    if not _builder_recorded(path):
        return
    from dossier.cache import read_header

    header = read_header(path)
    backend.configure(header.builder, header.shapes)


def _builder_recorded(path: Path) -> bool:
    """Whether a tuning cache's header line records ``[builder]`` options (format 2 keeps them
    in its ``spec``, format 1 at the top); True when that cannot be told, so that parsing the
    header says what is wrong with it."""
    import json

    try:
        with open(path, "rb") as f:  # at most dossier.cache.CACHE_MAX_LINE (not imported:
            head = json.loads(f.readline((16 << 20) + 1))  # it brings the spec's models)
        return bool(head.get("spec", head).get("builder"))
    except (OSError, ValueError, RecursionError, AttributeError):
        return True


def _recorded_shapes(bundle: Bundle) -> list[dict[str, list[int]]]:
    """Every validation pair's input shapes (validation.json; none when it cannot be read)."""
    try:
        return list(bundle.validation_info().pair_inputs.values())
    except DossierError:
        return []


__all__ = ["Engine", "OnSuboptimal", "SuboptimalWarning", "load", "opened"]
