"""The workload suite's architectures: random weights, no download, each at its full size or
tiny (the same architecture with few layers and small widths, so the whole pipeline runs on a
CPU in seconds).

===================  =================================================================  =========
name                 model (package)                                                    input
===================  =================================================================  =========
``resnet50``         ResNet-50, channels-last (torchvision)                             224x224
``bert_base``        BERT-base encoder, 12 layers, 768 wide (transformers)              seq 128
``vit_b16``          ViT-B/16 (torchvision)                                             224x224
``gpt2``             GPT-2 small decoder forward, no cache, last hidden state           seq 128
                     (transformers)
``convnext_t``       ConvNeXt-T, channels-last (torchvision)                            224x224
``whisper_enc``      Whisper-base's encoder: 2 convolutions and 6 transformer layers,   80x3000
                     512 wide, over 30 s of 80 log-mel bins (transformers)
===================  =================================================================  =========

:func:`factory` returns a zero-argument callable in the convention of
``samples/torch_models.py`` (a ``signature`` attribute, integer inputs' ``input_ranges``), so
the spec writer there exports and references it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ARCHS = ("resnet50", "bert_base", "vit_b16", "gpt2", "convnext_t", "whisper_enc")
SEEDS = {name: 3701 + i for i, name in enumerate(ARCHS)}
SEQ = 128
TINY_SEQ = 16
TINY_IMAGE = 32
VOCAB = {"bert_base": 30522, "gpt2": 50257}
TINY_VOCAB = 100
WHISPER_FRAMES = 1500  # encoder positions; the input is twice as long (the second conv strides 2)
TINY_WHISPER_FRAMES = 8


def _resnet50(tiny: bool) -> Any:
    import torch
    import torchvision

    if tiny:
        from torchvision.models.resnet import BasicBlock, ResNet

        model = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10)
    else:
        model = torchvision.models.resnet50(weights=None)
    return model.eval().to(memory_format=torch.channels_last)


def _vit_b16(tiny: bool) -> Any:
    import torch
    import torchvision
    from torchvision.models.vision_transformer import VisionTransformer

    if tiny:
        model = VisionTransformer(image_size=TINY_IMAGE, patch_size=16, num_layers=1, num_heads=2,
                                  hidden_dim=32, mlp_dim=64, num_classes=10)
    else:
        model = torchvision.models.vit_b_16(weights=None)
    # torchvision starts the head at zero (all logits 0, no direction to compare): draw it
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    torch.nn.init.normal_(model.heads.head.bias, std=0.02)
    return model.eval()


def _convnext_t(tiny: bool) -> Any:
    import torch
    import torchvision
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    if tiny:
        model = ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)], num_classes=10)
    else:
        model = torchvision.models.convnext_tiny(weights=None)
    return model.eval().to(memory_format=torch.channels_last)


class _Outputs:
    """A transformers model wrapped to return a dict of the named outputs."""

    @staticmethod
    def wrap(inner: Any, names: tuple[str, ...], takes_mask: bool) -> Any:
        from torch import nn

        class Wrapped(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, *args: Any) -> Any:
                if takes_mask:
                    out = self.inner(input_ids=args[0], attention_mask=args[1], return_dict=True)
                else:
                    out = self.inner(args[0], return_dict=True)
                return {n: getattr(out, n) for n in names}

        return Wrapped().eval()


def _bert_base(tiny: bool) -> Any:
    from transformers import BertConfig, BertModel

    config = (BertConfig(vocab_size=TINY_VOCAB, hidden_size=32, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=64) if tiny else BertConfig())
    return _Outputs.wrap(BertModel(config), ("last_hidden_state", "pooler_output"), True)


def _gpt2(tiny: bool) -> Any:
    from transformers import GPT2Config, GPT2Model

    config = (GPT2Config(vocab_size=TINY_VOCAB, n_positions=64, n_embd=32, n_layer=1, n_head=2,
                         use_cache=False) if tiny else GPT2Config(use_cache=False))
    return _Outputs.wrap(GPT2Model(config), ("last_hidden_state",), False)


def _whisper_enc(tiny: bool) -> Any:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    if tiny:
        config = WhisperConfig(d_model=32, encoder_layers=1, encoder_attention_heads=2,
                               encoder_ffn_dim=64, max_source_positions=TINY_WHISPER_FRAMES)
    else:  # whisper-base's encoder sizes
        config = WhisperConfig(d_model=512, encoder_layers=6, encoder_attention_heads=8,
                               encoder_ffn_dim=2048, max_source_positions=WHISPER_FRAMES)
    return _Outputs.wrap(WhisperEncoder(config), ("last_hidden_state",), False)


BUILDERS: dict[str, Callable[[bool], Any]] = {
    "resnet50": _resnet50, "bert_base": _bert_base, "vit_b16": _vit_b16, "gpt2": _gpt2,
    "convnext_t": _convnext_t, "whisper_enc": _whisper_enc,
}


def signature(arch: str, tiny: bool) -> dict:
    """The model's signature (dynamic batch), in ``samples/torch_models.py``'s convention."""
    image = TINY_IMAGE if tiny else 224
    classes = 10 if tiny else 1000
    seq = TINY_SEQ if tiny else SEQ
    if arch in ("resnet50", "vit_b16", "convnext_t"):
        return {"inputs": {"x": ("float32", ("batch", 3, image, image))},
                "outputs": {"logits": ("float32", ("batch", classes))}}
    if arch == "bert_base":
        width = 32 if tiny else 768
        return {"inputs": {"input_ids": ("int64", ("batch", seq)),
                           "attention_mask": ("int64", ("batch", seq))},
                "outputs": {"last_hidden_state": ("float32", ("batch", seq, width)),
                            "pooler_output": ("float32", ("batch", width))}}
    if arch == "gpt2":
        width = 32 if tiny else 768
        return {"inputs": {"input_ids": ("int64", ("batch", seq))},
                "outputs": {"last_hidden_state": ("float32", ("batch", seq, width))}}
    if arch == "whisper_enc":
        frames, width = (TINY_WHISPER_FRAMES, 32) if tiny else (WHISPER_FRAMES, 512)
        return {"inputs": {"input_features": ("float32", ("batch", 80, 2 * frames))},
                "outputs": {"last_hidden_state": ("float32", ("batch", frames, width))}}
    raise KeyError(arch)


def factory(arch: str, tiny: bool = False) -> Callable[[], Any]:
    """A zero-argument callable building ``arch`` with its fixed seed's random weights, carrying
    ``signature`` and, for token inputs, ``input_ranges``."""
    if arch not in BUILDERS:
        raise KeyError(f"unknown architecture {arch!r} (known: {', '.join(ARCHS)})")

    def build() -> Any:
        import torch

        torch.manual_seed(SEEDS[arch])
        return BUILDERS[arch](tiny)

    build.__name__ = arch + ("_tiny" if tiny else "")
    build.signature = signature(arch, tiny)  # type: ignore[attr-defined]
    if arch in VOCAB:
        ranges = {"input_ids": (0, TINY_VOCAB if tiny else VOCAB[arch])}
        if arch == "bert_base":
            ranges["attention_mask"] = (1, 2)
        build.input_ranges = ranges  # type: ignore[attr-defined]
    return build
