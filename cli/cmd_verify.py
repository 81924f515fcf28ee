"""``dossier verify`` and ``dossier retune``: what a fleet host runs before it loads an engine."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from dossier.errors import BundleError, DossierError, ExitCode, InputError, SignatureError
from dossier.formats import Document, FormatName
from dossier_cli.app import app, handled, on_interrupt
from dossier_cli.render import (
    choose_format,
    emit,
    format_option,
    line,
    out,
    output_option,
    print_json,
)


@app.command()
@handled
@on_interrupt("interrupted; verify wrote nothing (run it again to check the bundle)")
def verify(
    path: Path = typer.Argument(..., metavar="BUNDLE", help="Bundle folder or .dossier.tar, or a registry "
                                "reference REGISTRY/REPO:TAG or REGISTRY/REPO@DIGEST."),
    integrity_only: bool = typer.Option(False, "--integrity-only", help="Check only that every "
                                        "file matches the manifest (no environment check)."),
    recheck: bool = typer.Option(False, "--recheck", help="Load the shipped engine here and run "
                                 "the bundle's validation set against its metric and threshold "
                                 "(and its hold-out set, when it carries one)."),
    rebench: bool = typer.Option(False, "--rebench", help="Re-measure the shipped and the "
                                 "baseline engines here (one fresh process each); a speedup "
                                 "below the recorded interval, or one whose interval includes "
                                 "1.0, is SUBOPTIMAL."),
    max_s: float = typer.Option(None, "--max-s", metavar="S", help="With --rebench: about the "
                                "most seconds its measuring processes take together (default "
                                "900); the bundle's own timing settings are clamped too."),
    recheck_max_s: float = typer.Option(None, "--recheck-max-s", metavar="S", help="With "
                                        "--recheck: the most seconds each re-check process "
                                        "takes (default 600; the validation set, then the "
                                        "hold-out set); past it, exit 3."),
    threshold: float = typer.Option(None, metavar="T", help="With --recheck: a threshold "
                                     "at or below the bundle's (stricter), above 0."),
    policy: Path = typer.Option(None, "--policy", metavar="FILE", help="TOML policy file whose [[rule]]s override "
                                "the backend's default verdicts."),
    host: Path = typer.Option(None, "--host-fingerprint", metavar="FILE", help="Judge the host this "
                              "fingerprint file describes (dossier/fingerprint.py's JSON, e.g. "
                              "collected on a fleet host) instead of this one; --recheck and "
                              "--rebench still run here."),
    show_all: bool = typer.Option(False, "--all", help="List unchanged fields too."),
    as_json: bool = typer.Option(False, "--json", help="The report as JSON on stdout (for fleet "
                                 "automation; the same as --format json)."),
    fmt: FormatName = format_option(Document.verify),
    output: Path = output_option(),
    require_signature: bool = typer.Option(False, "--require-signature", help="Refuse (exit 13) "
                                           "a bundle that is not signed by a --trusted-key."),
    trusted_keys: list[Path] = typer.Option([], "--trusted-key", metavar="PUB", help="Ed25519 public key (PEM) "
                                            "whose signature is accepted; repeat for several."),
    signature: Path = typer.Option(None, "--signature", metavar="FILE", help="The bundle's signature file "
                                   "(default: NAME-VERSION.dossier.sig.json beside it)."),
    insecure: bool = typer.Option(False, "--insecure", help="For a registry reference: plain "
                                  "HTTP, allowed only for a loopback registry."),
) -> None:
    """Check a bundle on this host before loading its engine.

    \b
    0. signature, when the bundle has one (beside it, --signature, or a registry
       referrer): every signature of the DSSE envelope must verify and every file must
       match the signed statement's BLAKE3 (exit 13 otherwise); the signer is checked
       against --trusted-key only (without one: "signer NOT checked").
       --require-signature also refuses an unsigned bundle and one that no
       --trusted-key signed (it needs at least one --trusted-key);
    1. integrity: every file against the manifest's size and xxh3-128 (each missing, extra or
       altered file is named); no engine is loaded before this passes;
    2. environment: this host's fingerprint against the tuning host's, a verdict per field
       (VALID / SUBOPTIMAL / INVALID) with the reason, by the backend's policy;
    3. optionally --recheck accuracy and --rebench latency here.

    Exit codes: 0 VALID, 10 SUBOPTIMAL, 11 INVALID (or engines that cannot be timed here), 2
    usage (--threshold or --recheck-max-s without --recheck, --max-s without --rebench,
    --require-signature without --trusted-key), 3 bad input (a --threshold not above 0 or
    looser than the bundle's, an unusable --policy or --host-fingerprint file, --recheck of a
    bundle without a validation set, a --rebench that did not finish within --max-s or a
    --recheck within --recheck-max-s), 6 integrity failure or
    unreadable bundle (a validation set that cannot be read), 13 signature
    missing, untrusted, not verifying or not matching, 74 no room in TMPDIR for the files an
    archive's checks need.

    A registry reference is pulled into the cache first (digests checked, signatures found as referrers): exit 20, 21, 22 when the registry fails, wants credentials, or lacks the tag.
    """
    from dossier.verify import Step, StepOutcome, VerifyOptions, refused_report
    from dossier.verify import verify as run_verify

    chosen = choose_format(fmt, as_json, Document.verify, "verify", output,
                           styled=not integrity_only)  # integrity only: no text report
    threshold = _threshold_option(threshold, recheck)
    rebench_max_s = _max_s_option(max_s, rebench)
    recheck_s = _max_s_option(recheck_max_s, recheck, "--recheck-max-s", "--recheck")
    if require_signature and not trusted_keys:
        line("error: --require-signature needs at least one --trusted-key (the signer's public "
             "key)")
        raise typer.Exit(int(ExitCode.USAGE))
    scenario = None
    if rebench:  # a server/offline release's scenario is replayed too
        from dossier.scenarios.replay import rebench_scenario as scenario

    options = VerifyOptions(rebench_scenario=scenario,
                            integrity_only=integrity_only, recheck=recheck, rebench=rebench,
                            threshold=threshold, policy=policy, host=host,
                            trusted_keys=tuple(trusted_keys),
                            require_signature=require_signature, signature=signature,
                            insecure=insecure, rebench_max_s=rebench_max_s,
                            recheck_max_s=recheck_s)
    printed: list[Step] = []
    where = f"the host of {host}" if host else "this host"

    def said(step: Step) -> None:  # the OK/FAIL lines on stderr, as each step ends
        if step.outcome is StepOutcome.WARNED and step.name.value in ("fetch", "signature"):
            for problem in step.problems:  # malformed or foreign signature referrers, ignored
                line(f"warning: {problem}")
            if step.name.value == "fetch":
                line(f"OK: {step.detail}")
        elif step.outcome is StepOutcome.PASSED and step.name.value in _LINES:
            line(f"OK: {step.detail}")
        elif step.outcome is StepOutcome.FAILED and step.problems:
            for problem in step.problems:
                line(f"FAIL: {problem}")
            line(step.detail)
            printed.append(step)

    try:
        result = run_verify(str(path), options, on_step=said)
    except DossierError as exc:
        partial = refused_report(exc)
        if partial is not None and chosen.name != FormatName.text:  # the refusal, as a report
            emit(chosen.verify_report(partial, where=where), output)
        if printed:
            raise typer.Exit(int(exc.exit_code)) from None
        if isinstance(exc, (BundleError, SignatureError)) and not _fetch_failed(partial):
            line(f"FAIL: {exc.diagnostics()}")  # unreadable, unsafe, unsigned...: one line
            raise typer.Exit(int(exc.exit_code)) from None
        raise  # the registry's errors, bad input: one "error:" line from handled
    text = chosen.verify_report(result, show_all=show_all, where=where)
    if text or output is not None:
        emit(text, output)
    raise typer.Exit(result.exit_code)


_LINES = ("fetch", "signature", "integrity")
"""Steps that say OK on stderr when they pass (the verdicts are rendered on stdout)."""


def _threshold_option(threshold: float | None, recheck: bool) -> float | None:
    """--threshold as given: only with --recheck (exit 2), and a number above 0 (exit 3)."""
    if threshold is None:
        return None
    if not recheck:
        line("error: --threshold applies to --recheck (the accuracy re-check): give --recheck "
             "too, or leave --threshold out")
        raise typer.Exit(int(ExitCode.USAGE))
    if not math.isfinite(threshold) or threshold <= 0:
        raise InputError(f"--threshold {threshold}: must be a number above 0",
                         hint="at or below the bundle's threshold, which dossier inspect shows")
    return threshold


def _max_s_option(max_s: float | None, given: bool, option: str = "--max-s",
                  bounds: str = "--rebench") -> float:
    """--max-s (or --recheck-max-s) as given: only with the step it bounds (exit 2), a number
    of seconds above 0 (exit 3)."""
    from dossier.verify import REBENCH_MAX_S, RECHECK_MAX_S

    if max_s is None:
        return REBENCH_MAX_S if option == "--max-s" else RECHECK_MAX_S
    if not given:
        line(f"error: {option} bounds {bounds}: give {bounds} too, or leave {option} out")
        raise typer.Exit(int(ExitCode.USAGE))
    if not math.isfinite(max_s) or max_s <= 0:
        raise InputError(f"{option} {max_s}: must be a number of seconds above 0")
    return max_s


def _fetch_failed(report) -> bool:  # type: ignore[no-untyped-def]
    return report is not None and any(s.name.value == "fetch" and s.outcome.value == "failed"
                                      for s in report.steps)


@app.command()
@handled
@on_interrupt("interrupted; the re-tune's finished trials are kept in its work folder (--work, "
              "default OUT/.runs/NAME-VERSION)")
def retune(
    path: Path = typer.Argument(..., metavar="BUNDLE", help="Bundle folder or .dossier.tar to re-tune."),
    out_dir: Path = typer.Option(..., "--out", "-o", metavar="DIR", help="Folder for the new bundle "
                                 "(NAME-(VERSION+1).dossier)."),
    model: Path = typer.Option(None, help="The model, when the bundle does not include it; "
                               "its xxh3-128 must match the bundle's model identity."),
    work: Path = typer.Option(None, help="Run folder (default OUT/.runs/NAME-(VERSION+1))."),
    top: int = typer.Option(3, min=0, help="How many of the bundle's best routes to measure "
                            "first."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No per-trial lines on stderr."),
) -> None:
    """Re-run a bundle's search on this host, starting from its best routes, and write the next
    release version whose parent is the old bundle's dossier id."""
    from dossier.retune import retune as run_retune
    from dossier_cli.progress import ProgressObserver

    with ProgressObserver(verbose=not quiet) as obs:
        done = run_retune(path, out_dir, model=model, work=work, observer=obs, top=top)
    m, d = done.bundle.manifest, done.tune.decision
    if as_json:
        print_json({"bundle": str(done.bundle.path), "dossier_id": m.dossier_id,
                    "release": m.release, "version": m.release_version, "parent": m.parent,
                    "warm_start": done.warm_start, "decision": d.model_dump(mode="json")})
        return
    out.print(f"wrote {done.bundle.path} (version {m.release_version}, parent {m.parent})",
              markup=False)
    out.print(d.reason, markup=False)
