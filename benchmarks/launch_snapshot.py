"""Every kernel launch's arguments over a fixed set of calls, on a faked GPU: the host side's twin of
``ptx_snapshot.py``, to prove a change of the launchers hands every kernel the same arguments.

Each call of :func:`calls` (the five functions' forms, ``tests/runtime/test_call_cache.py``'s
cases among them, Hopper's Gluon and TMA routes planned on a faked Hopper as its ``fake_hopper``
does, staged prefill pages, merges, local lengths, ragged drafts) runs twice, every launch through
``kernel[grid](...)`` (``KVATTN_FAST_LAUNCH=0``, the call cache off), and each launch is recorded as
Triton's ``JITFunction.run`` receives it: the kernel, the grid, the options and every parameter by
name; a tensor as its dtype, shape, strides and which of the launch's tensors it shares memory with
(data pointers differ from run to run), a tensor descriptor as its class, its base so, its shape,
strides, block shape, layout and padding; a scalar as its type and value; a tuple parameter
(``TUPLES``) as its members, each by its name. The faked GPU is
``tests/runtime/test_fast_launch.py``'s ``FakeGPU`` (Triton's own binding and keys, no kernel runs);
merges, local lengths and ragged drafts run in the interpreter.

Usage (from the repository root, any machine, about a minute)::

    PYTHONPATH=src python benchmarks/launch_snapshot.py --out before.json      # on the old tree
    PYTHONPATH=src python benchmarks/launch_snapshot.py --out after.json
    PYTHONPATH=src python benchmarks/launch_snapshot.py --compare before.json after.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import sys

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "launch_pdl")
# Kernels with tuple parameters: where their members are named. A tuple is recorded as its members,
# each by its name, as a flat parameter of that name would be (Triton hands the GPU the members).
TUPLES = {
    "decode_split_kernel": "kvattn.ops.decode.kernels.SPLIT_TUPLES",
    "context_kernel": "kvattn.ops.prefill.kernels.CONTEXT_TUPLES",
}


def _tuples(kernel: str) -> dict:
    """The tuple parameters of the kernel named ``kernel``, each by its members' names."""
    import importlib

    if kernel not in TUPLES:
        return {}
    module, attr = TUPLES[kernel].rsplit(".", 1)
    return getattr(importlib.import_module(module), attr)


def _seen(value, memory: dict):
    """A launch argument as the snapshot keeps it (see the module docstring)."""
    import torch

    if isinstance(value, torch.Tensor):
        return ["tensor", str(value.dtype), list(value.shape), list(value.stride()),
                memory.setdefault(value.data_ptr(), len(memory))]
    base = getattr(value, "base", None)
    if base is not None and hasattr(value, "block_shape"):
        return ["descriptor", f"{type(value).__module__}.{type(value).__name__}", str(base.dtype), list(base.shape),
                list(base.stride()), memory.setdefault(base.data_ptr(), len(memory)), list(value.shape),
                list(value.strides), list(value.block_shape), repr(getattr(value, "layout", None)), value.padding]
    if value is None or isinstance(value, (bool, int, float, str)):
        return [type(value).__name__, value]
    return [type(value).__name__, repr(value)]


def _recording(records: list):
    """Wrap Triton's ``run`` of compiled and interpreted kernels to append each launch to ``records``."""
    import triton.runtime.jit as jit
    from triton.runtime.interpreter import InterpretedFunction

    def wrap(real):
        def run(self, *args, grid, warmup, **kwargs):
            fn = self.fn
            named = inspect.signature(fn).bind(*args, **{k: v for k, v in kwargs.items() if k not in OPTIONS})
            memory: dict = {}
            tuples = _tuples(fn.__name__)
            flat = {}
            for k, v in named.arguments.items():
                if k in tuples and isinstance(v, tuple) and len(v) == len(tuples[k]):
                    flat.update(zip(tuples[k], v))
                else:
                    flat[k] = v
            records.append({
                "kernel": fn.__name__, "warmup": warmup,
                "grid": list(grid(named.arguments) if callable(grid) else grid),
                "options": {k: _seen(kwargs[k], {}) for k in sorted(kwargs) if k in OPTIONS},
                "args": {k: _seen(v, memory) for k, v in flat.items()},
            })
            return real(self, *args, grid=grid, warmup=warmup, **kwargs)

        return run

    return [(cls, cls.run, wrap(cls.run)) for cls in (jit.JITFunction, InterpretedFunction)]


def calls() -> dict:
    """``{name: (build, faked, hopper, env)}``: ``build()`` gives ``(fn, args, kwargs)``; ``faked``:
    on the faked GPU (else the interpreter); ``hopper``: planned for a faked Hopper."""
    import torch

    import kvattn
    from kvattn.formats import FP8_DTYPE
    from kvattn.testing import make_paged_kv
    from tests.runtime import test_call_cache as cases

    out = {name: (build, True, name in cases.HOPPER, {}) for name, build in cases.CASES.items()}

    def mla(hq=64, fp8=False, **kw):
        fn, args, kwargs = cases.mla_case(hq=hq, page=64)
        if fp8:
            args = (args[0].to(FP8_DTYPE), args[1].to(FP8_DTYPE), *args[2:])
        return fn, args, dict(kwargs, out=torch.empty(3, hq, 512, dtype=torch.bfloat16), **kw)

    def prefill_fp8(page=64, fp8_query=False):
        fn, args, kwargs = cases.prefill_case(page=page, lens=(3000, 700), lq=(500, 700))
        query = args[0].to(FP8_DTYPE) if fp8_query else args[0]
        return fn, (query, args[1].to(FP8_DTYPE), torch.zeros(1 << 26, dtype=torch.uint8), *args[3:]), kwargs

    def ragged():
        case = make_paged_kv([70, 40, 25], num_kv_heads=2, head_dim=64, page_size=16, dtype=torch.float16,
                             nan_fill=False)
        cu = torch.tensor([0, 2, 3, 6], dtype=torch.int32)
        return (kvattn.decode.xqa_batch_decode_with_kv_cache,
                (torch.randn(6, 8, 64, dtype=torch.float16), case.kv_cache, torch.zeros(1 << 22, dtype=torch.uint8),
                 case.block_tables, case.seq_lens, 70), dict(q_len_per_req=3, q_cu_seq_lens=cu))

    def local_lengths(window):
        from kvattn.ops.merge.plan import launch_local_lengths

        lens = torch.tensor([5, 700, 33, 0, 1000], dtype=torch.int32)
        got, start = torch.empty_like(lens), torch.empty_like(lens) if window else None
        return launch_local_lengths, (lens, got, start), dict(window_left=100 if window else -1, page=16, world=4,
                                                              rank=1, span_tokens=64, round_robin=True, last=False)

    interpreted = {"KVATTN_BACKEND": "triton"}
    out.update({
        "mla-gluon-lse-hopper": (lambda: mla(return_lse=True), True, True, {}),
        "mla-h16-hopper": (lambda: mla(hq=16), True, True, {}),
        "mla-h32-hopper": (lambda: mla(hq=32), True, True, {}),
        "mla-h128-hopper": (lambda: mla(hq=128), True, True, {}),
        "mla-gluon-not-ws-hopper": (mla, True, True, {"KVATTN_GLUON_WS": "0"}),
        "mla-fp8-hopper": (lambda: mla(fp8=True), True, True, {}),
        "prefill-causal-false": (lambda: cases.prefill_case(causal=False), True, False, {}),
        "prefill-gluon-window-sinks-hopper": (
            lambda: cases.prefill_case(window_left=50, sinks=torch.randn(8)), True, True, {}),
        "prefill-gluon-p16-hopper": (lambda: cases.prefill_case(page=16), True, True, {}),
        "prefill-fp8-staged-hopper": (prefill_fp8, True, True, {}),
        "prefill-fp8q-staged-hopper": (lambda: prefill_fp8(fp8_query=True), True, True, {}),
        "prefill-fp8-p16-staged-hopper": (lambda: prefill_fp8(page=16), True, True, {}),
        "prefill-fp8q-tma-hopper": (lambda: prefill_fp8(fp8_query=True), True, True, {"KVATTN_GLUON": "0"}),
        "merge-pair": (lambda: (kvattn.merge.merge_state, (torch.randn(5, 7, 64), torch.randn(5, 7),
                                                           torch.randn(5, 7, 64), torch.randn(5, 7)), {}),
                       False, False, interpreted),
        "merge-states": (lambda: (kvattn.merge.merge_states, (torch.randn(5, 3, 7, 64), torch.randn(5, 3, 7)), {}),
                         False, False, interpreted),
        "ragged-drafts": (ragged, False, False, interpreted),
        "local-lengths": (lambda: local_lengths(False), False, False, {}),
        "local-lengths-window": (lambda: local_lengths(True), False, False, {}),
    })
    return out


def snapshot(only: str | None = None) -> dict:
    """``{"cases": {name: [launch, ...]}}`` of every call of :func:`calls` (``only``: a regex of names)."""
    interpret = os.environ.get("TRITON_INTERPRET")  # (put back at the end: a test process goes on)
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import pytest
    import torch

    import tests.conftest  # noqa: F401  (every kernel module imported under the interpreter, as the tests do)
    from tests.runtime import test_call_cache as cases
    from tests.runtime.test_fast_launch import FakeGPU

    out = {}
    records: list = []
    wrapped = _recording(records)
    for cls, _, run in wrapped:
        cls.run = run
    try:
        for name, (build, faked, hopper, env) in calls().items():
            if only and not re.search(only, name):
                continue
            patch = pytest.MonkeyPatch()
            try:
                if faked:
                    FakeGPU(patch)
                for key, value in dict(env, KVATTN_FAST_LAUNCH="0", KVATTN_CALL_CACHE="0").items():
                    patch.setenv(key, value)
                if hopper:
                    cases.fake_hopper(patch)
                torch.manual_seed(0)
                fn, args, kwargs = build()
                del records[:]
                fn(*args, **kwargs)
                fn(*args, **kwargs)  # (the second call: what a cached plan hands)
                out[name] = list(records)
            finally:
                patch.undo()
    finally:
        for cls, real, _ in wrapped:
            cls.run = real
        if interpret is None:
            os.environ.pop("TRITON_INTERPRET", None)
    return {"cases": out}


def compare(a_path: str, b_path: str) -> int:
    """Print every call whose launches differ, and each differing argument; 1 if any do."""
    a, b = (json.load(open(p))["cases"] for p in (a_path, b_path))
    differ = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name}: only in {a_path if name in a else b_path}")
            differ += 1
            continue
        if a[name] == b[name]:
            continue
        differ += 1
        print(f"{name}: {len(a[name])} -> {len(b[name])} launches")
        for i, (x, y) in enumerate(zip(a[name], b[name])):
            for field in ("kernel", "warmup", "grid", "options", "args"):
                if x[field] == y[field]:
                    continue
                if isinstance(x[field], dict):
                    for key in sorted(set(x[field]) | set(y[field])):
                        if x[field].get(key) != y[field].get(key):
                            print(f"  launch {i} {field} {key}: {x[field].get(key)} -> {y[field].get(key)}")
                else:
                    print(f"  launch {i} {field}: {x[field]} -> {y[field]}")
    total = len(set(a) | set(b))
    print(f"{total - differ} of {total} calls launch identically "
          f"({sum(map(len, a.values()))} / {sum(map(len, b.values()))} launches)")
    return 1 if differ else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the snapshot JSON here")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="print where two snapshots differ")
    ap.add_argument("--only", help="regex of call names to run")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    text = json.dumps(snapshot(args.only), indent=0, default=str) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
