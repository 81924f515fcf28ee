"""TensorRT's knob database: the ``IBuilderConfig.all_build_routes`` JSON of the global
performance tuner, parsed without TensorRT (``trtexec --helpBuildRoute`` prints the same JSON)."""

from __future__ import annotations

import json
import re

from dossier.errors import BackendUnavailableError, InputError
from dossier.knobs import Knob, KnobDatabase

_NAME = re.compile(r"^[^=\s\[\]|]+$")
"""What a knob name may be: anything a route token ``-name=value`` can carry."""


class KnobJsonError(InputError):
    """The TensorRT knob database JSON (``all_build_routes``) is malformed."""

    hint = ("the knob database is the JSON TensorRT returns from IBuilderConfig.all_build_routes "
            "(trtexec --helpBuildRoute prints it); pass it unchanged")



# --------------------------------------------------------------------------------------------
# Knob database


def parse_knob_json(text: str) -> KnobDatabase:
    """Parse TensorRT's ``all_build_routes`` JSON into a knob database.

    Each ``tuner_options`` entry has ``option`` (``-name``, namespaces kept: ``-kgen:tiling``),
    ``allowed_values`` (``-name=[a|b]`` is bounded; ``-name=int32_t``, or ``...`` inside the
    brackets, is unbounded: such a knob can be pinned, not swept), ``default_value`` and
    ``help``. ``help`` may be missing (it is descriptive only); unknown extra fields are ignored
    so a newer TensorRT's JSON still reads. Knob names are stored without the leading '-'.

    Raises:
        BackendUnavailableError: ``text`` is empty: TensorRT returns an empty string where the
            tuner is disabled (TensorRT-RTX, Windows).
        KnobJsonError: malformed JSON, a missing or mistyped field, ``allowed_values`` naming
            another knob, a default outside a bounded list, a duplicate knob or value.
    """
    if not text.strip():
        raise BackendUnavailableError(
            "TensorRT's global performance tuner is not available on this platform: "
            "IBuilderConfig.all_build_routes is empty, as on TensorRT-RTX, on Windows and in a "
            "TensorRT built without the tuner",
            hint="build routes exist only in enterprise TensorRT >= 11.1 on Linux, not in "
                 "TensorRT-RTX or on Windows")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise KnobJsonError(f"the TensorRT knob database is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise KnobJsonError("the TensorRT knob database is not a JSON object")
    tuner_version = data.get("tuner_version")
    if not isinstance(tuner_version, str) or not tuner_version:
        raise KnobJsonError("the TensorRT knob database has no tuner_version string")
    options = data.get("tuner_options")
    if not isinstance(options, list):
        raise KnobJsonError("the TensorRT knob database has no tuner_options list")
    knobs: list[Knob] = []
    seen: set[str] = set()
    for i, entry in enumerate(options):
        knob = _parse_option(entry, f"tuner_options[{i}]")
        if knob.name in seen:
            raise KnobJsonError(f"tuner_options[{i}]: knob -{knob.name} is listed twice")
        seen.add(knob.name)
        knobs.append(knob)
    return KnobDatabase(backend="tensorrt", tuner_version=tuner_version, knobs=tuple(knobs))


def _parse_option(entry: object, where: str) -> Knob:
    if not isinstance(entry, dict):
        raise KnobJsonError(f"{where} is not a JSON object")
    fields: dict[str, str] = {}
    for key in ("option", "allowed_values", "default_value"):
        value = entry.get(key)
        if value is None:
            raise KnobJsonError(f"{where} has no {key!r}")
        if not isinstance(value, str):
            raise KnobJsonError(f"{where}: {key!r} is not a string")
        fields[key] = value
    help_text = entry.get("help", "")
    if not isinstance(help_text, str):
        raise KnobJsonError(f"{where}: 'help' is not a string")
    option = fields["option"]
    name = option[1:] if option.startswith("-") else option
    if not _NAME.match(name):
        raise KnobJsonError(f"{where}: option {option!r} is not a usable knob name")
    where = f"{where} (-{name})"
    allowed = fields["allowed_values"]
    bare = allowed[1:] if allowed.startswith("-") else allowed
    named, eq, spec = bare.partition("=")
    if not eq:
        raise KnobJsonError(f"{where}: allowed_values {allowed!r} is not of the form "
                            f"-{name}=[a|b] or -{name}=<type>")
    if named != name:
        raise KnobJsonError(f"{where}: allowed_values {allowed!r} names knob -{named}, "
                            f"not -{name}")
    default = fields["default_value"]
    values: tuple[str, ...] | None
    hint: str | None = None
    if spec.startswith("[") or spec.endswith("]"):
        if not (spec.startswith("[") and spec.endswith("]")) or len(spec) < 2:
            raise KnobJsonError(f"{where}: allowed_values {allowed!r} has unbalanced brackets")
        items = spec[1:-1].split("|")
        if any(not v or not _NAME.match(v) for v in items):
            raise KnobJsonError(f"{where}: allowed_values {allowed!r} has an empty or "
                                "unusable value")
        dupes = sorted({v for v in items if items.count(v) > 1})
        if dupes:
            raise KnobJsonError(f"{where}: value {dupes[0]!r} is listed twice in {allowed!r}")
        if any("..." in v for v in items):  # an open-ended list: examples, not the allowed set
            values, hint = None, spec
        else:
            values = tuple(items)
            if default not in values:
                raise KnobJsonError(f"{where}: default_value {default!r} is not one of the "
                                    f"allowed values {allowed!r}")
    else:
        if not spec or any(c.isspace() for c in spec):
            raise KnobJsonError(f"{where}: allowed_values {allowed!r} names no value type")
        values, hint = None, spec
    return Knob(name=name, values=values, default=default, help=help_text, value_hint=hint)


