"""``dossier.load`` of an AOTInductor bundle on the CPU: tuned and bundled here (one CPU build
of the torch-mlp sample, ~20 s on two cores), loaded by the package loader, outputs equal to
those of the package loaded as the tuner's worker loads it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import TINY_TIMING  # noqa: E402

import dossier  # noqa: E402
from dossier.bundle import write_bundle  # noqa: E402
from dossier.routes import Route  # noqa: E402
from dossier.spec import load_spec  # noqa: E402
from dossier.validation import load_validation_set  # noqa: E402
from dossier.verify.policy import Verdict  # noqa: E402
from samples import torch_models  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def mlp_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dossier.tuner import tune

    root = tmp_path_factory.mktemp("torch-serve")
    sample = torch_models.build_torch_mlp(root / "samples").parent
    spec = load_spec(sample / "release.toml", {"selection": "-device=cpu"})
    spec = spec.model_copy(update={"timing": TINY_TIMING.model_copy(
        update={"trial_timeout_s": 300.0})})
    tune(spec, root / "run", spec_path=sample / "release.toml")
    return write_bundle(root / "run", root / "out").path


def test_an_aoti_bundle_loads_and_matches_the_workers_outputs(
        mlp_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dossier.backends import get_backend

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    engine = dossier.load(mlp_bundle)
    assert engine.backend == "torch-inductor" and engine.report.verdict is Verdict.VALID
    assert engine.inputs == ("x",) and len(engine.outputs) == 1
    vset = load_validation_set(mlp_bundle / "validation")
    shipped = next((mlp_bundle / "engine").glob("*.pt2"))
    worker = get_backend("torch-inductor").load(shipped, Route.parse(engine.route))
    for pair in vset.pairs:
        ours, theirs = engine(pair.inputs), worker.run(pair.inputs)
        assert ours.keys() == theirs.keys() == pair.references.keys()
        for name in ours:
            np.testing.assert_array_equal(ours[name], theirs[name])
        ours_t = engine(x=torch.from_numpy(pair.inputs["x"]))  # tensors in, tensors out
        assert list(ours_t) == list(ours)
        for name, t in ours_t.items():
            assert isinstance(t, torch.Tensor) and t.device.type == "cpu"
            np.testing.assert_array_equal(t.float().numpy(), ours[name])
    mixed = {"x": torch.from_numpy(vset.pairs[0].inputs["x"]).numpy()}  # arrays: arrays out
    assert all(isinstance(v, np.ndarray) for v in engine(mixed).values())
    from dossier.run_once import run_bundle

    res = run_bundle(mlp_bundle, check=True)
    assert res.check is not None and res.check.passed, res.check


def test_verifying_an_aoti_bundle_imports_neither_the_tuner_nor_scipy(mlp_bundle: Path) -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / ".shim")])}
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "dossier_cli.main", "verify",
                          str(mlp_bundle)], capture_output=True, text=True, timeout=300,
                         check=False, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    names = {ln.split("|")[-1].strip() for ln in res.stderr.splitlines()
             if ln.startswith("import time:")}
    assert {"dossier.verify", "dossier.backends.torch_inductor.backend"} <= names
    heavy = {"scipy", "dossier.tuner", "dossier.measure.confirmation", "pyarrow", "torch",
             "torch._C"}
    assert all(importlib.util.find_spec(m) for m in heavy)  # every name is a real module
    assert not heavy & names, heavy & names  # verify imports no runtime: only dossier.load does


def test_loading_a_cpu_package_runs_no_host_probe(mlp_bundle: Path) -> None:
    """A CPU package goes through the package loader, not ``aoti_load_package``: that one imports
    torch._inductor and compiles a test program per CPU instruction set (seconds) only to log a
    warning, and dossier's verification has judged the host's instruction sets already."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / ".shim")])}
    code = "import sys, dossier; dossier.load(sys.argv[1]); print('loaded')"
    res = subprocess.run([sys.executable, "-X", "importtime", "-c", code, str(mlp_bundle)],
                         capture_output=True, text=True, timeout=300, check=False, env=env)
    assert res.returncode == 0 and "loaded" in res.stdout, res.stderr[-2000:]
    names = {ln.split("|")[-1].strip() for ln in res.stderr.splitlines()
             if ln.startswith("import time:")}
    # torch's own line is missing when importlib.import_module imports it (the runtime
    # imported while the checks run): -X importtime times `import` statements only
    assert "torch._C" in names and "dossier.backends.torch_inductor.runner" in names
    assert not {"torch._inductor", "torch._inductor.cpu_vec_isa"} & names
