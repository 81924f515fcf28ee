"""Precision routes of the ONNX Runtime backend: knobs that transform the model before the
session is built (int8 quantization through ``onnxruntime.quantization``), and the execution
provider.

A route that quantizes runs ``quant_pre_process`` (unless ``-quant_preprocess=off``), then
``quantize_dynamic`` or ``quantize_static`` (QDQ format) with the route's choices, and the
quantized model is what ONNX Runtime optimizes and saves as the engine: the bundle ships the
transformed model, and the route names every choice that made it. The quantizer's settings,
the calibration set's digest and (static) the activation ranges it computed are written into
the engine's metadata (``dossier.quantization``), so the engine says what it was calibrated on.

What the choices mean on x86 (ONNX Runtime's own guidance, and measurements on this project's
hosts):

- dynamic quantization touches the MatMul family only (MatMul, Attention, LSTM): dynamic
  quantization of a Conv gives ConvInteger, which the CPU provider runs slowly or not at all;
  convolutions take static QDQ;
- static QDQ quantizes every operator the registry knows, with activation ranges calibrated on
  the calibration set (MinMax, Entropy or Percentile);
- activations u8 with weights s8 (U8S8) is the recommended x86 form, S8S8 the API default:
  both are offered; ``reduce_range`` matters only on processors without VNNI;
- float16 is not offered: the CPU provider inserts casts around it and runs it slower than
  float32;
- on OpenVINO's CPU device the precision of the operators left in floating point is a choice of
  its own (``-openvino_precision``): OpenVINO runs them in bfloat16 by default on processors
  with bfloat16 units (AMX, AVX-512 BF16), so dossier pins it, f32 unless the route says bf16,
  offered only on such processors.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dossier.backends.interface import BuildError, first_line
from dossier.backends.onnxruntime import scratch
from dossier.hashing import digest_bytes, digest_file
from dossier.knobs import Knob, KnobPhase

NONE, DYNAMIC, STATIC = "none", "dynamic", "static"
QUANT_KNOBS: tuple[tuple[str, tuple[str, ...], str, str], ...] = (
    ("quantization", (NONE, DYNAMIC, STATIC), NONE,
     "int8 quantization of the model before it is compiled: dynamic (MatMul family, "
     "activation ranges at run time) or static (QDQ, ranges from the calibration set)"),
    ("quant_weight_type", ("s8", "u8"), "s8", "weight type of a quantized route"),
    ("quant_activation_type", ("u8", "s8"), "u8",
     "activation type of a static route (u8: U8S8, x86's recommended form; s8: S8S8)"),
    ("quant_per_channel", ("off", "on"), "off",
     "one scale per output channel of each weight (accuracy) instead of one per tensor"),
    ("quant_reduce_range", ("off", "on"), "off",
     "7-bit weights (for processors without VNNI, where 8-bit products can saturate)"),
    ("quant_calibration", ("minmax", "entropy", "percentile"), "minmax",
     "how a static route computes activation ranges from the calibration set"),
    ("quant_preprocess", ("on", "off"), "on",
     "run onnxruntime.quantization's quant_pre_process (shape inference, graph cleanup) first"),
)
QUANT_SPEC = {k[0]: k for k in QUANT_KNOBS}
STATIC_ONLY = ("quant_activation_type", "quant_calibration")
DYNAMIC_OPS = ["MatMul", "Attention", "LSTM"]
"""What dynamic quantization touches: the MatMul family (a Conv would become ConvInteger)."""
EP_KNOB = "execution_provider"
CPU, OPENVINO = "cpu", "openvino"
OPENVINO_EP = "OpenVINOExecutionProvider"
OV_PRECISION_KNOB = "openvino_precision"
F32, BF16 = "f32", "bf16"
BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
"""The CPU flags of the units OpenVINO runs bfloat16 on (without them it has no bf16 kernels)."""
NO_CPU_FALLBACK = "session.disable_cpu_ep_fallback"
"""The session option that makes a session fail when some node would run on the CPU provider."""
METADATA_KEY = "dossier.quantization"

if TYPE_CHECKING:
    from dossier.datasets import CalibrationSet


def knobs() -> list[Knob]:
    """The quantization knobs (transform phase; every one changes the numbers)."""
    return [Knob(name=n, values=v, default=d, phase=KnobPhase.TRANSFORM, help=h,
                 changes_numerics=True) for n, v, d, h in QUANT_KNOBS]


def inert(values: Mapping[str, str]) -> frozenset[str]:
    """The quantization knobs that have no effect under ``values`` (a route's effective knob
    values): all of them when the route does not quantize, the static-only ones when it
    quantizes dynamically."""
    mode = values.get("quantization", NONE)
    ov = frozenset() if values.get(EP_KNOB) == OPENVINO else frozenset({OV_PRECISION_KNOB})
    if mode == NONE:
        return ov | {n for n in QUANT_SPEC if n != "quantization"}
    if mode == DYNAMIC:
        return ov | frozenset(STATIC_ONLY)
    return ov


def transforms(values: Mapping[str, str]) -> bool:
    """Whether a route with these effective values transforms the model."""
    return values.get("quantization", NONE) != NONE


@contextlib.contextmanager
def _step(what: str) -> Iterator[None]:
    """A failure of the quantizer is the route's failed build, with the quantizer's reason."""
    try:
        yield
    except (BuildError, MemoryError):
        raise
    except Exception as exc:  # the quantizer raises whatever its dependencies raise
        raise BuildError(f"{what}: {type(exc).__name__}: {first_line(exc)}") from exc


def quantize(model: Path, values: Mapping[str, str], calibration: CalibrationSet | None,
             out: Path, shared: Path | None = None) -> dict[str, str]:
    """Write the model quantized as ``values`` say to ``out`` (ONNX); return the build facts.
    BuildError with the quantizer's reason when it fails. ``shared``: a folder where the
    model after ``quant_pre_process`` is kept for the other routes' builds
    (:func:`preprocessed`)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    mode = values["quantization"]
    types = {"s8": QuantType.QInt8, "u8": QuantType.QUInt8}
    on = {k: values.get(k) == "on" for k in ("quant_per_channel", "quant_reduce_range")}
    facts: dict[str, str] = {"quantization": mode,
                             "quant_weight_type": values["quant_weight_type"],
                             "quant_per_channel": values["quant_per_channel"],
                             "quant_reduce_range": values["quant_reduce_range"]}
    with tempfile.TemporaryDirectory(prefix="dossier-quant-", dir=scratch.folder(shared)) as tmp:
        source = model
        if values.get("quant_preprocess", "on") == "on":
            source = preprocessed(model, Path(tmp), shared)
        if mode == DYNAMIC:
            with _step("quantize_dynamic"):
                quantize_dynamic(str(source), str(out), op_types_to_quantize=DYNAMIC_OPS,
                                 per_channel=on["quant_per_channel"],
                                 reduce_range=on["quant_reduce_range"],
                                 weight_type=types[values["quant_weight_type"]])
            ranges = None
        else:
            if calibration is None:
                raise BuildError("-quantization=static needs a calibration set ([calibration] "
                                 "in the release spec)")
            feeds = calibration.feeds()

            class Reader(CalibrationDataReader):  # type: ignore[misc]
                def __init__(self) -> None:
                    self._it = iter(feeds)

                def get_next(self) -> dict[str, Any] | None:
                    return next(self._it, None)

            method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                      "percentile": CalibrationMethod.Percentile}[values["quant_calibration"]]
            cache = Path(tmp) / "ranges.json"
            kw: dict[str, Any] = {}
            key = None
            if "calibration_cache_path" in inspect.signature(quantize_static).parameters:
                kw["calibration_cache_path"] = str(cache)
                key = calibration_key(model, values, calibration)
            # with the ranges of an earlier build of this search (copied here: ONNX Runtime
            # reads its cache file and skips the calibration, or rewrites the file when it
            # recalibrates), or made and kept for the next
            with scratch.one_at_a_time(shared if key else None, "ranges", key or ""):
                got = key is not None and scratch.take(shared, "ranges", key, ".json", cache,
                                                       link=False)
                with _step("quantize_static"):
                    quantize_static(str(source), str(out), Reader(),
                                    quant_format=QuantFormat.QDQ,
                                    per_channel=on["quant_per_channel"],
                                    reduce_range=on["quant_reduce_range"],
                                    activation_type=types[values["quant_activation_type"]],
                                    weight_type=types[values["quant_weight_type"]],
                                    calibrate_method=method, **kw)
                if key and not got and cache.is_file():
                    scratch.keep(cache, shared, "ranges", key, ".json")
            ranges = json.loads(cache.read_text()) if cache.is_file() else None
            facts.update(quant_activation_type=values["quant_activation_type"],
                         quant_calibration=values["quant_calibration"],
                         calibration_samples=str(len(calibration.samples)),
                         calibration_digest=calibration.digest())
            if ranges is not None:
                facts["calibration_ranges"] = str(len(ranges.get("data", ranges)))
                facts["calibration_ranges_digest"] = digest_bytes(
                    json.dumps(ranges, sort_keys=True).encode())
            elif key is None:
                import onnxruntime

                facts["calibration_ranges"] = (f"not recorded: onnxruntime "
                                               f"{onnxruntime.__version__} writes no "
                                               "calibration cache")
        with _step("recording the quantization in the model"):
            _stamp(out, {"facts": facts, "ranges": ranges})
    return facts


PREPROCESS_FAILED = "preprocessfailed"
"""The scratch kind of a failed ``quant_pre_process``: its reason, kept for the other builds."""


def preprocessed(model: Path, tmp: Path, shared: Path | None) -> Path:
    """``model`` after ``quant_pre_process`` (shape inference, graph cleanup): the file kept in
    ``shared`` by an earlier build of this search (:mod:`.scratch`; linked into ``tmp``), else
    made in ``tmp`` and kept there for the next builds. The pre-processing is a function of
    the model and the ONNX Runtime version alone, and it takes seconds (a sympy shape
    inference and an optimizing session; 8.6 s for a BERT-base encoder), once per quantized
    route without this.

    Its failure is kept too: the next quantizing builds of the search fail at once with the
    same reason (:func:`preprocess_failure`), which names the step and what to do. The search
    does not fall back to quantizing the model as it is: that engine is the
    ``-quant_preprocess=off`` route's, and a route names every choice that made its engine;
    the reason says to add that route to the selection."""
    import onnxruntime

    key = digest_bytes(f"quant_pre_process {onnxruntime.__version__} "
                       f"{digest_file(model)[0]}".encode())
    made = tmp / "preprocessed.onnx"
    with scratch.one_at_a_time(shared, "preprocessed", key):
        if scratch.take(shared, "preprocessed", key, ".onnx", made):
            return made
        said = tmp / "preprocess-failed.txt"
        if scratch.take(shared, PREPROCESS_FAILED, key, ".txt", said, link=False):
            with contextlib.suppress(OSError, UnicodeDecodeError):
                reason = said.read_bytes()[:2000].decode("utf-8").splitlines()[0]
                raise BuildError(f"{reason} (the pre-processing failed in an earlier build of "
                                 "this search, not run again)")
        from onnxruntime.quantization.shape_inference import quant_pre_process

        try:
            quant_pre_process(str(model), str(made))
        except (BuildError, MemoryError):
            raise
        except Exception as exc:  # whatever ONNX Runtime's shape inference raises
            reason = preprocess_failure(exc)
            said.write_text(reason + "\n", encoding="utf-8")
            scratch.keep(said, shared, PREPROCESS_FAILED, key, ".txt")
            raise BuildError(reason) from exc
        scratch.keep(made, shared, "preprocessed", key, ".onnx")
        return made


def preprocess_failure(exc: BaseException) -> str:
    """One line for a failed ``quant_pre_process``: the step, where it failed (ONNX Runtime's
    symbolic shape inference raises a bare AssertionError, whose message is empty) and what to
    do."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = (f" in {frames[-1].name} ({Path(frames[-1].filename).name} line "
             f"{frames[-1].lineno})" if frames else "")
    message = str(exc).strip().splitlines()
    said = f"{type(exc).__name__}{where}" + (f": {message[0]}" if message else "")
    return (f"quant_pre_process (ONNX Runtime's shape inference and graph cleanup before "
            f"quantizing) failed: {said}; the model may quantize without it: add "
            "-quant_preprocess=off to the selection (-quant_preprocess=[on|off] tries both)")


def calibration_key(model: Path, values: Mapping[str, str], calibration: CalibrationSet) -> str:
    """What a static route's activation ranges are a function of: the model, the calibration
    set, the ONNX Runtime version and every quantization choice but the per-channel one (which
    only concerns weights), so the per-tensor and per-channel routes calibrate once."""
    import onnxruntime

    choices = {k: v for k, v in sorted(values.items())
               if k in QUANT_SPEC and k != "quant_per_channel"}
    return digest_bytes(json.dumps([onnxruntime.__version__, digest_file(model)[0],
                                    calibration.digest(), choices]).encode())


def _stamp(path: Path, record: Mapping[str, object]) -> None:
    """Write ``record`` into the model's metadata (ONNX Runtime keeps it in the saved engine)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    prop = m.metadata_props.add()
    prop.key, prop.value = METADATA_KEY, json.dumps(record, sort_keys=True)
    onnx.save(m, str(path))


def engine_record(session: Any) -> dict[str, Any] | None:
    """What a quantized engine says of its quantization (None for one that does not)."""
    text = session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
    if text is None:
        return None
    data = json.loads(text)
    return data if isinstance(data, dict) else None


# ------------------------------------------------------------------------- execution provider
@dataclass(frozen=True)
class OpenVino:
    """Where OpenVINO's CPU device comes from on this host: ONNX Runtime's own build with the
    provider in it (Intel's ``onnxruntime-openvino``, installed in place of ``onnxruntime``),
    or the ``onnxruntime-ep-openvino`` plug-in's devices (``devices``)."""

    source: str
    """What provides it, with its version: recorded in the engine's build facts."""
    devices: tuple[Any, ...] = ()
    """The plug-in's CPU devices (empty: the provider is built in)."""


def openvino() -> tuple[OpenVino | None, str | None]:
    """How a session reaches OpenVINO's CPU device here, and why it cannot (None when it can).
    The plug-in once registered (ONNX Runtime then lists its provider as available too); else a
    provider built into ONNX Runtime; else the plug-in, registered here, whose factory offers
    Intel processors only (it skips a device whose vendor is not Intel's)."""
    import onnxruntime as ort

    registered = _plugin_devices(ort) if hasattr(ort, "get_ep_devices") else ()
    if registered:
        return OpenVino(f"plug-in {_distribution('onnxruntime-ep-openvino')}", registered), None
    if OPENVINO_EP in ort.get_available_providers():
        return OpenVino(f"onnxruntime {ort.__version__} with {OPENVINO_EP} built in "
                        f"({_distribution('onnxruntime-openvino')})"), None
    if importlib.util.find_spec("onnxruntime_ep_openvino") is None:
        return None, ("neither the OpenVINO plug-in (pip install onnxruntime-ep-openvino) nor "
                      "an onnxruntime with OpenVINO built in (onnxruntime-openvino) is installed")
    if not hasattr(ort, "register_execution_provider_library"):
        return None, f"onnxruntime {ort.__version__} cannot load execution provider plug-ins"
    import onnxruntime_ep_openvino as plugin

    try:
        if not any(d.ep_name == OPENVINO_EP for d in ort.get_ep_devices()):
            ort.register_execution_provider_library(OPENVINO_EP, plugin.get_library_path())
    except Exception as exc:  # the plug-in's native load failed
        return None, f"the OpenVINO plug-in did not load: {first_line(exc)}"
    devices = _plugin_devices(ort)
    if not devices:
        vendors = sorted({d.device.vendor for d in ort.get_ep_devices()})
        return None, ("the OpenVINO plug-in loaded but offers no CPU device on this host "
                      f"(CPU vendor: {', '.join(vendors) or 'unknown'}; the plug-in offers "
                      "Intel processors only, onnxruntime-openvino in place of onnxruntime "
                      "runs OpenVINO on others)")
    return OpenVino(f"plug-in {_distribution('onnxruntime-ep-openvino')}", devices), None


def _plugin_devices(ort: Any) -> tuple[Any, ...]:
    """The OpenVINO plug-in's CPU devices registered in this process (a plug-in's devices name
    the library they come from)."""
    return tuple(d for d in ort.get_ep_devices() if d.ep_name == OPENVINO_EP
                 and d.ep_metadata.get("ov_device") == "CPU" and "library_path" in d.ep_metadata)


def openvino_options(ov: OpenVino, ov_precision: str) -> dict[str, str]:
    """The provider options of a session on OpenVINO's CPU device in ``ov_precision`` (f32 or
    bf16): OpenVINO's ``INFERENCE_PRECISION_HINT`` through ``load_config``, which both the
    plug-in and the built-in provider read (the plug-in ignores the older ``precision``
    option, and OpenVINO's own default is bf16 on processors with bfloat16 units)."""
    config = json.dumps({"CPU": {"INFERENCE_PRECISION_HINT": ov_precision}})
    return {"load_config": config} if ov.devices else {"device_type": "CPU", "load_config": config}


def bf16_units() -> str | None:
    """Why this CPU cannot run OpenVINO's bf16 (None when it reports bfloat16 units)."""
    from dossier.fingerprint import collect_cpu

    flags = set(collect_cpu().isa_flags)
    if flags & BF16_FLAGS:
        return None
    return ("this CPU reports no bfloat16 units (" + " or ".join(sorted(BF16_FLAGS)) +
            "): OpenVINO would run the route in f32")


def _distribution(name: str) -> str:
    try:
        return f"{name} {metadata.version(name)}"
    except metadata.PackageNotFoundError:
        return f"{name}: version unknown"


def provider_problem(session: Any, wanted: str) -> str | None:
    """Why ``session`` is not the route it names (None when it runs on ``wanted`` first):
    ONNX Runtime falls back to the CPU provider with only a warning, and a route measured there
    would be the CPU route under another name."""
    got = list(session.get_providers())
    if got and got[0] == wanted:
        return None
    return (f"the session fell back to {', '.join(got) or 'no provider'} instead of {wanted}: "
            "the route is not what it names")
