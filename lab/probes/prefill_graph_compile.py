"""Probe: which prefill kernel specialisation fails to compile when the fuzz's call is captured in
a CUDA graph (lab/notes/robustness.md, "Differential fuzzing on the GPU"). Replays the spec in
plain then graph mode, printing every specialisation compiled and, for a failing compile, the
source's signature, constexprs and attributes (and the MLIR reproducer, via TRITON_REPRODUCER_PATH)."""
import json
import sys
import traceback

from triton import knobs

from kvattn.fuzz import replay
from kvattn.ops.prefill import kernels as tri, kernels_gluon_ws as ws

spec = json.load(open(sys.argv[1]))["failures"][0]["spec"]
knobs.runtime.jit_post_compile_hook = lambda **kw: print("compiled:", kw.get("repr"), flush=True)


def wrap(kernel):
    inner = kernel.compile

    def compile(src, *a, **kw):
        try:
            return inner(src, *a, **kw)
        except Exception:
            print("FAILED compile of", getattr(src, "name", src), flush=True)
            for field in ("signature", "constexprs", "constants", "attrs"):
                print(f"  {field}:", getattr(src, field, None), flush=True)
            raise

    kernel.compile = compile


for mod in (tri, ws):
    for name in dir(mod):
        obj = getattr(mod, name)
        if hasattr(obj, "compile") and hasattr(obj, "fn"):
            wrap(obj)
for mode in ("plain", "graph"):
    print("== mode", mode, flush=True)
    try:
        print(replay(spec, mode=mode, device="cuda", mode_seed=1060411765))
    except BaseException:
        traceback.print_exc()
