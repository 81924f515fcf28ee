"""``dossier keygen`` and ``dossier sign``: signed provenance for bundles."""

from __future__ import annotations

from pathlib import Path

import typer

from dossier_cli.app import app, handled
from dossier_cli.render import err, out, print_json


@app.command()
@handled
def keygen(
    out_dir: Path = typer.Option(..., "--out", "-o", metavar="DIR", help="Folder for NAME.key (private, mode "
                                 "0600) and NAME.pub (public)."),
    name: str = typer.Option("dossier", "--name", help="File name stem of the two keys."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Write a new Ed25519 key pair (PEM) for dossier sign. Give the .pub file to
    the hosts that verify (dossier verify --trusted-key); keep the .key secret.
    Existing key files are never overwritten."""
    from dossier.trust.signing import generate_key_pair

    keys = generate_key_pair(out_dir, name)
    if as_json:
        print_json({"private": str(keys.private), "public": str(keys.public),
                    "keyid": keys.keyid})
        return
    err.print(f"wrote an Ed25519 key pair, keyid {keys.keyid}; keep {keys.private} secret",
              markup=False, soft_wrap=True)
    out.print(str(keys.public), markup=False, soft_wrap=True)


@app.command()
@handled
def sign(
    path: Path = typer.Argument(..., metavar="BUNDLE", help="Bundle folder or .dossier.tar."),
    key: Path = typer.Option(..., "--key", "-k", metavar="KEY", help="Ed25519 private key (PEM), e.g. from "
                             "dossier keygen."),
    sig_out: Path = typer.Option(None, "--out", "-o", metavar="FILE", help="Where to write the signature "
                                 "(default: beside the bundle, NAME-VERSION.dossier.sig.json)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Sign a bundle: an in-toto Statement v1 naming every file (and manifest.json) with its
    BLAKE3, with SLSA provenance v1 of how the bundle was made (selection, strategy, metric,
    threshold, tuning host, model, validation set, backend stack, tuning sessions), in a DSSE
    envelope signed with Ed25519. The bundle itself is not changed.

    The bundle must pass its integrity check first. Signing again with another key adds a
    signature to the same envelope (co-signing).
    """
    from dossier.trust.signing import sign_bundle

    done = sign_bundle(path, key, out=sig_out)
    if as_json:
        print_json({"signature": str(done.signature), "keyid": done.keyid,
                    "subjects": done.subjects, "dossier_id": done.dossier_id,
                    "signatures": done.signatures})
        return
    err.print(f"signed {path} (id {done.dossier_id}): {done.subjects} subjects, keyid "
              f"{done.keyid[:16]}, {done.signatures} signature(s) in the envelope",
              markup=False, soft_wrap=True)
    out.print(str(done.signature), markup=False, soft_wrap=True)
