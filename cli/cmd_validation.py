"""``dossier validation create`` and ``dossier validation show``."""

from __future__ import annotations

from pathlib import Path

import typer

from dossier_cli.app import app, group, handled
from dossier_cli.render import err, out, print_json

validation_app = group(help="Make and read validation sets (pairs of inputs and reference "
                                "outputs).")
app.add_typer(validation_app, name="validation")


@validation_app.command("create")
@handled
def create(
    out_dir: Path = typer.Argument(..., metavar="SET", help="The new validation set folder (must not exist)."),
    inputs: list[Path] = typer.Option(..., "--inputs", "-i", metavar="FILE", help="One "
                                      "pair's inputs: .npz (one array per input name) or .npy "
                                      "(a single-input model); or Polygraphy's --save-inputs "
                                      "output, a .json file or a folder of them, one pair per "
                                      "feed. Repeat for more pairs."),
    references: list[Path] = typer.Option([], "--references", "-r", metavar="FILE",
                                           help="Reference outputs, in the order of the pairs: "
                                           ".npz/.npy (one pair each), or Polygraphy's "
                                           "--save-outputs output of one runner, a RunResults "
                                           ".json file or a folder of them (one pair per "
                                           "iteration). Repeat for more."),
    reference: str = typer.Option(None, "--reference", help="Compute the references instead: "
                                  "'onnxruntime-cpu' (the model run by ONNX Runtime's CPU "
                                  "provider, all optimizations off) or 'module:function' (your "
                                  "function, called with float64 inputs)."),
    model: Path = typer.Option(None, "--model", "-m", help="The ONNX model: names, dtypes and "
                               "shapes are checked against it (needed by onnxruntime-cpu)."),
    as_json: bool = typer.Option(False, "--json", help="Print the new set's summary as JSON."),
) -> None:
    """Create a validation set: one pair-NNN per --inputs pair, references from files or
    computed by a reference computation, provenance.json saying which.

    References must not come from the engine under test: compute them with the unoptimized
    model or an independent implementation."""
    from dossier.references import create_set, summarize_set

    vset = create_set(out_dir, inputs, model=model, references=references, reference=reference)
    err.print(f"wrote {len(vset.pairs)} pair(s) to {out_dir}", markup=False, soft_wrap=True)
    if as_json:
        print_json(summarize_set(out_dir).__dict__)


@validation_app.command("show")
@handled
def show(
    path: Path = typer.Argument(..., metavar="SET", help="Validation set folder."),
    as_json: bool = typer.Option(False, "--json", help="Print as JSON."),
) -> None:
    """Show a validation set: every pair's inputs and references (dtype and shape), its
    digest and how its references were made."""
    from dossier.references import summarize_set

    s = summarize_set(path)
    if as_json:
        print_json(s.__dict__)
        return
    out.print(f"{s.path}: {len(s.pairs)} pair(s), xxh3-128 {s.digest}", markup=False,
              soft_wrap=True)
    for p in s.pairs:
        for role in ("inputs", "references"):
            tensors = ", ".join(f"{k} {d}{tuple(shape)}"
                                for k, (d, shape) in p[role].items())  # type: ignore[attr-defined]
            out.print(f"  {p['name']}  {role:<10} {tensors}", markup=False, soft_wrap=True)
    prov = s.provenance
    out.print("references: " + (str(prov.get("method")) if prov.get("method")
                                else "unknown (no provenance.json)"), markup=False, soft_wrap=True)
    for key in ("reference", "versions", "model", "created_at", "tool"):
        if prov.get(key):
            out.print(f"  {key}: {prov[key]}", markup=False, soft_wrap=True)
