"""The verify policy, under the name it has always had: it lives in :mod:`dossier.host.policy`
(at the bottom of the library, so that backends, which contribute rules, need not import
verify/)."""

from __future__ import annotations

from dossier.host.policy import (
    IGNORED_FIELDS,
    INVALID,
    PLATFORM_RULES,
    SUB,
    VALID,
    Finding,
    Policy,
    Rule,
    Verdict,
    collapse,
    common_rules,
    diff,
    diff_fields,
    gpu_tuning_rules,
    load_policy,
    overall,
    rule,
    tail_rules,
    worst,
)

__all__ = ["IGNORED_FIELDS", "INVALID", "PLATFORM_RULES", "SUB", "VALID", "Finding", "Policy",
           "Rule", "Verdict", "collapse", "common_rules", "diff", "diff_fields",
           "gpu_tuning_rules", "load_policy", "overall", "rule", "tail_rules", "worst"]
