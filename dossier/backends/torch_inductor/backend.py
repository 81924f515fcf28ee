"""PyTorch AOTInductor backend: ``torch.export`` + ``aoti_compile_and_package`` into a ``.pt2``.

build = export the model (dynamic dimensions as the signature says) and compile it ahead of time
with the route's ``torch._inductor.config`` values into an AOTInductor package; the route text,
the torch version and the tensor names go into the package metadata. load =
``torch._inductor.aoti_load_package``. Each build runs with ``TORCHINDUCTOR_CACHE_DIR`` set to a
fresh temporary folder that is removed afterwards, so a build never reuses another's kernels
(set :data:`CACHE_ENV` to share one cache folder instead, e.g. in benchmarks that rebuild the
same routes; such builds are warm).

The package's modules: :mod:`.knobs`, :mod:`.model` (signatures, ``module:factory`` references,
exported programs), :mod:`.build`, :mod:`.runner` (CUDA graphs), :mod:`.package` (metadata and
the normalized digest), :mod:`.policy` (verify rules); the host's C++ compiler and libstdc++
linkage are in :mod:`dossier.cxx_runtime`.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dossier import cxx_runtime
from dossier.backends.interface import Backend, BuildInfo, SearchTraits
from dossier.backends.runner import BuildError, EngineRuntimeError, Runner
from dossier.backends.signature import ModelSignature
from dossier.backends.torch_inductor.build import (
    BuildPlan,
    build_cache,
    cxx_facts,
    map_build_error,
    matmul_precision,
    short_error,
)
from dossier.backends.torch_inductor.knobs import (
    DTYPES,
    INDUCTOR_KEYS,
    KNOB_PREFIX,
    OWN_DEFAULTS,
    PRECISIONS,
    device_values,
    key_values,
    parse_value,
    value_text,
)
from dossier.backends.torch_inductor.model import (
    EXPORTED_SUFFIXES,
    as_declared,
    drop_dtype_asserts,
    dynamic_shapes,
    example_inputs,
    exported_signature,
    factory_signature,
    is_model_reference,
    load_exported,
    load_factory,
    program_devices,
    program_float_dtypes,
    signature_from_dict,
    wrap_module,
)
from dossier.backends.torch_inductor.package import META_PREFIX, normalized_digest, package_metadata
from dossier.backends.torch_inductor.runner import TorchInductorRunner, load_package
from dossier.errors import ModelError
from dossier.knobs import Knob, KnobDatabase, KnobPhase
from dossier.load_config import LoadConfig
from dossier.routes import Route
from dossier.scenario import SESSIONS_KNOB, SESSIONS_VALUES, sessions_lines

if TYPE_CHECKING:
    from dossier.host.policy import Rule


# ------------------------------------------------------------------------------ backend
class TorchInductorBackend(Backend):
    """PyTorch AOTInductor (CPU or CUDA)."""

    name = "torch-inductor"
    engine_suffix = ".pt2"
    traits = SearchTraits(separate_build=True, build_cores=4, build_memory_mb=4096,
                          prestart_measuring=True)
    runtime_modules = ("torch",)
    requirement = "pip install 'dossier[torch]' (torch >= 2.6)"
    fingerprint_compiler = True  # AOTInductor compiles and links with the host's C++ compiler
    thread_knobs = frozenset({KNOB_PREFIX + "cpp.threads"})
    route_check_imports = False

    def available(self) -> bool:
        return importlib.util.find_spec("torch") is not None

    def check_recorded_route(self, text: str, cores: int | None = None) -> Route:
        """Checked against the knobs known without importing torch (a verify that loads
        nothing imports no runtime): ``device``, ``dtype``, ``float32_matmul_precision`` and
        ``cuda_graph`` with every value they can take; the curated inductor keys
        (:data:`INDUCTOR_KEYS`: build-time, baked into the package) by name;
        ``inductor:cpp.threads`` a thread count."""
        knobs = [Knob(name="device", values=device_values(True), default="cpu"),
                 Knob(name="dtype", values=DTYPES, default="float32"),
                 Knob(name="float32_matmul_precision", values=PRECISIONS, default="highest"),
                 Knob(name="cuda_graph", values=("off", "on"), default="off"),
                 _sessions_knob(),
                 *(Knob(name=KNOB_PREFIX + key, values=None, default="default")
                   for key, _, _ in INDUCTOR_KEYS)]
        db = KnobDatabase(backend=self.name, tuner_version="static", knobs=tuple(knobs))
        return self._checked_route(text, db, cores)

    def knob_database_impl(self) -> KnobDatabase:
        import torch
        from torch._inductor import config

        cuda = bool(torch.cuda.is_available())
        current = config.get_config_copy()
        knobs = [
            Knob(name="device", values=device_values(cuda), default="cuda" if cuda else "cpu",
                 help="where the package runs; a CPU package is compiled with -march=native"),
            Knob(name="dtype", values=DTYPES, default="float32", changes_numerics=True,
                 help="compute dtype: the model and its floating inputs are cast inside the "
                      "engine, floating outputs cast back to the signature's dtype"),
            Knob(name="float32_matmul_precision", values=PRECISIONS,
                 default=torch.get_float32_matmul_precision(), changes_numerics=True,
                 help="torch.set_float32_matmul_precision while building and running: high "
                      "allows TF32 on GPUs, medium bf16"),
            Knob(name="cuda_graph", values=("off", "on") if cuda else ("off",), default="off",
                 phase=KnobPhase.LOAD,
                 help="replay the package's kernels as a CUDA graph over static input buffers, "
                      "one graph per input shape (removes per-kernel launch overhead; the copies "
                      "in and out are part of each call; trtexec's default)"),
            _sessions_knob(),
        ]
        for key, text, numerics in INDUCTOR_KEYS:
            if key not in current:
                continue
            default = OWN_DEFAULTS.get(key, current[key])
            knobs.append(Knob(name=KNOB_PREFIX + key, values=key_values(key, default, cuda),
                              default=value_text(default), phase=KnobPhase.BUILD, help=text,
                              changes_numerics=numerics))
        return KnobDatabase(backend=self.name, tuner_version=f"torch {torch.__version__}",
                            knobs=tuple(knobs))

    def stack(self) -> dict[str, str]:
        import torch

        out: dict[str, str] = {"torch": str(torch.__version__)}
        if torch.version.cuda:
            out["torch_cuda"] = str(torch.version.cuda)
            if torch.cuda.is_available():
                out["cudnn"] = str(torch.backends.cudnn.version())  # type: ignore[no-untyped-call]
        if importlib.util.find_spec("triton") is not None:
            from importlib import metadata

            with contextlib.suppress(metadata.PackageNotFoundError):
                out["triton"] = metadata.version("triton")
        info = cxx_runtime.choose().compiler
        if info is not None:
            out["cxx"] = info.text()
        return out

    # ---------------------------------------------------------------------------- model
    def check_model(self, model: Path) -> None:
        """A ``module:factory`` reference, or an exported program file (*.pt2, *.ep)."""
        if is_model_reference(model):
            return
        if model.suffix.lower() == ".onnx":
            raise ModelError(f"model {model.name} is ONNX: the torch-inductor backend takes an "
                             "exported program (*.pt2, *.ep, written by torch.export.save) or a "
                             "module:factory reference",
                             hint="tune an ONNX model with backend = \"onnxruntime\", or give "
                                  "the torch model")
        if model.suffix not in EXPORTED_SUFFIXES:
            raise ModelError(f"model {model} is neither an exported program (*.pt2, *.ep) nor a "
                             "module:factory reference")
        super().check_model(model)

    def signature_impl(self, model: Path) -> ModelSignature:
        self.require()
        if is_model_reference(model):
            return factory_signature(str(model))
        ep, sig = load_exported(model)
        if sig is not None:
            return signature_from_dict(sig, str(model))
        return exported_signature(ep, str(model))

    def plan(self, route: Route) -> BuildPlan:
        """What ``route`` means: device, dtype, precision and the inductor configs to set."""
        import torch
        from torch._inductor import config

        db = self.knob_database()
        known = {k.name for k in db.knobs}
        for name in route.as_dict():
            if name not in known and not name.startswith(KNOB_PREFIX):
                raise BuildError(f"unknown knob -{name} for backend {self.name}")
        eff = {**route.effective(db), **route.as_dict()}
        if eff["device"] == "cuda" and not torch.cuda.is_available():
            raise BuildError("device cuda requested, but torch sees no CUDA device here")
        current = config.get_config_copy()
        configs: dict[str, object] = {}
        defaults = {k.name: k.default for k in db.knobs}
        for name, text in eff.items():
            if not name.startswith(KNOB_PREFIX):
                continue
            key = name[len(KNOB_PREFIX):]
            if key in OWN_DEFAULTS and key in current:
                configs[key] = parse_value(text, OWN_DEFAULTS[key])
            elif text != defaults.get(name):
                configs[key] = parse_value(text, current.get(key, ...))
        return BuildPlan(device=eff["device"], dtype=eff["dtype"],
                         precision=eff["float32_matmul_precision"], configs=configs)

    def _program(self, model: Path, plan: BuildPlan) -> tuple[ModelSignature, Any, str]:
        """(signature, the exported program to compile, how it was obtained).

        A saved program that already computes in the route's dtype on the route's device and
        returns what its signature says is compiled as saved; anything else is wrapped (see
        :func:`wrap_module`) and exported again."""
        import torch

        compute = getattr(torch, plan.dtype)
        if is_model_reference(model):
            sig = factory_signature(str(model))
            factory, _ = load_factory(str(model))
            inner = factory()
            if not isinstance(inner, torch.nn.Module):
                raise BuildError(f"factory {model} returned {type(inner).__name__}, not an "
                                 "nn.Module")
            module = wrap_module(inner.eval().to(device=plan.device), plan.dtype, sig)
            args = example_inputs(sig, plan.device, factory)
        else:
            ep, raw = load_exported(Path(model))
            sig = signature_from_dict(raw, str(model)) if raw else exported_signature(ep, str(model))
            cast = program_float_dtypes(ep) != {compute}
            if not cast and program_devices(ep) <= {plan.device} and as_declared(ep, sig):
                return sig, ep, "as saved"
            inner = ep.module()
            if cast:
                drop_dtype_asserts(inner)
            module = wrap_module(inner.to(device=plan.device), plan.dtype, sig, cast)
            args = example_inputs(sig, plan.device)
        with torch.no_grad():
            ep = torch.export.export(module, args, dynamic_shapes=dynamic_shapes(sig, varargs=True))
        return sig, ep, "re-exported"

    def build_impl(self, model: Path, route: Route, engine: Path) -> BuildInfo:
        import torch

        plan = self.plan(route)
        with build_cache(), matmul_precision(plan.precision):
            stage = "export"
            try:
                sig, ep, how = self._program(model, plan)
                stage = "compile"
                metadata = {
                    META_PREFIX + "route": route.text(),
                    META_PREFIX + "torch": str(torch.__version__),
                    META_PREFIX + "inputs": json.dumps([t.name for t in sig.inputs]),
                    META_PREFIX + "outputs": json.dumps([t.name for t in sig.outputs]),
                    META_PREFIX + "device": plan.device,
                    META_PREFIX + "dtype": plan.dtype,
                    META_PREFIX + "float32_matmul_precision": plan.precision,
                }
                configs = {**plan.configs, "aot_inductor.metadata": metadata}
                cxx = cxx_runtime.choose()
                if cxx.override and "cpp.cxx" not in configs:
                    # the first g++ on PATH embeds libstdc++: its packages crash on load
                    configs["cpp.cxx"] = (cxx.override,)
                if plan.device == "cuda" and "aot_inductor.embed_kernel_binary" in \
                        torch._inductor.config.get_config_copy():
                    # kernels inside the .so: the package must not need the build's cache
                    configs.setdefault("aot_inductor.embed_kernel_binary", True)
                torch._inductor.aoti_compile_and_package(ep, package_path=str(engine),
                                                         inductor_configs=configs)
            except (BuildError, MemoryError, KeyboardInterrupt):
                raise
            except ModelError as exc:
                raise BuildError(str(exc)) from exc
            except Exception as exc:  # noqa: BLE001 - see NATIVE_BUILD_ERRORS
                raise map_build_error(exc, stage) from exc
        if not engine.is_file():
            raise BuildError("aoti_compile_and_package wrote no package")
        meta = package_metadata(engine)
        facts = {"device": plan.device, "dtype": plan.dtype, "program": how,
                 "float32_matmul_precision": plan.precision, "torch": str(torch.__version__),
                 "cpu_package": str(plan.device == "cpu").lower(),
                 "march_native": str(plan.device == "cpu").lower(),
                 "normalized_digest": normalized_digest(engine)}
        facts.update(cxx_facts(engine, configs.get("cpp.cxx")))
        for key in ("AOTI_DEVICE_KEY", "AOTI_CPU_ISA", "AOTI_COMPUTE_CAPABILITY", "AOTI_PLATFORM",
                    "AOTI_MACHINE"):
            if key in meta:
                facts[key.lower()] = meta[key]
        return BuildInfo(facts)

    def load_impl(self, engine: Path, route: Route) -> Runner:
        """Load as :meth:`production_load` says a deployment should."""
        import torch

        meta = package_metadata(Path(engine))
        if all(META_PREFIX + k in meta for k in ("device", "float32_matmul_precision")):
            # the package says what it is: no knob database (which imports torch._inductor)
            eff = {"cuda_graph": "off", **route.as_dict()}
        else:
            eff = route.effective(self.knob_database())
        device = meta.get("AOTI_DEVICE_KEY") or meta.get(META_PREFIX + "device") or eff["device"]
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise EngineRuntimeError("the package was built for CUDA, and torch sees no CUDA "
                                     "device here")
        try:
            inputs = json.loads(meta[META_PREFIX + "inputs"])
            outputs = json.loads(meta[META_PREFIX + "outputs"])
        except (KeyError, json.JSONDecodeError) as exc:
            raise EngineRuntimeError(f"{engine} was not built by dossier (no tensor names in its "
                                     "metadata)") from exc
        key = META_PREFIX + "float32_matmul_precision"
        precision = meta[key] if key in meta else eff["float32_matmul_precision"]
        graphs = eff.get("cuda_graph") == "on" and device.startswith("cuda")
        link = cxx_runtime.package_linkage(Path(engine))
        if link is not None and link.libstdcxx == cxx_runtime.STATIC \
                and not cxx_runtime.preloaded():
            raise EngineRuntimeError(cxx_runtime.load_hint(Path(engine).name,
                                                           cxx_runtime.system_libstdcxx())
                                     + " (loading it without would crash this process)")
        # a corrupt package, a missing ISA, a driver: native errors, mapped by load()
        compiled = load_package(engine, single_threaded=graphs)
        return TorchInductorRunner(compiled, "cuda" if device.startswith("cuda") else "cpu",
                                   inputs, outputs, precision, cuda_graph=graphs)

    def loader_env_impl(self, engine: Path) -> dict[str, str]:
        """The system libstdc++ preloaded when the package carries its own copy."""
        return cxx_runtime.loader_env(engine)

    def native_message(self, exc: Exception, doing: str) -> str:
        return f"{doing} failed: {short_error(exc)}"

    def policy_rules(self) -> tuple[Rule, ...]:
        from dossier.backends.torch_inductor.policy import RULES

        return tuple(RULES)

    def production_load(self, route: Route, db: KnobDatabase) -> LoadConfig:
        eff = route.effective(db)
        cuda = str(eff.get("device", "")).startswith("cuda")
        if eff.get("cuda_graph") == "on" and cuda:
            config = LoadConfig(
                call="torch._inductor.aoti_load_package(ENGINE, run_single_threaded=True), "
                     "then one CUDA graph per input shape over static buffers",
                options={"run_single_threaded": "True"},
                note="what dossier timed: the package captured in a CUDA graph (warmed up on a "
                     "side stream, captured over static inputs, replayed); each call copies the "
                     "inputs in and the outputs out; capture one graph per input shape",
                snippet=_GRAPH_SNIPPET)
        else:
            config = LoadConfig(
                call="torch._inductor.aoti_load_package(ENGINE)",
                note="the loader call dossier times the package with; run it in the process "
                     "that serves requests",
                snippet="import torch\n\nmodel = torch._inductor.aoti_load_package(ENGINE)")
        sessions = eff.get(SESSIONS_KNOB, "1")
        if sessions == "1":
            return config
        where = " on a CUDA stream of its own (torch.cuda.Stream(); every call inside " \
                "`with torch.cuda.stream(s):`, then s.synchronize())" if cuda else ""
        lines = sessions_lines(int(sessions), "engine instances")
        if where:
            lines.append(f"# each instance{where}")
        return config.model_copy(update={
            "options": {**config.options, SESSIONS_KNOB: sessions},
            "note": f"{config.note}; {sessions} engine instances in parallel, as the scenario "
                    "measured them: each package loaded once per instance" + where,
            "snippet": "\n".join([*lines, config.snippet])})

    def timing_defaults(self, route: Route, db: KnobDatabase) -> dict[str, object]:
        on_gpu = str(route.effective(db).get("device", "cpu")).startswith("cuda")
        return dict(self.GPU_TIMING) if on_gpu else {}

    def engine_facts(self, route: Route, db: KnobDatabase) -> dict[str, bool]:
        device = route.effective(db).get("device", "cpu")
        return {"cpu_package": device == "cpu", "march_native": device == "cpu"}


def _sessions_knob() -> Knob:
    return Knob(name=SESSIONS_KNOB, values=SESSIONS_VALUES, default="1", phase=KnobPhase.LOAD,
                help="engine instances serving queries in parallel, one worker thread each: the "
                     "package loaded once per instance, on CUDA each with its own stream (and, "
                     "with -cuda_graph=on, its own graph) (server and offline scenarios; one "
                     "instance is timed otherwise)")


_GRAPH_SNIPPET = """import torch

model = torch._inductor.aoti_load_package(ENGINE, run_single_threaded=True)
static_in = [x.clone() for x in example_inputs]  # CUDA tensors of one input shape
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        model(*static_in)  # warm up outside the capture
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    static_out = model(*static_in)


def run(*inputs):
    for s, x in zip(static_in, inputs):
        s.copy_(x)
    graph.replay()
    return [o.clone() for o in static_out]"""
"""How to load and call a package shipped with ``-cuda_graph=on`` (what the backend times)."""
