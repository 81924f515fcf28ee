"""``dossier run``: the smoke test a deployment script runs after a rollout."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import typer

from dossier.errors import ExitCode
from dossier_cli.app import app, handled, on_interrupt
from dossier_cli.render import line, print_json


@app.command()
@handled
@on_interrupt("interrupted; run wrote nothing (an -o file is written only at the end)")
def run(
    path: str = typer.Argument(..., metavar="BUNDLE", help="Bundle folder or .dossier.tar, or a registry "
                               "reference REGISTRY/REPO:TAG or REGISTRY/REPO@DIGEST."),
    inputs: Path = typer.Option(None, "--inputs", "-i", metavar="FILE", help="Named input arrays (.npz, "
                                "numpy.savez). Default: the inputs of the bundle's first "
                                "validation pair."),
    outputs: Path = typer.Option(None, "--outputs", "-o", metavar="FILE", help="Write the outputs here (.npz; "
                                 "never overwritten)."),
    check: bool = typer.Option(False, "--check", help="Compare the outputs with the references "
                               "of the validation pair whose inputs were run, by the bundle's "
                               "metric and threshold."),
    require_signature: bool = typer.Option(False, "--require-signature", help="Refuse (exit 13) "
                                           "a bundle that is not signed by a --trusted-key."),
    trusted_keys: list[Path] = typer.Option([], "--trusted-key", metavar="PUB", help="Ed25519 public key (PEM) "
                                            "whose signature is accepted; repeat for several."),
    signature: Path = typer.Option(None, "--signature", metavar="FILE", help="The bundle's signature file."),
    policy: Path = typer.Option(None, "--policy", metavar="FILE", help="TOML policy file, as verify --policy."),
    refuse_suboptimal: bool = typer.Option(False, "--refuse-suboptimal", help="Refuse (exit 10) "
                                           "an engine whose verdict here is SUBOPTIMAL (default: "
                                           "a warning)."),
    host: Path = typer.Option(None, "--host-fingerprint", metavar="FILE", help="Judge against this fingerprint "
                              "file instead of this host (as verify --host-fingerprint)."),
    insecure: bool = typer.Option(False, "--insecure", help="For a registry reference: plain "
                                  "HTTP, allowed only for a loopback registry."),
    as_json: bool = typer.Option(False, "--json", help="The result as JSON on stdout."),
    scenario: bool = typer.Option(False, "--scenario", help="Then replay the release's server or "
                                  "offline scenario: one LoadGen run at the lowest rate it met, "
                                  "served from the sessions it shipped with (exit 11 when the "
                                  "bound is not met here; needs the [scenario] extra)."),
) -> None:
    """Verify a bundle, load its engine as it was timed (dossier.load), run it once.

    Exit codes: 0 ran (and --check passed, and --scenario met its bound), 3 unusable inputs
    (unreadable .npz, names that are not the engine's, --check with inputs of no validation
    pair, --scenario on a bundle released for single-stream), 4 --scenario's LoadGen run did
    not finish in its time limit, 5 the backend's library (or LoadGen, for --scenario) is not
    installed, 6 integrity failure or unreadable bundle, 7 -o exists, 10 SUBOPTIMAL with
    --refuse-suboptimal, 11 INVALID here, the engine did not load or run, --check found a
    loss at or above the threshold, or --scenario's bound was not met at the recorded rate,
    13 signature missing, untrusted or not matching, 20-22 registry errors, 74 no room to
    extract an archive.
    """
    from dossier.errors import OutputError
    from dossier.npz import write_outputs
    from dossier.run_once import run_bundle
    from dossier.serve import SuboptimalWarning

    if require_signature and not trusted_keys:
        line("error: --require-signature needs at least one --trusted-key (the signer's public "
             "key)")
        raise typer.Exit(int(ExitCode.USAGE))
    if outputs is not None and os.path.lexists(outputs):  # before any work is done
        raise OutputError(f"{outputs} exists; not overwritten", hint="choose another -o")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SuboptimalWarning)
        done = run_bundle(path, inputs, check=check, require_signature=require_signature,
                          trusted_key=list(trusted_keys), signature=signature, policy=policy,
                          on_suboptimal="refuse" if refuse_suboptimal else "warn",
                          host=host, insecure=insecure)
    for w in caught:
        if issubclass(w.category, SuboptimalWarning):
            line(f"warning: {w.message}")
    e = done.engine
    if outputs is not None:
        write_outputs(outputs, done.outputs)
    if as_json:
        print_json(done.summary())
    else:
        line(f"OK: {e.report.release} ({e.backend}, {e.route}): verified "
             f"{e.report.verdict.value if e.report.verdict else ''}, loaded and ran in "
             f"{done.load_s:.2f} s + {done.first_call_ms:.1f} ms; inputs {done.inputs_from}")
        for name, arr in done.outputs.items():
            line(f"  {name}: {arr.dtype} {list(arr.shape)}", stderr=False)
        if outputs is not None:
            line(f"wrote {outputs}")
    c = done.check
    if c is not None:
        worst = max((v for v in c.losses.values() if v is not None), default=None)
        if not as_json:
            line(("OK: " if c.passed else "FAIL: ") + f"{c.pair}: worst {c.metric} loss "
                 + (f"{worst:.3g}" if worst is not None else "NaN/Inf")
                 + f" (threshold {c.threshold:.3g})" + (f": {c.failure}" if c.failure else ""))
        if not c.passed:
            raise typer.Exit(int(ExitCode.INVALID))
    if scenario:  # dossier.scenarios.replay: LoadGen at the recorded rate
        from dossier.scenarios.smoke import smoke

        replayed = smoke(path, require_signature=require_signature, trusted_key=trusted_keys,
                         signature=signature, policy=policy, host=host, insecure=insecure,
                         on_suboptimal="ignore")
        line(("FAIL: " if replayed.regression else "OK: ") + "scenario " + replayed.text)
        if replayed.regression:
            raise typer.Exit(int(ExitCode.INVALID))
