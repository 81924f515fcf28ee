"""Verify a bundle on a host: the checking pipeline (:mod:`.pipeline`: fetch, signature,
integrity, the environment diff), the host re-measurement (:mod:`.host`: re-check accuracy,
re-time), the report document (:mod:`.report`) and the verdict policy (:mod:`.policy`)::

    from dossier.verify import VerifyOptions, verify

    report = verify("registry.example.com/ml/convnet:1",
                    VerifyOptions(require_signature=True, trusted_keys=[Path("keys/k.pub")]))
"""

from __future__ import annotations

from dossier.verify.host import (
    REBENCH_LIMITS,
    REBENCH_MAX_S,
    RECHECK_MAX_S,
    judge_speedup,
    rebench,
    rebench_timing,
    recheck,
)
from dossier.verify.pipeline import (
    StepObserver,
    VerifyOptions,
    refused_report,
    verified,
    verify,
    verify_bundle,
    with_report,
)
from dossier.verify.report import Rebench, Recheck, Step, StepName, StepOutcome, VerifyReport

__all__ = ["REBENCH_LIMITS", "REBENCH_MAX_S", "RECHECK_MAX_S", "StepOutcome", "Rebench", "Recheck", "Step",
           "StepName", "StepObserver", "VerifyOptions", "VerifyReport", "judge_speedup",
           "rebench", "rebench_timing", "recheck",
           "refused_report", "verified", "verify", "verify_bundle", "with_report"]
