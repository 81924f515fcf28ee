"""Build the tiny MLP for CUDA with the torch-inductor backend, then load it in a fresh process.

    python bench/h200/diag_load.py [--embed true|false]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--load", type=Path)
    args = ap.parse_args()
    from dossier.backends import get_backend
    from dossier.routes import Route

    b = get_backend("torch-inductor")
    if args.load:
        r = b.load(args.load, Route.parse("-device=cuda"))
        import numpy as np

        print("loaded; run ->", {k: v.shape for k, v in
                                 r.run({"x": np.ones((8, 64), np.float32)}).items()})
        return
    tmp = Path(tempfile.mkdtemp())
    t0 = time.time()
    b.build("samples.torch_models:tiny_mlp", Route.parse("-device=cuda"), tmp / "e.pt2")
    print(f"built in {time.time() - t0:.1f} s")
    p = subprocess.run([sys.executable, __file__, "--load", str(tmp / "e.pt2")],
                       capture_output=True, text=True, env={"PYTHONFAULTHANDLER": "1",
                                                            **__import__("os").environ})
    print("fresh-process load rc", p.returncode, p.stdout.strip()[-300:], p.stderr.strip()[-800:])


if __name__ == "__main__":
    main()
