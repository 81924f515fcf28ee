"""PyTorch sample models for the ``torch-inductor`` backend, and the GPU benchmark models.

Every factory here is a zero-argument callable returning an ``nn.Module`` in eval mode with
fixed-seed random weights, and carries a ``signature`` attribute in the convention of
:mod:`dossier.backends.torch_inductor` (``{"inputs": {name: (dtype, shape)}, "outputs": ...}``,
a string dimension is dynamic). Integer inputs carry their value range in ``input_ranges``.

=================  ===============================================================================
``tiny_mlp``       ``x[batch,64]`` -> Linear 256 -> GELU -> Linear 256 -> GELU -> Linear 16 -> ``y``
``tiny_convnet``   ``x[batch,3,32,32]`` -> 2 x (Conv3x3 + BatchNorm + ReLU, MaxPool 2) -> mean ->
                   Linear 10 -> ``logits``
``resnet50``       torchvision ResNet-50, random weights, channels-last (GPU benchmark; needs
                   torchvision)
``bert_base``      transformers ``BertModel`` of ``BertConfig()`` sizes (12 layers, 768 wide),
                   random weights, sequence 128, no download (GPU benchmark; needs transformers)
=================  ===============================================================================

Run ``python samples/torch_models.py [--out DIR]`` to write the ``torch-mlp`` sample:
``DIR/torch-mlp/model.pt2`` (the exported program, ``torch.export.save``), ``validation/`` and
``release.toml``. The references of the validation pairs are computed by PyTorch eager in
float64 on the CPU (``model.double()``), not by the engine under test.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from dossier.tensors import write_tensors  # noqa: E402

TINY_MLP_SEED = 2701
TINY_CONVNET_SEED = 2702
RESNET50_SEED = 2703
BERT_SEED = 2704
PAIR_BATCHES = (1, 4, 8)
PROVENANCE_METHOD = "PyTorch eager in float64 on the CPU (model.double()), samples/torch_models.py"

TORCH_MLP_TOML = """\
[release]
name = "torch-mlp"
version = 1
description = "Tiny MLP (Linear-GELU-Linear-GELU-Linear), exported with torch.export, dynamic batch"

[model]
path = "model.pt2"

[validation]
path = "validation"

[tune]
backend = "torch-inductor"
strategy = "fast"
selection = "-device=cpu -inductor:freezing=[false|true] -float32_matmul_precision=[highest|medium]"
metric = "linf"
threshold = 1e-4

[[shapes]]
weight = 0.2
inputs = { x = [1, 64] }

[[shapes]]
weight = 0.5
inputs = { x = [4, 64] }

[[shapes]]
weight = 0.3
inputs = { x = [8, 64] }
"""


# ---------------------------------------------------------------------------------- factories
def tiny_mlp() -> Any:
    """A three-layer MLP with exact (erf) GELU."""
    import torch
    from torch import nn

    torch.manual_seed(TINY_MLP_SEED)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                         nn.Linear(256, 16)).eval()


tiny_mlp.signature = {  # type: ignore[attr-defined]
    "inputs": {"x": ("float32", ("batch", 64))},
    "outputs": {"y": ("float32", ("batch", 16))},
}


def tiny_convnet() -> Any:
    """Two conv blocks with BatchNorm (non-trivial running statistics) and a linear head."""
    import torch
    from torch import nn

    class ConvNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
            self.head = nn.Linear(32, 10)

        def forward(self, x: Any) -> Any:
            return self.head(self.features(x).mean(dim=(2, 3)))

    torch.manual_seed(TINY_CONVNET_SEED)
    model = ConvNet()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0.0, 0.2)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
    return model.eval()


tiny_convnet.signature = {  # type: ignore[attr-defined]
    "inputs": {"x": ("float32", ("batch", 3, 32, 32))},
    "outputs": {"logits": ("float32", ("batch", 10))},
}


def resnet50() -> Any:
    """torchvision ResNet-50 with random weights, in channels-last memory format."""
    import torch
    import torchvision

    torch.manual_seed(RESNET50_SEED)
    model = torchvision.models.resnet50(weights=None).eval()
    return model.to(memory_format=torch.channels_last)


resnet50.signature = {  # type: ignore[attr-defined]
    "inputs": {"x": ("float32", ("batch", 3, 224, 224))},
    "outputs": {"logits": ("float32", ("batch", 1000))},
}

BERT_SEQ = 128


def bert_base() -> Any:
    """transformers BertModel with bert-base sizes and random weights (no download); returns
    ``last_hidden_state`` and ``pooler_output``."""
    import torch
    from torch import nn
    from transformers import BertConfig, BertModel

    class Bert(nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.bert = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
            return {"last_hidden_state": out.last_hidden_state,
                    "pooler_output": out.pooler_output}

    torch.manual_seed(BERT_SEED)
    return Bert(BertModel(BertConfig())).eval()


bert_base.signature = {  # type: ignore[attr-defined]
    "inputs": {"input_ids": ("int64", ("batch", BERT_SEQ)),
               "attention_mask": ("int64", ("batch", BERT_SEQ))},
    "outputs": {"last_hidden_state": ("float32", ("batch", BERT_SEQ, 768)),
                "pooler_output": ("float32", ("batch", 768))},
}
bert_base.input_ranges = {"input_ids": (0, 30522), "attention_mask": (1, 2)}  # type: ignore[attr-defined]

FACTORIES: dict[str, Callable[[], Any]] = {
    "tiny_mlp": tiny_mlp, "tiny_convnet": tiny_convnet, "resnet50": resnet50,
    "bert_base": bert_base,
}


# ---------------------------------------------------------------------------------- helpers
def fixed_signature(signature: dict, batch: int) -> dict:
    """``signature`` with every string (dynamic) dimension set to ``batch``."""
    return {kind: {name: (dtype, tuple(batch if isinstance(d, str) else d for d in shape))
                   for name, (dtype, shape) in table.items()}
            for kind, table in signature.items()}


def make_inputs(factory: Callable[[], Any], batch: int, rng: np.random.Generator,
                signature: dict | None = None) -> dict[str, np.ndarray]:
    """Random inputs for ``factory`` at ``batch``: standard normal floats, integers uniform in
    the factory's ``input_ranges`` (default [0, 2))."""
    sig = signature or factory.signature  # type: ignore[attr-defined]
    ranges = getattr(factory, "input_ranges", {})
    out = {}
    for name, (dtype, shape) in sig["inputs"].items():
        dims = [batch if isinstance(d, str) or d is None else d for d in shape]
        if np.issubdtype(np.dtype(dtype), np.floating):
            out[name] = rng.standard_normal(dims).astype(dtype)
        else:
            low, high = ranges.get(name, (0, 2))
            out[name] = rng.integers(low, high, size=dims).astype(dtype)
    return out


def float64_reference(model: Any, inputs: dict[str, np.ndarray], signature: dict,
                      device: str = "cpu") -> dict[str, np.ndarray]:
    """Eager PyTorch in float64 (``model.double()``): the outputs, cast to their signature
    dtypes. Runs on ``device`` (``cuda`` runs float64 kernels on the GPU)."""
    import torch

    m = model.to(device=device, dtype=torch.float64)
    args = []
    for name in signature["inputs"]:
        t = torch.from_numpy(inputs[name])
        args.append((t.double() if t.is_floating_point() else t).to(device))
    with torch.no_grad():
        out = m(*args)
    names = list(signature["outputs"])
    if isinstance(out, dict):
        flat = [out[n] for n in names]
    elif isinstance(out, (tuple, list)):
        flat = list(out)
    else:
        flat = [out]
    return {n: t.detach().cpu().numpy().astype(signature["outputs"][n][0])
            for n, t in zip(names, flat)}


def write_validation_set(factory: Callable[[], Any], folder: Path, batches: Sequence[int],
                         seed: int, *, signature: dict | None = None, device: str = "cpu",
                         extra: dict | None = None) -> Path:
    """Write ``folder/pair-NNN/{inputs,references}.arrow`` (one pair per batch size) and
    ``provenance.json``; references from :func:`float64_reference` of a fresh ``factory()``."""
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sig = signature or factory.signature  # type: ignore[attr-defined]
    rng = np.random.default_rng(seed)
    model = factory()
    pairs = []
    for i, batch in enumerate(batches):
        pair = folder / f"pair-{i:03d}"
        pair.mkdir(exist_ok=True)
        inputs = make_inputs(factory, batch, rng, sig)
        refs = float64_reference(model, inputs, sig, device)
        for name, ref in refs.items():
            if not np.all(np.isfinite(ref)):
                raise RuntimeError(f"{pair.name}: reference {name!r} is not finite")
        write_tensors(pair / "inputs.arrow", inputs)
        write_tensors(pair / "references.arrow", refs)
        pairs.append({"name": pair.name, "batch": batch})
    provenance = {"method": PROVENANCE_METHOD.replace("on the CPU", f"on {device}"),
                  "torch": torch.__version__, "factory": getattr(factory, "__name__", "?"),
                  "seed": seed, "pairs": pairs, **(extra or {})}
    (folder / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n",
                                            encoding="utf-8")
    return folder


def export_factory(factory: Callable[[], Any], path: Path, *, signature: dict | None = None,
                   dtype: str | None = None, device: str = "cpu") -> Path:
    """``torch.export`` a factory's module and save it with its signature (dynamic dimensions
    as the signature says). With ``dtype``, the saved program computes in that dtype behind the
    signature's interface (see :func:`dossier.backends.torch_inductor.wrap_module`)."""
    import torch

    from dossier.backends.torch_inductor.model import (
        dynamic_shapes,
        example_inputs,
        save_exported,
        signature_from_dict,
        wrap_module,
    )

    sig_dict = signature or factory.signature  # type: ignore[attr-defined]
    sig = signature_from_dict(sig_dict, getattr(factory, "__name__", "factory"))
    model = factory().to(device)
    if dtype is not None:
        model = wrap_module(model, dtype, sig)
    args = example_inputs(sig, device)
    with torch.no_grad():
        ep = torch.export.export(model, args,
                                dynamic_shapes=dynamic_shapes(sig, varargs=dtype is not None))
    save_exported(ep, Path(path), sig)
    return Path(path)


def build_torch_mlp(out_dir: Path) -> Path:
    """Write the ``torch-mlp`` sample under ``out_dir/torch-mlp``; return its ``release.toml``."""
    folder = Path(out_dir) / "torch-mlp"
    folder.mkdir(parents=True, exist_ok=True)
    export_factory(tiny_mlp, folder / "model.pt2")
    write_validation_set(tiny_mlp, folder / "validation", PAIR_BATCHES, TINY_MLP_SEED)
    spec = folder / "release.toml"
    spec.write_text(TORCH_MLP_TOML, encoding="utf-8")
    return spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="folder to write the sample into (default: %(default)s)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    spec = build_torch_mlp(args.out)
    print(spec)
    print(f"built torch-mlp in {time.perf_counter() - start:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
