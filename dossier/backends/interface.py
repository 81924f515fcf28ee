"""The backend interface: one compiler behind ``knob_database / build / load``.

A backend imports its compiler lazily (inside methods), so a host without it can still read,
verify and explain bundles made with it. The public methods of :class:`Backend` and
:class:`Runner` check their inputs and call the ``*_impl`` methods subclasses provide; native
compiler errors (the types in ``native_errors``) are mapped to :class:`BuildError` /
:class:`EngineRuntimeError` there, once, so a subclass raises whatever its compiler raises.
dossier's own errors and MemoryError (a crashed trial) pass unchanged. The loaded engine and
the two errors are in :mod:`dossier.backends.runner`, the model's signature in
:mod:`dossier.backends.signature` (both importable from here as well).
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from dossier.backends.runner import (
    BuildError,
    EngineRuntimeError,
    NativeErrors,
    Runner,
    first_line,
    passes_unchanged,
)
from dossier.backends.signature import ModelSignature, TensorSpec
from dossier.errors import (
    BackendUnavailableError,
    InputError,
    ModelError,
    SelectionError,
)
from dossier.knobs import KnobDatabase
from dossier.load_config import LoadConfig
from dossier.routes import Route

if TYPE_CHECKING:
    from dossier.datasets import CalibrationSet
    from dossier.fingerprint import Fingerprint
    from dossier.host.policy import Finding, Policy, Rule

__all__ = ["THREADS_PER_CORE", "Backend", "BuildError", "BuildInfo", "EngineRuntimeError",
           "LoadConfig", "ModelSignature", "NativeErrors", "Runner", "SearchTraits", "TensorSpec",
           "first_line", "max_threads"]
"""The backend author's names, importable from here (a plug-in backend's one import)."""


@dataclass
class BuildInfo:
    """What a build reports besides the engine file."""

    facts: dict[str, str] = field(default_factory=dict)
    """Backend facts about the engine (e.g. plan header fields, the ISA it targets)."""




THREADS_PER_CORE = 8
"""The most threads per core of this host a route read back may ask for in any thread-count
knob (:attr:`Backend.thread_knobs`)."""


def max_threads(cores: int | None = None) -> int:
    """The most threads a route read back may ask for: :data:`THREADS_PER_CORE` per core of a
    host of ``cores`` logical CPUs (None: the cores this process may run on)."""
    import os

    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):  # not Linux
            cores = os.cpu_count() or 1
    return THREADS_PER_CORE * max(cores, 1)


@dataclass(frozen=True)
class SearchTraits:
    """How a search treats a backend's processes, builds and timing: one value per backend
    class (:attr:`Backend.traits`), read by the schedulers (:mod:`dossier.executors`), the
    build queue (:mod:`dossier.jobs.builds`), the fork server and the worker's timing."""

    fork_workers: bool = False
    """A search forks this backend's worker processes from one that has done dossier's
    imports (:mod:`dossier.jobs.forkserver`) instead of starting each afresh."""
    separate_build: bool = False
    """Build in one process and load, validate and time in a fresh one (as a deployment
    loads a shipped engine): for compilers whose in-process state can disturb the engine."""
    build_cores: int = 0
    """CPU cores one build keeps busy, for the default of ``--build-jobs`` (cores // this); 0
    for one build at a time by default: builds that take less than a process start, or that
    time kernels on the device, where concurrent builds would disturb each other."""
    build_memory_mb: int = 1024
    """Memory one build needs, roughly (bounds the default of ``--build-jobs``)."""
    prestart_measuring: bool = False
    """The default of ``timing.confirm_prestart`` and ``timing.trial_prestart``: start each
    measuring (trial) process's successor while it loads (worth it when loads take about as
    long as the runtime's import)."""
    reload_per_block: bool = False
    """Load the engine afresh for every timing block and release it after, so only one engine
    is alive at a time (two ONNX Runtime sessions in one process disturb each other through
    their thread pools); otherwise both engines stay loaded for the whole trial. See
    :attr:`switch_pause_s` for engines that take longer to load than that pause."""
    switch_pause_s: float = 0.0
    """With :attr:`reload_per_block`: when the first engine of a trial or measuring process
    takes longer than this to load, its engines are loaded once and kept open instead, and a
    block that follows another engine's block starts with a pause this long (in which the
    other engine's threads stop spinning); a reload costs more than the pause then. 0: always
    load afresh."""


class Backend(abc.ABC):
    """A compiler dossier can tune.

    Public methods check their inputs and call the ``*_impl`` methods a subclass provides;
    native errors (:attr:`native_errors`) become BuildError in :meth:`build` and
    EngineRuntimeError in :meth:`load`. A backend also contributes its verify policy rules
    (:meth:`policy_rules`) and the requirements a host must meet (:meth:`requirement_findings`).

    **Lifecycle.** The order dossier calls a backend in, and what each step may rely on:

    1. *Made*: :func:`dossier.backends.get_backend` calls the class with no arguments and
       returns a fresh instance each time; nothing is imported (the compiler neither), so
       class attributes and :meth:`available` may be read on any host. Each process makes its
       own instance: the search's, each worker process's, ``verify``'s, ``dossier.load``'s.
    2. *Required*: :meth:`require` (BackendUnavailableError with :attr:`requirement`) before
       anything that needs the library; :meth:`knob_database`, :meth:`build` and :meth:`load`
       call it themselves.
    3. *Configured*, once, before any build or load: :meth:`configure` with the spec's (or the
       recorded header's) ``[builder]`` options and ``[[shapes]]``. A worker process may
       :meth:`adopt_knob_database` the search's database first, so it never reads its own.
    4. *Asked* about the search, in the search's process: :meth:`knob_database` (read once per
       instance), :meth:`signature` (which calls :meth:`check_model`), :meth:`check_route`,
       :meth:`timing_defaults`, :meth:`needs_calibration`, :meth:`inert_knobs`; later, for
       each route that passed, :meth:`production_load` and :meth:`engine_facts`, and
       :meth:`loader_env` for each process that loads an engine. None of these builds or
       loads an engine.
    5. *Build*, in a build or trial process: :meth:`use_calibration` (only for a route that
       :meth:`needs_calibration`) and :meth:`use_build_scratch`, then :meth:`build` once per
       route; the engine file does not exist when :meth:`build_impl` is called, and must exist
       when it returns.
    6. *Load and run*, in a fresh process (:attr:`SearchTraits.separate_build`) or the one that
       built it: :meth:`load` (the search, ``verify``) or :meth:`load_shipped` (a bundle's
       engine, ``dossier.load``) returns a :class:`Runner`, used from one thread at a time and
       released by :meth:`Runner.close`. A process that waits for its turn may call
       :meth:`import_runtime` first; it touches no device and no engine.
    7. *Verified*, on any host, from the recorded facts alone and without the library where
       :attr:`route_check_imports` is False: :meth:`check_recorded_route`,
       :meth:`default_policy` (:meth:`policy_rules`), :meth:`requirement_findings`.

    Guarantees: an instance serves one process and is never shared across processes (a
    worker gets the backend's name, not the instance); one search, one configuration; every
    native error leaves through the public methods mapped (BuildError, EngineRuntimeError),
    dossier's own errors and MemoryError unchanged. How a search treats the backend's
    processes and timing is one value, :attr:`traits`.
    """

    name: ClassVar[str]
    """Registered name, e.g. ``onnxruntime``."""
    engine_suffix: ClassVar[str]
    """File suffix of the engine artifact, e.g. ``.ort``."""
    requirement: ClassVar[str]
    """What to install for this backend, for error messages."""
    traits: ClassVar[SearchTraits] = SearchTraits()
    """How a search treats this backend's processes, builds and timing."""
    contention_knobs: ClassVar[frozenset[str]] = frozenset()
    """Knobs whose effect depends on what else runs on the host (threads, spinning, execution
    mode): a route that sets them can win on a loaded host and lose on a quiet one."""
    fingerprint_compiler: ClassVar[bool] = False
    """The host's C++ compiler belongs in the tuning host's fingerprint (the compiler
    recompiles or links with it)."""
    for_tests: ClassVar[bool] = False
    """A backend for tests only (fault injection): left out of the names offered to users,
    and a bundle that names it is never served (INVALID)."""
    route_check_imports: ClassVar[bool] = True
    """:meth:`check_recorded_route` imports the compiler (it reads the knob database): a
    ``verify`` that loads nothing then leaves it out. False where a backend checks a route
    against knobs it knows without its library."""
    thread_knobs: ClassVar[frozenset[str]] = frozenset()
    """Knobs whose value is a thread count: a route read back is refused when one asks for
    more than :data:`THREADS_PER_CORE` threads per core of this host
    (:meth:`check_recorded_route`)."""
    native_errors: ClassVar[NativeErrors] = (Exception,)
    """Exception types the compiler raises for a failure it reports (a failed build, an engine
    that does not load); others propagate as bugs."""
    runtime_modules: ClassVar[tuple[str, ...]] = ()
    """The modules a process that loads this backend's engines imports (:meth:`import_runtime`)."""

    # ------------------------------------------------------------------ public, checked
    def prestarts(self, setting: bool | None) -> bool:
        """Whether processes start on standby under ``timing.confirm_prestart`` or
        ``timing.trial_prestart`` set to ``setting`` (None: the traits'
        :attr:`~SearchTraits.prestart_measuring`)."""
        return self.traits.prestart_measuring if setting is None else setting

    def import_runtime(self) -> None:
        """Import the library that loads this backend's engines, touching no device and no
        engine: what a loading process may do while it waits for its turn or while its bundle
        is being checked (``import torch`` alone takes seconds). Nothing when the library is
        missing: :meth:`load` says so."""
        if self.available():
            for name in self.runtime_modules:
                importlib.import_module(name)

    def knob_database(self) -> KnobDatabase:
        """Every knob this backend exposes on this host (read once per instance)."""
        db: KnobDatabase | None = self.__dict__.get("_knob_database")
        if db is None:
            self.require()
            db = self.__dict__["_knob_database"] = self.knob_database_impl()
        return db

    def adopt_knob_database(self, db: KnobDatabase) -> None:
        """Use ``db``, read by the search on this backend once, instead of reading it again
        (a trial process: probing ONNX Runtime's optimizers costs more than its build)."""
        self.__dict__["_knob_database"] = db

    def check_recorded_route(self, text: str, cores: int | None = None) -> Route:
        """A route read back from a bundle or a record (``text``), checked before any engine
        of it is loaded: every knob one of this host's knob database, every value one it
        allows; a thread count (:attr:`thread_knobs`) a whole number from -1 to
        :data:`THREADS_PER_CORE` per core of the host (``cores`` logical CPUs, None: the
        cores this process may run on), whatever the database lists (what an
        engine asking for 100000 threads would otherwise take: minutes, or a hang; the list
        offered for a sweep follows the tuning host's cores). SelectionError naming the knob
        otherwise; BackendUnavailableError when the library is not installed."""
        return self._checked_route(text, self.knob_database(), cores)

    def _checked_route(self, text: str, db: KnobDatabase, cores: int | None) -> Route:
        """:meth:`check_recorded_route` against ``db`` (a backend that can tell its knobs
        without importing its library passes its own)."""
        route = Route.parse(text)
        limit = max_threads(cores)
        for name, value in route.values:
            knob = db.get(name)
            if name in self.thread_knobs:
                try:
                    count = int(value)
                except ValueError:
                    raise SelectionError(f"-{name}={value} is not a thread count") from None
                if not -1 <= count <= limit:
                    raise SelectionError(f"-{name}={value}: a thread count may be at most "
                                         f"{limit}, {THREADS_PER_CORE} per logical CPU of the "
                                         "host")
            elif knob.values is not None and value not in knob.values:
                raise SelectionError(f"value {value!r} is not allowed for -{name}",
                                     hint=f"allowed here: {knob.allowed_text()}")
        return route

    def signature(self, model: Path) -> ModelSignature:
        """The model's inputs and outputs; ModelError when the model cannot be read."""
        model = Path(model)
        self.check_model(model)
        return self.signature_impl(model)

    def check_route(self, model: Path, route: Route, db: KnobDatabase) -> None:
        """Raise SelectionError when a knob of ``route`` is known not to take effect."""
        self.check_route_impl(Path(model), route, db)

    def build(self, model: Path, route: Route, engine: Path) -> BuildInfo:
        """Compile ``model`` under ``route`` into the file ``engine`` (replaced); BuildError on
        failure, also when the compiler wrote no engine."""
        self.require()
        engine = Path(engine)
        engine.parent.mkdir(parents=True, exist_ok=True)
        engine.unlink(missing_ok=True)
        try:
            info = self.build_impl(Path(model), route, engine)
        except Exception as exc:
            if passes_unchanged(exc) or not isinstance(exc, self.native_errors):
                raise
            raise BuildError(self.native_message(exc, f"building route {route}")) from exc
        if not engine.is_file():
            raise BuildError(f"{self.name} wrote no engine ({engine.name})")
        return info

    def load(self, engine: Path, route: Route) -> Runner:
        """Load a built engine (load-time knobs of ``route`` applied); EngineRuntimeError on
        failure."""
        return self._loaded(Path(engine), lambda e: self.load_impl(e, route))

    def load_shipped(self, engine: Path, route: Route, load: LoadConfig | None,
                     facts: Mapping[str, str]) -> Runner:
        """Load a bundle's shipped engine as its manifest entry records it: the file
        ``engine``, its ``route``, the entry's :class:`LoadConfig` (what :meth:`production_load`
        recorded when it was timed; None in bundles older than format 1.1) and the engine's
        ``facts``. The default: :meth:`load` (a backend whose load depends on more than the
        route takes it from the entry instead of from how this instance is configured)."""
        return self.load(engine, route)

    def _loaded(self, engine: Path, impl: Callable[[Path], Runner]) -> Runner:
        """``impl(engine)`` once the library is there and ``engine`` is a file; native errors
        mapped to EngineRuntimeError."""
        self.require()
        if not engine.is_file():
            raise EngineRuntimeError(f"cannot read engine {engine}: no such file")
        try:
            return impl(engine)
        except Exception as exc:
            if passes_unchanged(exc) or not isinstance(exc, self.native_errors):
                raise
            raise EngineRuntimeError(self.native_message(exc, f"loading {engine.name}")) from exc

    def loader_env(self, *engines: Path | str | None) -> dict[str, str]:
        """Environment variables a process needs to load the given engines (set in the
        children that load them); absent engines and None are skipped."""
        env: dict[str, str] = {}
        for e in engines:
            if e is not None and Path(e).is_file():
                env.update(self.loader_env_impl(Path(e)))
        return env

    def default_policy(self) -> Policy:
        """The built-in verify policy of this backend's engines: the rules every backend
        shares around the backend's own (:meth:`policy_rules`)."""
        from dossier.host.policy import Policy, common_rules, tail_rules

        return Policy(rules=(*common_rules(), *self.policy_rules(), *tail_rules()))

    # ------------------------------------------------------------------ for subclasses
    def configure(self, options: Mapping[str, object], shapes: list[Any]) -> None:
        """Apply the spec's ``[builder]`` options and shape distribution (``[[shapes]]``).

        Backends without builder options refuse any; shapes are ignored unless the backend
        builds for a shape range (TensorRT optimization profiles)."""
        if options:
            raise InputError(f"backend {self.name} takes no [builder] options "
                             f"(got {', '.join(sorted(options))})")

    def require(self) -> None:
        """Raise BackendUnavailableError with an install hint when the library is missing."""
        if not self.available():
            raise BackendUnavailableError(
                f"backend {self.name} needs a library that is not installed on this host",
                hint=f"install it: {self.requirement}")

    @abc.abstractmethod
    def available(self) -> bool:
        """True when the compiler library can be imported here (without importing it)."""

    @abc.abstractmethod
    def knob_database_impl(self) -> KnobDatabase:
        """Every knob this backend exposes on this host (the library is installed)."""

    def check_model(self, model: Path) -> None:
        """Raise ModelError when ``model`` cannot be one of this backend's models; the default:
        it must be an existing file."""
        if not model.is_file():
            raise ModelError(f"model {model} does not exist")

    @abc.abstractmethod
    def signature_impl(self, model: Path) -> ModelSignature:
        """The model's inputs and outputs (the file exists); ModelError when unreadable."""

    def check_route_impl(self, model: Path, route: Route, db: KnobDatabase) -> None:
        """Raise SelectionError when a knob of ``route`` is known not to take effect."""

    @abc.abstractmethod
    def build_impl(self, model: Path, route: Route, engine: Path) -> BuildInfo:
        """Compile into ``engine`` (its folder exists, the file does not)."""

    @abc.abstractmethod
    def load_impl(self, engine: Path, route: Route) -> Runner:
        """Load ``engine`` (the file exists)."""

    def native_message(self, exc: Exception, doing: str) -> str:
        """One line for a native error raised while ``doing`` (e.g. ``building route -a=1``);
        the default: the first line of its message."""
        return first_line(exc)

    def loader_env_impl(self, engine: Path) -> dict[str, str]:
        """Environment variables a process needs to load ``engine`` (a file); none by default."""
        return {}

    def policy_rules(self) -> tuple[Rule, ...]:
        """The verify rules for this backend's engines (see :mod:`dossier.host.policy`)."""
        raise InputError(f"no verify policy for backend {self.name!r}")

    def requirement_findings(self, host: Fingerprint) -> list[Finding]:
        """What an engine of this backend needs on any host, whatever its tuning host was (so
        also when the tuning host is unknown); each missing requirement is an INVALID finding.
        None by default."""
        return []

    GPU_TIMING: dict[str, object] = {"confirm_processes": 6}
    """The timing defaults of engines that run on a GPU: the confirmation's first look after 6
    measuring processes. On the H200 a CUDA graph's gain over a launch-bound baseline ranged
    2.2x-3.7x from process to process (sd of its log about 0.14), so 5 processes left a 95%
    interval reaching below 2x; 6 narrow it, at about 6-10 s a process.
    (:mod:`dossier.measure.confirmation`)."""

    def timing_defaults(self, route: Route, db: KnobDatabase) -> dict[str, object]:
        """``[timing]`` settings engines built with ``route`` need unless the spec sets them
        (applied by the tuner and recorded in the tuning cache). None by default."""
        return {}

    def production_load(self, route: Route, db: KnobDatabase) -> LoadConfig:
        """The load configuration a deployment should use for an engine built with ``route``:
        the one :meth:`load` times it in. The default: the backend's own ``load``."""
        return LoadConfig(call=f"dossier.backends.get_backend({self.name!r}).load(ENGINE, route)",
                          note="no production loader is documented for this backend")

    def engine_facts(self, route: Route, db: KnobDatabase) -> dict[str, bool]:
        """Boolean facts about an engine built with ``route`` that the verify policy uses."""
        return {}

    def inert_knobs(self, route: Route, db: KnobDatabase) -> frozenset[str]:
        """Knobs whose value has no effect under ``route`` (a quantization setting on a route
        that does not quantize): routes that differ only in them build the same engine, and a
        search measures one of them. None by default."""
        return frozenset()

    def needs_calibration(self, route: Route, db: KnobDatabase) -> bool:
        """Whether building ``route`` needs a calibration set (static quantization)."""
        return False

    calibration: CalibrationSet | None = None
    """The calibration set builds that need one read (:meth:`use_calibration`)."""

    def use_calibration(self, calibration: CalibrationSet | None) -> None:
        """Give the builds of routes that need data to build (:meth:`needs_calibration`) their
        calibration set: inputs only, never a validation or hold-out sample."""
        self.calibration = calibration

    build_scratch: Path | None = None
    """A folder of the search where builds keep what the builds of several routes share
    (ONNX Runtime: the model after ``quant_pre_process``), each entry checked by digest before
    it is reused (:meth:`use_build_scratch`); None: nothing is shared."""

    def use_build_scratch(self, folder: Path | None) -> None:
        """Give builds a folder to share intermediate results in (:attr:`build_scratch`)."""
        self.build_scratch = folder

    def engine_documents(self, engine: Path) -> dict[str, bytes]:
        """Documents a reviewer reads out of a built engine, by file name (a quantized engine's
        settings and calibration ranges), for the bundle's ``engine/`` folder. None by default."""
        return {}

    def knobs_not_offered(self) -> dict[str, str]:
        """Knobs this backend has on some hosts but not here, each with why (an execution
        provider that does not load): what ``dossier knobs`` says of them. None by default."""
        return {}

    def stack(self) -> dict[str, str]:
        """Versions of the libraries this backend runs on (recorded in the tuning cache)."""
        return {}
