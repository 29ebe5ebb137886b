"""Time the warp-specialised Gluon prefill kernel against the Triton kernel, with floors.

On the registry's bf16 prefill shapes (page 64 HND; ``--page16`` adds the same shapes at page 16,
which the Triton kernel serves), CUDA-graph replay medians (``do_bench``, L2 flushed), with a bf16
matmul ceiling measured in the same process before and after. Variants:

* ``old``: the Triton kernel (``KVATTN_GLUON=0``); ``new``: the Gluon kernel as shipped;
* ``pp``: with ping-pong; ``s3``: 3 buffers a ring; ``n64``: 64-key tiles (4 buffers);
* floor: ``stageonly`` (quantised caches: the staging pass alone, the attention kernel not
  launched). (The kernel's own timing floors, a ``MODE`` switch, are gone: shipped kernels carry no
  experiment switches; lab/notes/prefill.md keeps the floors measured with them.)
* quantised caches: ``nostage`` (pages not staged: fp8 through the converter partition, NVFP4 on
  the Triton kernel); ``stage`` (staged whatever the query rows, where they fit the workspace);
  ``qk3`` (fp8 query, V staged: 3 buffers a ring).

``--fp8`` adds the quantised-cache shapes (a bf16 query over an fp8 or NVFP4 cache, an fp8 query
and cache; at 1 x 8192, 4 x 2048 and the chunked 4 x 512 over 16384). The workspace (128 MiB)
holds their staged pages, so ``new`` stages them.

Before timing, each shape's output of ``new`` is compared with ``old`` (relative error).

Usage (on the device, from the repository root)::

    PYTHONPATH=src python lab/probes/bench_prefill_ws.py --out $OUT/ws.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import time

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

import torch  # noqa: E402

from benchmarks import ceilings, problems, shapes  # noqa: E402
from kvattn.benchmarking.timing import Timer  # noqa: E402

VARIANTS = ("old", "new", "pp", "s3", "n64", "nostage", "stage", "stageonly", "qk3")
QUANTISED_ONLY = ("nostage", "stage", "stageonly", "qk3")  # variants of quantised caches alone


@contextlib.contextmanager
def _variant(name: str, head_dim: int):
    from kvattn.ops.prefill import configs as prefill_configs
    from kvattn.ops.prefill import plan as prefill_plan
    from kvattn.ops.prefill import plan_gluon_ws as prefill_ws
    from kvattn.ops.prefill import staging

    saved_env = os.environ.get("KVATTN_GLUON")
    saved_cfg = prefill_configs._SM90_WS.get(head_dim)
    saved_qk = prefill_configs._SM90_WS_FP8.get(("fp8qk", head_dim))
    saved_launch = prefill_ws.launch
    saved_geometry = staging.geometry
    saved_rows = dict(prefill_configs.STAGE_MIN_ROWS)
    if name not in VARIANTS + ("nopp", "s4"):
        raise ValueError(f"unknown variant {name!r}")
    try:
        if name == "old":
            os.environ["KVATTN_GLUON"] = "0"
        elif name in ("pp", "nopp"):
            prefill_configs._SM90_WS[head_dim] = dataclasses.replace(saved_cfg, pingpong=name == "pp")
        elif name in ("s3", "s4"):
            prefill_configs._SM90_WS[head_dim] = dataclasses.replace(saved_cfg, stages=int(name[1]))
        elif name == "n64":
            prefill_configs._SM90_WS[head_dim] = dataclasses.replace(saved_cfg, block_n=64, stages=4)
        elif name == "nostage":  # quantised caches: no staging (fp8: the converter; NVFP4: Triton)
            staging.geometry = lambda *a, **k: None
        elif name in ("stage", "stageonly", "qk3"):  # pages staged whatever the rows (where they fit)
            prefill_configs.STAGE_MIN_ROWS.update(dict.fromkeys(prefill_configs.STAGE_MIN_ROWS, 0))
            if name == "stageonly":  # floor: the staging pass alone (the attention kernel not launched)
                prefill_ws.launch = lambda *a, **k: lambda call: None
        if name == "qk3":  # fp8 query, V staged: 3 buffers a ring
            prefill_configs._SM90_WS_FP8[("fp8qk", head_dim)] = dataclasses.replace(saved_qk, stages=3)
        prefill_plan._PLANS.clear()  # (plans hold the tables and routes as they were made)
        yield
    finally:
        prefill_plan._PLANS.clear()
        prefill_ws.launch = saved_launch
        staging.geometry = saved_geometry
        prefill_configs.STAGE_MIN_ROWS.update(saved_rows)
        if saved_qk is not None:
            prefill_configs._SM90_WS_FP8[("fp8qk", head_dim)] = saved_qk
        if saved_cfg is not None:
            prefill_configs._SM90_WS[head_dim] = saved_cfg
        if saved_env is None:
            os.environ.pop("KVATTN_GLUON", None)
        else:
            os.environ["KVATTN_GLUON"] = saved_env


def _grid(page16: bool, fp8: bool = False) -> list:
    grid = [s for s in shapes._prefill_grid() if s.q_dtype == "bfloat16" and s.kv_dtype == "bfloat16"]
    if page16:
        grid += [dataclasses.replace(s, page_size=16) for s in grid]
    if fp8:
        base = [s for s in grid if s.page_size == 64 and s.q_len in (8192, 2048)]
        base += [s for s in shapes._prefill_grid() if s.q_len == 512 and s.kv_len == 16384]  # chunked
        grid += [dataclasses.replace(s, kv_dtype="fp8", peers=False) for s in base]
        grid += [dataclasses.replace(s, kv_dtype="fp8", q_dtype="fp8", peers=False) for s in base]
        grid += [dataclasses.replace(s, kv_dtype="nvfp4", peers=False) for s in base]
    return grid


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--page16", action="store_true", help="also the shapes at page 16")
    ap.add_argument("--fp8", action="store_true", help="also fp8-cache shapes (bf16 and fp8 queries)")
    ap.add_argument("--filter", action="append", default=[])
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--workspace-mib", type=int, default=128, help="the workspace (staged pages must fit it)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    # Every call planned afresh: a call replayed from the call cache would keep the launch of the
    # first variant that made it.
    os.environ["KVATTN_CALL_CACHE"] = "0"
    device = torch.device("cuda")
    timer = Timer(device, warmup_ms=25, rep_ms=args.rep)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    doc = {"env": {"date": time.strftime("%Y-%m-%d %H:%M"), "device": torch.cuda.get_device_name(device),
                   "torch": torch.__version__}, "records": []}
    import triton

    doc["env"]["triton"] = triton.__version__
    mm = [ceilings._matmul_tflops(device, 8192, 0.5, fp8=False)]
    print(f"bf16 matmul 8192^3: {mm[0]:.1f} TFLOP/s", flush=True)
    for shape in _grid(args.page16, args.fp8):
        if args.filter and not any(f in shape.id for f in args.filter):
            continue
        prob = problems.build(shape, device, l2_bytes=l2, workspace_mib=args.workspace_mib)
        fns = [s.kvattn for s in prob.sets]
        names = [v for v in args.variants.split(",") if v]
        if shape.kv_dtype == "bfloat16":  # (nothing to convert; pages under 64 tokens may be staged)
            names = [n for n in names if n not in QUANTISED_ONLY or (shape.page_size < 64 and n != "noconvert"
                                                                   and n != "qk3")]
        elif shape.kv_dtype == "nvfp4":  # (no converter; staged or Triton)
            names = [n for n in names if n not in ("noconvert", "qk3")]
        if shape.q_dtype != "fp8":
            names = [n for n in names if n != "qk3"]
        if "old" in names and "new" in names:
            with _variant("old", shape.head_dim):
                ref = fns[0]().float().clone()
            with _variant("new", shape.head_dim):
                got = fns[0]().float()
            err = ((got - ref).norm() / ref.norm()).item()
            print(f"{shape.id:40s} new vs old: relative difference {err:.2e}", flush=True)
            doc["records"].append({"shape": shape.id, "check_new_vs_old": err})
        for name in names:
            try:
                us = timer.graph(fns, context=functools.partial(_variant, name, shape.head_dim))
            except Exception as exc:  # noqa: BLE001 - a failing variant is reported, the loop goes on
                print(f"{shape.id:40s} {name:10s} FAILED {type(exc).__name__}: {exc}"[:400], flush=True)
                doc["records"].append({"shape": shape.id, "variant": name, "error": str(exc)[:400]})
                continue
            tflops = prob.work.flops / us * 1e-6
            print(f"{shape.id:40s} {name:10s} {us:9.1f} us {tflops:7.1f} TFLOP/s {tflops / mm[0]:5.3f} of matmul",
                  flush=True)
            doc["records"].append({"shape": shape.id, "variant": name, "graph_us": us, "tflops": tflops})
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(doc, f, indent=1)
        del prob, fns
        torch.cuda.empty_cache()
    mm.append(ceilings._matmul_tflops(device, 8192, 0.5, fp8=False))
    doc["env"]["matmul_bf16_tflops"] = mm
    print(f"bf16 matmul 8192^3 (before / after): {mm[0]:.1f} / {mm[1]:.1f} TFLOP/s", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
