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


@validation_app.command("split")
@handled
def split_cmd(
    source: Path = typer.Argument(..., metavar="SET", help="The validation set to split."),
    out_dir: Path = typer.Option(..., "--out", "-o", metavar="DIR", help="The new folder "
                                 "(must not exist): DIR/validation, DIR/holdout, "
                                 "DIR/calibration and DIR/split.json."),
    holdout: float = typer.Option(0.2, "--holdout", help="Pairs held out: a share below 1, or "
                                  "a count."),
    calibration: float = typer.Option(0.0, "--calibration", help="Pairs whose inputs become "
                                      "the calibration set: a share below 1, or a count."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random draw (recorded)."),
    as_json: bool = typer.Option(False, "--json", help="Print who went where as JSON."),
) -> None:
    """Split one validation set into disjoint validation, hold-out and calibration sets.

    Pairs are drawn at random with --seed; DIR/split.json records the source's digest, the
    seed and where each pair went (each set's provenance.json too). Pairs that share inputs go
    to one set together. Name them in the release spec as [validation],
    [holdout] and [calibration]: the search gates routes on the validation set, static
    quantization calibrates on the calibration set, and the route about to ship is checked on
    the hold-out set, which the search never saw."""
    from dossier.datasets import split

    r = split(source, out_dir, holdout=holdout, calibration=calibration, seed=seed)
    err.print(f"wrote {out_dir}: {len(r.validation)} validation, {len(r.holdout)} hold-out, "
              f"{len(r.calibration)} calibration (seed {seed})", markup=False, soft_wrap=True)
    for together in r.kept_together:
        err.print(f"kept together (they share inputs): {', '.join(together)}", markup=False,
                  soft_wrap=True)
    if as_json:
        print_json({"out": str(r.out), "seed": r.seed, "validation": r.validation,
                    "holdout": r.holdout, "calibration": r.calibration,
                    "kept_together": r.kept_together})
