"""Plain-torch AOTInductor check on CUDA: compile a Linear layer, then load the package in a
fresh process with aoti_load_package's variants (device_index, run_single_threaded).

    python3 bench/h200/diag_aoti.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import torch

if len(sys.argv) > 2:
    kw = {"device_index": 0} if sys.argv[2] == "device0" else (
        {"run_single_threaded": True} if sys.argv[2] == "single" else {})
    f = torch._inductor.aoti_load_package(sys.argv[1], **kw)
    print(sys.argv[2], "fresh load ok", f(torch.randn(2, 64, device="cuda")).shape)
    sys.exit(0)

m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()).cuda().eval()
ep = torch.export.export(m, (torch.randn(2, 64, device="cuda"),))
path = os.path.join(tempfile.mkdtemp(), "m.pt2")
t0 = time.time()
torch._inductor.aoti_compile_and_package(ep, package_path=path)
print(f"built {time.time() - t0:.1f}s", flush=True)
for variant in ("default", "device0", "single"):
    p = subprocess.run([sys.executable, __file__, path, variant], capture_output=True, text=True,
                       env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    print(variant, "rc", p.returncode, p.stdout.strip()[-200:], flush=True)
try:
    f = torch._inductor.aoti_load_package(path)
    print("same-process load ok", f(torch.randn(2, 64, device="cuda")).shape)
except Exception as exc:  # noqa: BLE001
    print("same-process load failed", exc)
