"""What a model takes and returns: :class:`TensorSpec` and :class:`ModelSignature`, read
from the model by its backend (:meth:`~dossier.backends.interface.Backend.signature`) and checked
against validation sets and feeds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dossier.errors import (
    SpecError,
    ValidationSetError,
)


@dataclass(frozen=True)
class TensorSpec:
    """Name, element type and shape of a model input or output (None or a name = dynamic)."""

    name: str
    dtype: str
    shape: tuple[int | str | None, ...]

    def fits(self, shape: tuple[int, ...], bound: dict[str, int] | None = None) -> str | None:
        """None when ``shape`` has the spec's rank and static dims; else what does not fit.

        A named dynamic dim (``N``) takes the value it has in the first tensor that names it;
        ``bound`` carries those values across the tensors of one pair or shape entry."""
        shape = tuple(int(d) for d in shape)
        if len(shape) != len(self.shape):
            return f"rank {len(shape)} (shape {shape}), model expects {self.shape}"
        for got, want in zip(shape, self.shape):
            if isinstance(want, int) and got != want:
                return f"shape {shape}, model expects {self.shape}"
            if isinstance(want, str) and bound is not None:
                if bound.setdefault(want, got) != got:
                    return (f"shape {shape}, but dim {want!r} is {bound[want]} in another "
                            f"tensor of the same pair (model: {self.shape})")
        return None

    def accepts(self, array: np.ndarray, bound: dict[str, int] | None = None) -> str | None:
        """None when ``array`` fits as an input; else what does not fit."""
        if str(array.dtype) != self.dtype:
            return f"dtype {array.dtype}, model expects {self.dtype}"
        return self.fits(tuple(array.shape), bound)

    def accepts_reference(self, array: np.ndarray,
                          bound: dict[str, int] | None = None) -> str | None:
        """None when ``array`` can serve as this output's reference; else what does not fit.

        A floating-point output's reference must be floating point and at least as precise
        (a float16 reference cannot check a float32 output); any other output's reference has
        the output's dtype."""
        problem = _reference_dtype(str(array.dtype), self.dtype)
        return problem or self.fits(tuple(array.shape), bound)


_FLOAT_BITS = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}


def _reference_dtype(ref: str, out: str) -> str | None:
    if out in _FLOAT_BITS:
        if ref not in _FLOAT_BITS:
            return f"dtype {ref}, model output is {out}: a reference must be floating point"
        if _FLOAT_BITS[ref] < _FLOAT_BITS[out] or (ref == "float16" and out == "bfloat16"):
            return (f"dtype {ref}, less precise than the model output's {out}: a reference "
                    "must be at least as precise as the output it checks (compute it in "
                    f"{out} or float64)")
        return None
    return None if ref == out else f"dtype {ref}, model output is {out}"


@dataclass(frozen=True)
class ModelSignature:
    """The inputs and outputs of a model."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def check_pair(self, pair_name: str, inputs: Mapping[str, np.ndarray],
                   references: Mapping[str, np.ndarray]) -> None:
        """Raise ValidationSetError when a pair's names, dtypes or shapes do not fit the model.

        Every input of the model and a reference for every output must be present: an output
        without a reference would never be compared."""
        want_out = {t.name: t for t in self.outputs}
        bound = self.check_inputs(pair_name, inputs)
        _same_names(f"{pair_name}: references", references, want_out, "outputs",
                    why="every output is compared, so every pair needs a reference for each")
        for name, arr in references.items():
            problem = want_out[name].accepts_reference(arr, bound)
            if problem:
                raise ValidationSetError(f"{pair_name}: reference {name!r} has {problem}")

    def check_inputs(self, pair_name: str, inputs: Mapping[str, np.ndarray]) -> dict[str, int]:
        """Raise ValidationSetError when a pair's inputs do not fit the model; return the
        values the model's named dynamic dims take in them."""
        want_in = {t.name: t for t in self.inputs}
        _same_names(f"{pair_name}: inputs", inputs, want_in, "inputs")
        bound: dict[str, int] = {}
        for name, arr in inputs.items():
            problem = want_in[name].accepts(arr, bound)
            if problem:
                raise ValidationSetError(f"{pair_name}: input {name!r} has {problem}")
        return bound

    def check_shape_entry(self, where: str, shapes: Mapping[str, Sequence[int]]) -> None:
        """Raise SpecError when a ``[[shapes]]`` entry does not name every input of the model
        with a shape it accepts (rank, static dims, one value per named dynamic dim)."""
        want_in = {t.name: t for t in self.inputs}
        try:
            _same_names(f"{where}: inputs", shapes, want_in, "inputs")
        except ValidationSetError as exc:
            raise SpecError(str(exc)) from None
        bound: dict[str, int] = {}
        for name, dims in shapes.items():
            if any(int(d) < 1 for d in dims):
                raise SpecError(f"{where}: input {name!r} has shape {tuple(dims)}: every "
                                "dimension must be at least 1")
            problem = want_in[name].fits(tuple(dims), bound)
            if problem:
                raise SpecError(f"{where}: input {name!r} has {problem}")


def _same_names(where: str, got: Mapping[str, object], want: Mapping[str, TensorSpec],
                kind: str, why: str = "") -> None:
    missing, unknown = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    names = ", ".join(map(repr, sorted(want)))
    if missing:
        raise ValidationSetError(f"{where} lack {', '.join(map(repr, missing))} of the model's "
                                 f"{kind} ({names})" + (f"; {why}" if why else ""))
    if unknown:
        raise ValidationSetError(f"{where} name {', '.join(map(repr, unknown))}, not among the "
                                 f"model's {kind} ({names})")

