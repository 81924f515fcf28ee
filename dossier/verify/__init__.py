"""Verify a bundle on a host: the checking pipeline (:mod:`.pipeline`: fetch, signature,
integrity, the environment diff), the host re-measurement (:mod:`.host`: re-check accuracy,
re-time), the report document (:mod:`.report`) and the verdict policy (:mod:`.policy`, which
lives in :mod:`dossier.host.policy`)::

    from dossier.verify import VerifyOptions, verify

    report = verify("registry.example.com/ml/convnet:1",
                    VerifyOptions(require_signature=True, trusted_keys=[Path("keys/k.pub")]))

The names below are imported on first use (PEP 562), so importing one submodule, e.g.
``dossier.verify.policy``, does not load the pipeline and the re-measurement.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOST = frozenset({"REBENCH_LIMITS", "REBENCH_MAX_S", "RECHECK_MAX_S", "judge_speedup",
                   "rebench", "rebench_timing", "recheck"})
_PIPELINE = frozenset({"StepObserver", "VerifyOptions", "refused_report", "verified", "verify",
                       "verify_bundle", "with_report"})
_REPORT = frozenset({"Rebench", "Recheck", "Step", "StepName", "StepOutcome", "VerifyReport"})


def __getattr__(name: str) -> Any:
    # Plain imports (not importlib), so the layering tests see each arrow.
    module: ModuleType
    if name in _HOST:
        from dossier.verify import host as module
    elif name in _PIPELINE:
        from dossier.verify import pipeline as module
    elif name in _REPORT:
        from dossier.verify import report as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOST, *_PIPELINE, *_REPORT})


__all__ = ["REBENCH_LIMITS", "REBENCH_MAX_S", "RECHECK_MAX_S", "StepOutcome", "Rebench", "Recheck", "Step",
           "StepName", "StepObserver", "VerifyOptions", "VerifyReport", "judge_speedup",
           "rebench", "rebench_timing", "recheck",
           "refused_report", "verified", "verify", "verify_bundle", "with_report"]
