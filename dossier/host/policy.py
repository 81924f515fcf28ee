"""Verify verdicts: compare the tuning host's fingerprint with this host's, field by field.

A :class:`Policy` is an ordered list of :class:`Rule` objects; the first rule whose pattern matches
a changed field decides its :class:`Verdict`. Patterns are fnmatch-style over the paths of
:func:`dossier.fingerprint.flatten` (``*`` and ``?`` are wildcards; brackets are literal, so
``gpu[*].name`` matches ``gpu[0].name``). A rule may depend on a boolean engine fact (``when``):

* ``layout_optimized`` (onnxruntime): the model was optimized at the layout/all level.
* ``openvino`` (onnxruntime): the route runs on OpenVINO's CPU device.
* ``cpu_package`` (torch-inductor): the .pt2 package was compiled for the CPU.
* ``version_compatible`` / ``hardware_compatible`` (tensorrt): the plan's compatibility flags.
* ``tuning_host_unknown``: the bundle does not know its tuning host (a trtexec import); every
  changed field is then SUBOPTIMAL: "cannot be compared", never VALID.
* ``bundle_has_gpu``, ``host_has_gpu``, ``gpu_lost`` (bundle had a GPU, host has none): derived
  by :func:`diff` from the two fingerprints; facts passed by the caller take precedence.

A missing fact counts as false. The defaults follow DESIGN.md "Verify verdicts": each backend's
policy (:meth:`dossier.backends.Backend.default_policy`) is :func:`common_rules`, the rules its
package contributes (``dossier/backends/<name>/policy.py``, built from :func:`rule` and the shared
families here) and :func:`tail_rules`; a TOML file read by :func:`load_policy` puts its rules in
front of them.
"""

from __future__ import annotations

import enum
import functools
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dossier.errors import ExitCode, SpecError
from dossier.files import read_small
from dossier.fingerprint import Fingerprint, flatten

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

IGNORED_FIELDS = frozenset({"collected_at", "fingerprint_version"})
"""Fields that differ between any two collections and mean nothing; :func:`diff` skips them."""


class Verdict(str, enum.Enum):
    """Whether a bundle's engine may be used on a host; ordered VALID < SUBOPTIMAL < INVALID."""

    VALID = "VALID"
    """The engine is fit for this host."""
    SUBOPTIMAL = "SUBOPTIMAL"
    """The engine loads here, but its tuning may no longer be the fastest: re-measure."""
    INVALID = "INVALID"
    """The engine must not be used here: rebuild or re-tune."""

    @property
    def severity(self) -> int:
        """0, 1, 2 for VALID, SUBOPTIMAL, INVALID."""
        return list(Verdict).index(self)

    @property
    def exit_code(self) -> ExitCode:
        """The ``dossier verify`` exit code for this verdict."""
        return {"VALID": ExitCode.OK, "SUBOPTIMAL": ExitCode.SUBOPTIMAL,
                "INVALID": ExitCode.INVALID}[self.value]


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The most severe verdict. An empty input is a caller bug (nothing was checked), not VALID."""
    items = list(verdicts)
    if not items:
        raise ValueError("worst() of no verdicts: nothing was compared, which is not VALID")
    return max(items, key=lambda v: v.severity)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _upper(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


class Finding(_Model):
    """The verdict on one compared field."""

    field: str
    """Flattened field path, e.g. "gpu[0].compute_capability"."""
    bundle_value: str | None
    """Value on the tuning host (None: absent there)."""
    host_value: str | None
    """Value on this host (None: absent here)."""
    verdict: Verdict
    """What the change means for the engine."""
    reason: str
    """Why, in one sentence."""

    @property
    def changed(self) -> bool:
        """Whether the two values differ."""
        return self.bundle_value != self.host_value


class Rule(_Model):
    """How to judge a change of the fields matching :attr:`pattern`."""

    pattern: str = Field(min_length=1)
    """fnmatch-style field pattern; ``*``/``?`` are wildcards, brackets are literal."""
    verdict: Verdict
    """Verdict on change (when :attr:`when` is unset or the fact is true)."""
    reason: str = Field(min_length=1)
    """Why, in one sentence a deployment engineer understands."""
    when: str | None = Field(default=None, min_length=1)
    """Name of a boolean engine fact the rule depends on."""
    otherwise: Verdict | None = None
    """Verdict when the :attr:`when` fact is false; unset: the rule does not apply then."""
    otherwise_reason: str | None = Field(default=None, min_length=1)
    """Reason for :attr:`otherwise`; defaults to :attr:`reason`."""

    _verdicts = field_validator("verdict", "otherwise", mode="before")(_upper)

    @model_validator(mode="after")
    def _otherwise_needs_when(self) -> Rule:
        if self.when is None and (self.otherwise is not None or self.otherwise_reason is not None):
            raise ValueError("'otherwise' needs 'when'")
        return self

    def matches(self, field: str) -> bool:
        """Whether :attr:`pattern` matches the field path."""
        return _glob(self.pattern).fullmatch(field) is not None

    def decide(self, facts: Mapping[str, bool]) -> tuple[Verdict, str] | None:
        """Verdict and reason given the facts, or None when the rule does not apply."""
        if self.when is None or facts.get(self.when, False):
            return self.verdict, self.reason
        if self.otherwise is None:
            return None
        return self.otherwise, self.otherwise_reason or self.reason


class Policy(_Model):
    """Ordered rules (first match wins) and a default for changed fields no rule names."""

    rules: tuple[Rule, ...] = ()
    """Rules, tried in order."""
    default: Verdict = Verdict.VALID
    """Verdict for a changed field that no rule decides."""

    _default = field_validator("default", mode="before")(_upper)

    def evaluate(self, field: str, facts: Mapping[str, bool]) -> tuple[Verdict, str]:
        """Verdict and reason for a change of ``field``."""
        for rule in self.rules:
            if rule.matches(field) and (decided := rule.decide(facts)) is not None:
                return decided
        if self.default is Verdict.VALID:
            return self.default, "No rule names this field, so the change is recorded only."
        return self.default, "No rule names this field, so the policy's default verdict applies."


@functools.lru_cache(maxsize=512)
def _glob(pattern: str) -> re.Pattern[str]:
    parts = {"*": ".*", "?": "."}
    return re.compile("".join(parts.get(c) or re.escape(c) for c in pattern), re.DOTALL)


class _PolicyFile(_Model):
    rule: list[Rule] = []
    default: Verdict | None = None

    _default = field_validator("default", mode="before")(_upper)


def load_policy(path: str | os.PathLike[str], base: Policy) -> Policy:
    """``base`` with the TOML file's ``[[rule]]`` tables in front and its ``default``, if any.

    Raises:
        SpecError: unreadable file, bad TOML, unknown key or verdict, missing field (one line).
    """
    p = Path(path)
    try:
        data = tomllib.loads(read_small(p, 1 << 20).decode("utf-8"))
        parsed = _PolicyFile.model_validate(data)
    except OSError as exc:
        raise SpecError(f"{p}: cannot read policy file: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise SpecError(f"{p}: policy file is not UTF-8 text") from exc
    except ValidationError as exc:
        raise SpecError(f"{p}: {_describe(exc)}") from exc
    except (ValueError, RecursionError) as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise SpecError(f"{p}: not valid TOML: {_one_line(str(exc))}") from exc
    return Policy(rules=(*parsed.rule, *base.rules),
                  default=base.default if parsed.default is None else parsed.default)


def _describe(exc: ValidationError) -> str:
    errors = exc.errors()
    first = errors[0]
    loc = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in first["loc"]).lstrip(".")
    if first["type"] == "extra_forbidden":
        problem = f"unknown key {loc!r}"
    elif first["type"] == "missing":
        problem = f"missing key {loc!r}"
    else:
        problem = f"{loc or 'file'}: {_one_line(first['msg'])}"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return f"invalid policy: {problem}{more}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def diff(bundle: Fingerprint, host: Fingerprint, policy: Policy,
         facts: Mapping[str, bool] | None = None) -> list[Finding]:
    """One finding per compared field, worst first, then changed before unchanged.

    GPUs are compared by index, for the indices both hosts have; ``gpu.count`` carries a change in
    the number of GPUs.
    """
    both = {g.index for g in bundle.gpus} & {g.index for g in host.gpus}
    derived = {"bundle_has_gpu": bool(bundle.gpus), "host_has_gpu": bool(host.gpus),
               "gpu_lost": bool(bundle.gpus) and not host.gpus}
    return diff_fields(_only_gpus(flatten(bundle), both), _only_gpus(flatten(host), both),
                       policy, {**derived, **(facts or {})})


def diff_fields(bundle: Mapping[str, str | None], host: Mapping[str, str | None], policy: Policy,
                facts: Mapping[str, bool] | None = None) -> list[Finding]:
    """:func:`diff` over already flattened fields (e.g. with ``engine.*`` facts added)."""
    facts = facts or {}
    findings = []
    for field in dict.fromkeys([*bundle, *host]):
        if field in IGNORED_FIELDS:
            continue
        b, h = bundle.get(field), host.get(field)
        verdict, reason = policy.evaluate(field, facts) if b != h else (Verdict.VALID, "unchanged")
        findings.append(Finding(field=field, bundle_value=b, host_value=h, verdict=verdict,
                                reason=reason))
    return sorted(findings, key=lambda f: (-f.verdict.severity, not f.changed))  # stable


def collapse(findings: Iterable[Finding], at: int = 3) -> list[tuple[list[Finding], Finding]]:
    """Changed, non-VALID findings grouped by verdict and reason, in order: a group of ``at``
    or more (e.g. 20 fields that "cannot be compared") is one entry, so the reason is said
    once; each entry is (its findings, the first of them)."""
    groups: dict[tuple[Verdict, str], list[Finding]] = {}
    for f in findings:
        if f.changed and f.verdict is not Verdict.VALID:
            groups.setdefault((f.verdict, f.reason), []).append(f)
    out = []
    for members in groups.values():
        if len(members) >= at:
            out.append((members, members[0]))
        else:
            out.extend(([f], f) for f in members)
    return out


def overall(findings: Iterable[Finding]) -> Verdict:
    """The worst verdict of the findings; ValueError if there are none."""
    return worst(f.verdict for f in findings)


_GPU_FIELD = re.compile(r"gpu\[(\d+)\]\.")


def _only_gpus(fields: dict[str, str | None], keep: set[int]) -> dict[str, str | None]:
    return {k: v for k, v in fields.items()
            if (m := _GPU_FIELD.match(k)) is None or int(m.group(1)) in keep}


def rule(pattern: str, verdict: Verdict, reason: str, when: str | None = None,
         otherwise: Verdict | None = None, otherwise_reason: str | None = None) -> Rule:
    """A :class:`Rule` (the built-in policies are written with it)."""
    return Rule(pattern=pattern, verdict=verdict, reason=reason, when=when, otherwise=otherwise,
                otherwise_reason=otherwise_reason)


_r = rule
VALID, SUB, INVALID = Verdict.VALID, Verdict.SUBOPTIMAL, Verdict.INVALID

_COMMON = [
    _r("*", SUB, "The tuning host was not recorded (the bundle was imported from a trtexec tuning "
       "cache, which records no host), so this host cannot be compared with it: check that the "
       "engine loads and re-time it here before relying on its tuning.",
       when="tuning_host_unknown"),
    _r("gpu[*].uuid", VALID, "The GPU's serial identity is recorded only; another board of the "
       "same model runs the engine the same way."),
    _r("hostname", VALID, "The host name is recorded only; it does not affect the engine."),
    _r("collected_at", VALID, "The collection time is recorded only."),
]
_TAIL = [
    _r("python.*", VALID, "The Python version does not affect the engine's kernels."),
]


def common_rules() -> tuple[Rule, ...]:
    """The rules every built-in policy starts with (the unknown tuning host, fields that are
    recorded only)."""
    return tuple(_COMMON)


def tail_rules() -> tuple[Rule, ...]:
    """The rules every built-in policy ends with (after the backend's own)."""
    return tuple(_TAIL)

PLATFORM_RULES = [
    _r("os.system", INVALID, "Compiled engines do not move between operating systems."),
    _r("os.machine", INVALID, "Compiled engines do not move between CPU architectures."),
]


def gpu_tuning_rules(what: str) -> list[Rule]:
    """Same architecture, other conditions: the engine runs, its tuning may be off."""
    return [
        _r("gpu[*].name", SUB, f"This is another GPU model of the same architecture, so "
           f"{what} run but may no longer be the fastest."),
        _r("gpu[*].driver_version", SUB, f"Another GPU driver can change the speed of {what}."),
        _r("gpu[*].cuda_driver_version", SUB, f"The driver supports another CUDA version, which "
           f"can change the speed of {what} (and must not be older than the runtime)."),
        _r("gpu[*].vbios_version", SUB, "Another VBIOS can change clock and power behaviour."),
        _r("gpu[*].sm_count", SUB, f"The GPU has another number of SMs, so {what} may no "
           f"longer be the fastest."),
        _r("gpu[*].memory_total_mib", SUB, "The GPU has another amount of memory, which changes "
           "what fits in workspaces."),
        _r("gpu[*].*clock*", SUB, f"Other GPU clocks change the timings {what} were chosen by."),
        _r("gpu[*].power_limit_w", SUB, "Another power limit changes sustained clocks and so "
           "kernel timings."),
        _r("gpu[*].mig_mode", SUB, "A MIG slice has fewer SMs and less memory than the whole "
           "GPU, or the other way round."),
        _r("gpu[*].ecc_mode", SUB, "ECC changes usable memory and memory bandwidth."),
        _r("gpu[*].persistence_mode", VALID, "Persistence mode only affects driver start-up "
           "time, not kernel speed."),
    ]
