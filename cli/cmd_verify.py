"""``dossier verify`` and ``dossier retune``: what a fleet host runs before it loads an engine."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path

import typer

from dossier.errors import BundleError, ExitCode, InputError, SignatureError
from dossier_cli.app import app, handled, on_interrupt
from dossier_cli.render import escape, fmt_speedup, line, out, print_json

_COLOUR = {"VALID": "green", "SUBOPTIMAL": "yellow", "INVALID": "red"}


@app.command()
@handled
@on_interrupt("interrupted; verify wrote nothing (run it again to check the bundle)")
def verify(
    path: Path = typer.Argument(..., metavar="BUNDLE", help="Bundle folder or .dossier.tar, or a registry "
                                "reference REGISTRY/REPO:TAG or REGISTRY/REPO@DIGEST."),
    integrity_only: bool = typer.Option(False, "--integrity-only", help="Check only that every "
                                        "file matches the manifest (no environment check)."),
    recheck: bool = typer.Option(False, "--recheck", help="Load the shipped engine here and run "
                                 "the bundle's validation set against its metric and threshold."),
    rebench: bool = typer.Option(False, "--rebench", help="Re-measure the shipped and the "
                                 "baseline engines here (one fresh process each); a speedup "
                                 "below the recorded interval, or one whose interval includes "
                                 "1.0, is SUBOPTIMAL."),
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
                                 "automation)."),
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

    Exit codes: 0 VALID, 10 SUBOPTIMAL, 11 INVALID, 2 usage (--threshold without --recheck,
    --require-signature without --trusted-key), 3 bad input (a --threshold not above 0 or
    looser than the bundle's, an unusable --policy or --host-fingerprint file, --recheck of a
    bundle without a validation set), 6 integrity failure or unreadable bundle, 13 signature
    missing, untrusted, not verifying or not matching, 74 no room in TMPDIR for the files an
    archive's checks need.

    A registry reference is pulled into the cache first (digests checked, signatures found as referrers): exit 20, 21, 22 when the registry fails, wants credentials, or lacks the tag.
    """
    from dossier.bundle import check_integrity, open_bundle
    from dossier.bundle.integrity import scan_bundle
    from dossier.hashing import BLAKE3
    from dossier.sigfile import signature_path

    threshold = _threshold_option(threshold, recheck)
    if require_signature and not trusted_keys:
        line("error: --require-signature needs at least one --trusted-key (the signer's public "
             "key)")
        raise typer.Exit(int(ExitCode.USAGE))
    fetched = _fetch(path, insecure, require_signature)  # a registry reference: into the cache
    if fetched is not None:
        path = fetched.path
    # an archive is extracted only as far as the checks read it; but a signed one whose files
    # are used after the check (engines loaded, the environment read) is extracted whole first,
    # so what the signature covered is what is used
    signed_here = require_signature or signature is not None or os.path.lexists(signature_path(path))
    # one read of every file: xxh3-128 for integrity, BLAKE3 too when a signature is checked
    # (an archive extracted whole: as it is written)
    digests = [BLAKE3] if signed_here or (fetched is not None and fetched.signatures) else []
    try:
        with _signature_first(path, trusted_keys, require_signature, signature), \
                open_bundle(path, lazy=integrity_only or not signed_here, digests=digests) as b:
            scan = scan_bundle(b, digests)
            if fetched is not None and not signature:
                from dossier.registry import check_referrer_signatures

                signed = check_referrer_signatures(b, fetched.signatures, trusted_keys,
                                                   require=require_signature,
                                                   source=fetched.reference, scan=scan)
            elif signed_here or trusted_keys:
                from dossier.signing import check_signature

                signed = check_signature(b, trusted_keys, require=require_signature,
                                         signature=signature, scan=scan)
            else:  # no signature and no key to check one with: dossier.signing is not imported
                signed = None
            if signed is not None:
                line(f"OK: signature {signed.path}: {signed}")
            report = check_integrity(b, scan)
            if not report:
                for problem in [str(p) for p in report.problems] or [str(report)]:
                    line(f"FAIL: {problem}")
                line(f"{path}: integrity check failed ({len(report.problems)} problem(s))")
                raise typer.Exit(int(ExitCode.BUNDLE))
            line(f"OK: {b.manifest.name} ({path}): {report}")
            if integrity_only:
                return
            from dossier.fingerprint import load_fingerprint
            from dossier.verify import verify_bundle

            _stricter_than_bundle(threshold, b.manifest.summary.threshold)
            result = verify_bundle(b, policy_file=policy, do_recheck=recheck, do_rebench=rebench,
                                   threshold=threshold,
                                   host=load_fingerprint(host) if host else None,
                                   signature_check=signed, integrity=report)
    except (BundleError, SignatureError) as exc:  # unreadable, unsafe, unsigned...: one line
        line(f"FAIL: {exc.diagnostics()}")
        raise typer.Exit(int(exc.exit_code)) from None
    if as_json:
        print_json(result.model_dump(mode="json"))
    else:
        _render(result, show_all, f"the host of {host}" if host else "this host")
    raise typer.Exit(int(result.verdict.exit_code))


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


def _stricter_than_bundle(threshold: float | None, recorded: float) -> None:
    """A --threshold looser than the one the bundle was released at is refused (exit 3): a
    re-check may only ask more of the engine than its release did."""
    if threshold is not None and threshold > recorded:
        raise InputError(f"--threshold {threshold:g} is looser than the bundle's {recorded:g}",
                         hint="a re-check takes the bundle's threshold or a stricter (lower) one")


def _fetch(path: Path, insecure: bool, require: bool):  # type: ignore[no-untyped-def]
    """A registry reference (not a local path) pulled into the cache; None for a local path."""
    if path.exists():  # a local bundle: the registry client is not even imported
        return None
    from dossier.registry import fetch_bundle, looks_like_reference

    if not looks_like_reference(str(path)):
        return None
    fetched = fetch_bundle(str(path), insecure=insecure, require_signature=require)
    for warning in fetched.warnings:  # malformed signature referrers, ignored
        line(f"warning: {warning}")
    line(f"OK: {fetched.reference}: {'in the cache at' if fetched.cached else 'pulled into'} "
         f"{fetched.path}, {len(fetched.signatures)} signature referrer(s)")
    return fetched


@contextlib.contextmanager
def _signature_first(path: Path, trusted_keys: list[Path], require: bool,
                     signature: Path | None) -> Iterator[None]:
    """A bundle that cannot even be opened (a corrupt manifest.json) while a signature is
    required: what its signature says about it (exit 13) comes before the format error."""
    try:
        yield
    except BundleError:
        if require:
            from dossier.signing import check_signature_at

            check_signature_at(path, trusted_keys, require=True, signature=signature)
        raise


def _render(result, show_all: bool,  # type: ignore[no-untyped-def]
            where: str = "this host") -> None:
    from rich.table import Table

    from dossier.policy import collapse

    if show_all:
        groups = [([f], f) for f in result.findings]
    else:  # one row for many fields with the same verdict and reason ("cannot be compared")
        groups = collapse(result.findings) + [([f], f) for f in result.findings
                                               if f.changed and f.verdict.value == "VALID"]
    rows = [g for g, _ in groups]
    table = Table(title=f"environment: {result.release} ({result.backend}) on {where}")
    for col in ("field", "bundle", "host", "verdict", "reason"):
        table.add_column(col, overflow="fold")
    for group, f in groups:
        c = _COLOUR[f.verdict.value]
        many = len(group) > 1
        table.add_row(escape(f"{len(group)} fields: " + ", ".join(x.field for x in group)
                             if many else f.field),
                      "-" if many else escape(str(f.bundle_value)),
                      "-" if many else escape(str(f.host_value)),
                      f"[{c}]{f.verdict.value}[/]", escape(f.reason))
    unchanged = sum(1 for f in result.findings if not f.changed)
    if rows:
        out.print(table)
    out.print(f"{unchanged} of {len(result.findings)} fields unchanged on {where}", markup=False)
    if result.recheck is not None:
        r = result.recheck
        state = "passed" if r.passed else "FAILED"
        worst = f"{r.worst_loss:.3g}" if r.worst_loss is not None else "-"
        out.print(f"accuracy re-check {state}: worst {r.metric} loss {worst} "
                  f"(threshold {r.threshold:.3g}, recorded {r.recorded_worst_loss})"
                  + (f": {r.failure}" if r.failure else ""), markup=False)
    if result.rebench is not None:
        rb = result.rebench
        c = rb.comparison
        out.print(f"re-timing: shipped {rb.shipped.median_ms:.3f} ms, baseline "
                  f"{rb.baseline.median_ms:.3f} ms"
                  + (f", {fmt_speedup(c.speedup, c.speedup_ci_low, c.speedup_ci_high)}" if c else "")
                  + (" (each round's ratio between {:.3f}x and {:.3f}x)".format(*c.round_range())
                     if c and c.round_range() else "")
                  + f"; {rb.reason}", markup=False)
    colour = _COLOUR[result.verdict.value]
    out.print(f"verdict: [bold {colour}]{result.verdict.value}[/]")
    for reason in result.reasons:
        out.print(f"  - {escape(reason)}", soft_wrap=True)


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
