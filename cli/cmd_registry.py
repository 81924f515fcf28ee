"""``dossier push`` and ``dossier pull``: bundles in OCI registries."""

from __future__ import annotations

from pathlib import Path

import typer

from dossier_cli.app import app, handled
from dossier_cli.render import err, out, print_json

INSECURE_HELP = "Plain HTTP instead of HTTPS; allowed only for a loopback registry."


@app.command()
@handled
def push(
    path: Path = typer.Argument(..., metavar="BUNDLE", help="Bundle folder or .dossier.tar."),
    target: str = typer.Argument(..., metavar="REGISTRY/REPO:TAG", help="Where to push it."),
    signature: Path = typer.Option(None, "--signature", metavar="FILE", help="The bundle's dossier sign "
                                   "envelope, attached as a referrer (default: "
                                   "NAME-VERSION.dossier.sig.json beside the bundle, if there)."),
    no_signature: bool = typer.Option(False, "--no-signature", help="Attach no signature."),
    insecure: bool = typer.Option(False, "--insecure", help=INSECURE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Push a bundle to an OCI registry as an artifact (application/vnd.dossier.bundle.v1):
    manifest.json as the config, every file as a layer with its sha256. The same bundle always
    gives the same manifest digest; blobs already in the repository are not uploaded again. A
    signature beside the bundle is attached as an OCI 1.1 referrer of the manifest.
    Prints the pinned reference REGISTRY/REPO@sha256:... on stdout."""
    from dossier.registry import push_bundle
    from dossier.trust.sigfile import signature_path

    if signature is None and not no_signature and signature_path(path).is_file():
        signature = signature_path(path)
    done = push_bundle(path, target, insecure=insecure,
                       signature=None if no_signature else signature)
    if as_json:
        print_json({"reference": done.reference, "tag": done.tag, "digest": done.digest,
                    "dossier_id": done.dossier_id, "files": done.files, "bytes": done.bytes,
                    "uploaded": done.uploaded, "signature": done.signature})
        return
    err.print(f"pushed {path} (id {done.dossier_id}) as {target}: {done.files} files, "
              f"{done.bytes} bytes, {done.uploaded} blob(s) uploaded"
              + (f", signature referrer {done.signature}" if done.signature else ", unsigned"),
              markup=False, soft_wrap=True)
    out.print(done.reference, markup=False, soft_wrap=True)


@app.command()
@handled
def pull(
    source: str = typer.Argument(..., metavar="REGISTRY/REPO[:TAG|@DIGEST]",
                                 help="The bundle to pull."),
    out_dir: Path = typer.Option(..., "--out", "-o", metavar="DIR", help="Folder for NAME-VERSION.dossier."),
    insecure: bool = typer.Option(False, "--insecure", help=INSECURE_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Pull a bundle from an OCI registry into OUT/NAME-VERSION.dossier. Every layer's sha256
    is checked while it streams, then the bundle's integrity check runs (its xxh3-128 taken
    from the same stream); only then is the folder renamed into place (nothing half-pulled is
    left). The signature referrers the registry holds are checked against the pulled files and
    written beside the bundle (NAME-VERSION.dossier.sig.json, where verify looks); one that is
    malformed or does not pass is a warning and is ignored, as verify REF ignores it. Existing
    bundles and signatures are never overwritten."""
    from dossier.registry import pull_bundle

    done = pull_bundle(source, out_dir, insecure=insecure)
    for warning in done.warnings:
        err.print(f"warning: {warning}", markup=False, soft_wrap=True)
    if as_json:
        print_json({"bundle": str(done.path), "reference": done.reference,
                    "digest": done.digest, "dossier_id": done.dossier_id, "files": done.files,
                    "signature": str(done.signatures[0]) if done.signatures else None,
                    "warnings": done.warnings})
        return
    err.print(f"pulled {done.reference} (id {done.dossier_id}): {done.files} files, digests "
              "and integrity checked"
              + (f"; its signature beside it: {done.signatures[0]}" if done.signatures else ""),
              markup=False, soft_wrap=True)
    out.print(str(done.path), markup=False, soft_wrap=True)
