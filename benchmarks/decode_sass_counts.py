"""Per-tile SASS instruction counts of the decode kernel's key loop, by category, for the launch
the plan builds for one sweep row or one single-decode call (compile-only: no GPU; Triton's
pipeline for sm_90a and the nvdisasm Triton ships).

The plan is that of a faked 132-SM H200 (sm90's tables; launches recorded, not run:
``tests/ops/decode/test_balanced_plan.py``), with what a GPU launch would change on top: the fp8
words format (the interpreter cannot run inline PTX) and PDL. The key loop is the innermost
backward branch holding the HMMAs; each of its instructions is counted once (one iteration = one
BLOCK_N-key tile) and put in a category by its opcode and the source line nvdisasm gives it.

Usage (from the repository root)::

    PYTHONPATH=src python benchmarks/decode_sass_counts.py --fmt fp8 --fmt bfloat16
    PYTHONPATH=src python benchmarks/decode_sass_counts.py --fmt fp8 --set SWAP_AB=True --dump /tmp/sass
    PYTHONPATH=src python benchmarks/decode_sass_counts.py --single 32768 --pos ROPE_LLAMA --pos NONE
    PYTHONPATH=src python benchmarks/decode_sass_counts.py --fmt bfloat16 --shape "decode bf16 64x8192 p64 HND"
    PYTHONPATH=src python benchmarks/decode_sass_counts.py --shape "sw07 decode bf16 ragged22x[1,88289] p16 NHD h8/1"

``--shape ID``: a sweep or grid row by its id (``benchmarks/sweep.py``, ``benchmarks/shapes.py``) with its
own lengths, ragged rows too, planned as ``benchmarks/timeline.py`` plans it (the row's cache format
unless ``--fmt`` names one).

``--single L``: ``single_decode_with_kv_cache`` (32 / 32 heads, D 128, bfloat16, contiguous) over L
keys, planned as a CUDA-graph capture on the faked H200 (``tma_readable``'s facts: capture, TMA,
compiled); a plan that reads by TMA compiles with its tensor descriptors and the L2 hint's PTX
rewrite, as the launcher does. RoPE's own work is counted apart by source file: ``rope`` (the
query rotated per key and turned per tile: ``common/positions.py``) and ``diagonal``
(``tile_diagonal``: ``common/tiles.py``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent

# sw36: 24 requests x 48740 keys, pages of 16, HND, 64 query heads over 8 KV heads, D 128
SW36 = dict(batch=24, max_len=48740, page=16, num_heads=64, num_kv_heads=8, layout="HND")
H200_BANDWIDTH = 2 * 3201e6 * 6016 / 8  # what an H200's driver reports: 4.81 TB/s

CATEGORIES = ("copy", "address", "shared", "barrier", "convert", "mma", "p_pack", "softmax", "mask", "moves",
              "loop", "rope", "diagonal")
# single_decode_with_kv_cache's shape (--single): 32 query heads over 32 KV heads, D 128, bfloat16
SINGLE = dict(num_heads=32, num_kv_heads=32, head_dim=128)


# The faked launches run in a subprocess: the plan needs TRITON_INTERPRET (CPU tensors), the compile
# must not see it. The decode plan of a 132-SM H200 (sm90's tables, 60 MB of L2, the bandwidth its
# driver reports), launches recorded, not run; the last argument is that bandwidth. (Paged rows:
# benchmarks/timeline.py's faked_h200_launch; single decode: this set-up.)
_FAKED_H200 = r"""
import json, os, sys
os.environ.update(TRITON_INTERPRET="1", KVATTN_FUSED_MERGE="1", KVATTN_CALL_CACHE="0", KVATTN_BACKEND="triton")
import torch
from kvattn.ops.decode import plan as P
from kvattn.runtime import fast_launch
P.arch = lambda device, interpreter: "sm90"
P._device.sm_count = lambda d: 132
P._device.l2_bytes = lambda d: 60 << 20
P._device.memory_bandwidth = lambda d, bw=float(sys.argv[-1]): bw
fast_launch.Launch.__call__ = lambda self, call: None
P._PLANS.clear()


def _split_launch_json(span):
    (plan,) = P._PLANS.values()
    split = plan.launches(span)[0]
    return json.dumps(dict(constexprs=split.constexprs, options=split.options, grid=list(split.grid)))
"""


def _launch_in_subprocess(code: str, *args: str) -> dict:
    """The JSON line ``code`` prints last, run with ``args`` and the H200's bandwidth."""
    res = subprocess.run([sys.executable, "-c", code, *args, str(H200_BANDWIDTH)], env=dict(os.environ),
                         capture_output=True, text=True, cwd=ROOT)  # (ROOT: `benchmarks` importable)
    if res.returncode:
        raise RuntimeError(res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def faked_plan_launch(fmt: str, row: dict = SW36) -> dict:
    """``{"constexprs", "options", "grid"}`` of the split launch the decode plan builds for ``row`` on
    a faked H200 (run in a subprocess: the plan needs TRITON_INTERPRET, the compile must not)."""
    code = r"""
import json, sys
from benchmarks import timeline
from benchmarks.shapes import Shape
fmt, row, bw = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3])
shape = Shape("decode", row["batch"], row["max_len"], num_qo_heads=row["num_heads"], num_kv_heads=row["num_kv_heads"],
              page_size=row["page"], layout=row["layout"], kv_dtype="fp8" if fmt == "fp8" else "bfloat16",
              head_dim=row.get("head_dim", 128))
split = timeline.faked_h200_launch(shape, bw)
print(json.dumps(dict(constexprs=split.constexprs, options=split.options, grid=list(split.grid))))
"""
    return _launch_in_subprocess(code, fmt, json.dumps(row))


def faked_shape_launch(shape_id: str) -> dict:
    """``{"constexprs", "options", "grid"}`` of the split launch the decode plan builds for the sweep or
    grid row whose id is ``shape_id`` (its own lengths: ragged rows too; see :func:`faked_plan_launch`)."""
    code = r"""
import json, sys
from benchmarks import shapes, sweep, timeline
want, bw = sys.argv[1], float(sys.argv[2])
(shape,) = [s for s in list(sweep.SWEEP) + list(shapes.GRID) if s.id == want]
split = timeline.faked_h200_launch(shape, bw)
print(json.dumps(dict(constexprs=split.constexprs, options=split.options, grid=list(split.grid))))
"""
    return _launch_in_subprocess(code, shape_id)


def faked_single_launch(length: int, pos: str, graph_capture: bool = True) -> dict:
    """``{"constexprs", "options", "grid"}`` of ``single_decode_with_kv_cache``'s split launch over
    ``length`` keys (``pos``: NONE / ROPE_LLAMA) on the faked H200, as a CUDA-graph capture plans
    it (``graph_capture``; the plan's TMA rules see a compiled launch on a GPU with TMA)."""
    code = _FAKED_H200 + r"""
L, rope, capture, shape = int(sys.argv[1]), sys.argv[2] == "ROPE_LLAMA", sys.argv[3] == "1", json.loads(sys.argv[4])
P._device.has_tma = lambda d: True
P.capturing = lambda d: capture
P._env.triton_interpret = lambda: False  # (a compiled launch: the TMA rules)
fast_launch.Launch.warmup = lambda self, call: None
q = torch.empty(shape["num_heads"], shape["head_dim"], dtype=torch.bfloat16)
k = torch.empty(L, shape["num_kv_heads"], shape["head_dim"], dtype=torch.bfloat16)
P.launch_decode(q, k, torch.empty_like(k), torch.empty_like(q), paged=False, rope=rope)
print(_split_launch_json(L))
"""
    return _launch_in_subprocess(code, str(length), pos, "1" if graph_capture else "0", json.dumps(SINGLE))


_COMPILE = r"""
import base64, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kvattn.ops.decode.kernels import SPLIT_TUPLES, decode_split_kernel as fn
case = json.loads(sys.argv[1])
DESCS = case.get("descs", {})
PTRS = {"k_table_ptr": "*i32", "v_table_ptr": "*i32", "seq_lens_ptr": "*i32", "kv_start_ptr": "*i32",
        "mask_ptr": "*i16", "sinks_ptr": "*fp32", "logit_scale_ptr": "*fp32", "out_scale_ptr": "*fp32",
        "lse_ptr": "*fp32", "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "counter_ptr": "*i32",
        "k_sf_ptr": "*u8", "v_sf_ptr": "*u8", "k_ptr": case["kv_ptr"], "v_ptr": case["kv_ptr"]}
FLOATS = ("logit_factor", "out_factor", "soft_cap_value", "rope_theta", "rope_scale")
c = case["constexprs"]
sig, attrs, constexprs = {}, {}, {}
def typed(arg, path):
    if arg in c:
        constexprs[path] = c[arg]
        return "constexpr"
    if arg in DESCS:
        return DESCS[arg]
    if arg.endswith("_ptr"):
        attrs[path] = [["tt.divisibility", 16]]
        return PTRS.get(arg, "*bf16")
    if arg.startswith("stride"):
        attrs[path] = [["tt.divisibility", 16]]
    return "fp32" if arg in FLOATS else "i32"
for i, arg in enumerate(fn.arg_names):
    members = SPLIT_TUPLES.get(arg)
    if members is None:
        sig[arg] = typed(arg, (i,))
    elif all(m in c for m in members):
        sig[arg] = "constexpr"
        constexprs[(i,)] = tuple(c[m] for m in members)
    else:
        sig[arg] = tuple(typed(m, (i, j)) for j, m in enumerate(members))
import contextlib
if case.get("ptx_hints"):  # the launcher's PTX rewrite of hinted TMA copies (fast_launch.Launch ptx_hints)
    from kvattn.runtime.ptx_hints import applied as scope
else:
    scope = contextlib.nullcontext
with scope():
    ck = triton.compile(ASTSource(fn, signature=sig, attrs=attrs, constexprs=constexprs),
                        target=GPUTarget("cuda", 90, 128),
                        options={"num_warps": case["warps"], "num_stages": case["stages"], **case.get("options", {})})
print(json.dumps({"cubin": base64.b64encode(ck.asm["cubin"]).decode(), "ptx": ck.asm["ptx"],
                  "ttgir": ck.asm["ttgir"], "shared": ck.metadata.shared}))
"""


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_launch(fmt: str, launch: dict, sets: dict, options: dict | None = None) -> dict:
    """``{"sass" (nvdisasm -g: source lines), "ptx", "ttgir", "shared", "reg", "stack"}``
    (``options``: compile options over the launch's, e.g. ``num_stages`` or ``maxnreg``)."""
    import base64

    from kvattn._formats_table import BY_NAME

    c = dict(launch["constexprs"], USE_PDL=True)  # (a GPU launch: the interpreter plan turns PDL off)
    if fmt == "fp8":
        c["KV_FORMAT"] = BY_NAME["fp8"].words_code  # the GPU's code for an aligned cache
    c.update(sets)
    options = dict(options or {})
    case = dict(constexprs=c, warps=options.pop("num_warps", launch["options"]["num_warps"]),
                stages=options.pop("num_stages", launch["options"]["num_stages"]), options=options,
                kv_ptr="*fp8e4nv" if fmt == "fp8" else "*bf16")
    if c.get("KV_TMA"):  # tensor descriptors of [Hkv, L, D] (plan.tma_descriptors): K's halves apart under RoPE
        d, bn = c["HEAD_DIM"], c["BLOCK_N"]
        kw = d // 2 if c["ROPE"] and c["GROUP"] * c["Q_LEN"] == 1 else d
        case["descs"] = {"k_ptr": f"tensordesc<bf16[1, {bn}, {kw}]>", "v_ptr": f"tensordesc<bf16[1, {bn}, {d}]>"}
        case["ptx_hints"] = bool(c["KV_EVICT_FIRST"])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(case)], env=env, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(res.stderr[-3000:])
    got = json.loads(res.stdout.strip().splitlines()[-1])
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(base64.b64decode(got.pop("cubin")))
        f.flush()
        got["sass"] = subprocess.run([_tool("nvdisasm"), "-g", "-c", f.name], capture_output=True, text=True).stdout
        usage = subprocess.run([_tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True).stdout
    got.update({k.lower(): int(v) for k, v in re.findall(r"(REG|STACK):(\d+)", usage)})
    got["constexprs"] = c
    got["warps"] = case["warps"]
    return got


_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")


def instructions(sass: str) -> tuple[list, dict]:
    """``(address, instruction text, "file:line")`` of every instruction, in order, and the
    address of each label."""
    out, labels, pending, where = [], {}, [], "?"
    for line in sass.splitlines():
        m = _LINE.search(line)
        if m:
            where = f"{os.path.basename(m.group(1))}:{m.group(2)}"
            continue
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _INSTR.search(line)
        if m:
            addr = int(m.group(1), 16)
            for name in pending:
                labels[name] = addr
            pending = []
            out.append((addr, m.group(2).strip(), where))
    return out, labels


def key_loop(ins: list, labels: dict) -> list:
    """The innermost loop (a backward branch's span) holding an HMMA."""
    best = None
    for addr, text, _ in ins:
        m = re.search(r"\bBRA\s+`\((\.L_x_\d+)\)", text)
        if not m or labels.get(m.group(1), addr) >= addr:
            continue
        target = labels[m.group(1)]
        body = [x for x in ins if target <= x[0] <= addr]
        if any("HMMA" in x[1] for x in body) and (best is None or len(body) < len(best)):
            best = body
    return best or []


def _opcode(text: str) -> str:
    text = re.sub(r"^@!?U?P\w+\s+", "", text)
    return text.split()[0]


def category(text: str, where: str) -> str:
    op = _opcode(text)
    base = op.split(".")[0]
    src = where.split(":")[0]
    if src == "positions.py":  # RoPE: the query rotated per key, turned per tile
        return "rope"
    if src == "tiles.py" and where in _DIAGONAL_LINES:
        return "diagonal"
    if base in ("LDGSTS", "LDG", "LDGDEPBAR", "DEPBAR"):
        return "copy"
    if base in ("LDS", "STS", "LDSM", "STSM"):
        return "shared"
    if base == "BAR":
        return "barrier"
    if base in ("HMMA", "HGMMA"):
        return "mma"
    if op.startswith("F2FP.F16.E4M3") or base == "PRMT":
        return "convert"
    if op.startswith("F2FP") and "PACK_AB" in op:
        return "p_pack"
    if base in ("MUFU", "FMNMX", "SHFL", "FADD", "FMUL", "FFMA", "FSETP"):
        return "softmax"
    if base in ("FSEL", "SEL"):
        return "mask"
    if op in ("IMAD.MOV.U32", "MOV", "IMAD.MOV") or base == "MOV":
        return "moves"
    if base in ("BRA", "NOP", "P2R", "R2P", "LDC") or base.startswith("U"):
        return "loop"
    if base in ("ISETP", "PLOP3"):
        return "mask" if src in ("kernels.py", "softmax_merge.py") else "address"
    return "address"  # IMAD / IADD3 / LEA / SHF / LOP3 / VIADD / SGXT / VIMNMX: integer arithmetic


def _function_lines(module: str, name: str) -> set:
    """``"file.py:line"`` of every line of ``module``'s function ``name`` (source-line categories)."""
    import importlib
    import inspect

    fn = getattr(importlib.import_module(module), name)
    fn = getattr(fn, "fn", fn)
    lines, first = inspect.getsourcelines(fn)
    base = os.path.basename(inspect.getsourcefile(fn))
    return {f"{base}:{first + i}" for i in range(len(lines))}


try:
    _DIAGONAL_LINES = _function_lines("kvattn.ops.common.tiles", "tile_diagonal")
except Exception:  # pragma: no cover (a tree without it)
    _DIAGONAL_LINES = set()


def tile_counts(got: dict) -> dict:
    body = key_loop(*instructions(got["sass"]))
    cats = collections.Counter(category(t, w) for _, t, w in body)
    ops = collections.Counter(_opcode(t) for _, t, _ in body)
    lines = collections.Counter(w for _, _, w in body)
    return dict(total=len(body), categories=dict(cats), opcodes=dict(ops), lines=dict(lines),
                block_n=got["constexprs"]["BLOCK_N"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fmt", action="append", default=[], help="fp8 / bfloat16 (repeatable)")
    ap.add_argument("--single", type=int, default=0, help="single decode over this many keys (bfloat16, 32/32 heads)")
    ap.add_argument("--pos", action="append", default=[], help="with --single: NONE / ROPE_LLAMA (repeatable)")
    ap.add_argument("--eager", action="store_true", help="with --single: the eager plan (no graph capture)")
    ap.add_argument("--json", help="write the counts here (with --single)")
    ap.add_argument("--set", action="append", default=[], help="CONSTEXPR=VALUE over the plan's (JSON value)")
    ap.add_argument("--option", action="append", default=[],
                    help="compile option over the launch's: num_stages=N, num_warps=N, maxnreg=N")
    ap.add_argument("--row", default=None,
                    help="JSON row (batch, max_len, page, num_heads, num_kv_heads, layout; head_dim: 128 unless given)")
    ap.add_argument("--shape", help="a sweep or grid row's id (e.g. 'decode bf16 64x8192 p64 HND', a ragged row "
                    "too) instead of --row, counted in its cache format unless --fmt names one")
    ap.add_argument("--dump", help="folder for the SASS / PTX / TTGIR")
    ap.add_argument("--lines", type=int, default=0, help="print the N busiest source lines")
    args = ap.parse_args(argv)
    sets = {}
    for s in args.set:
        k, v = s.split("=", 1)
        sets[k] = json.loads(v.lower() if v in ("True", "False") else v)
    options = {k: int(v) for k, v in (o.split("=", 1) for o in args.option)}
    row = json.loads(args.row) if args.row else SW36
    if args.single:
        cases = [(pos, "bfloat16", faked_single_launch(args.single, pos, not args.eager))
                 for pos in args.pos or ["ROPE_LLAMA", "NONE"]]
    else:
        default = "fp8"
        if args.shape:  # the row's own cache format
            from benchmarks import shapes, sweep

            (shape,) = [s for s in list(sweep.SWEEP) + list(shapes.GRID) if s.id == args.shape]
            default = "fp8" if shape.kv_dtype == "fp8" else "bfloat16"
        cases = [(fmt, fmt, None) for fmt in args.fmt or [default]]
    report = {}
    for name, fmt, launch in cases:
        if launch is None:
            launch = faked_shape_launch(args.shape) if args.shape else faked_plan_launch(fmt, row)
        got = compile_launch(fmt, launch, sets, options)
        counts = tile_counts(got)
        if args.dump:
            os.makedirs(args.dump, exist_ok=True)
            for ext in ("sass", "ptx", "ttgir"):
                with open(os.path.join(args.dump, f"{name}.{ext}"), "w") as f:
                    f.write(got[ext])
        per128 = 128 / counts["block_n"]
        c = got["constexprs"]
        report[name] = dict(counts, reg=got.get("reg"), stack=got.get("stack"), shared=got["shared"],
                            warps=got["warps"], stages=options.get("num_stages", launch["options"]["num_stages"]),
                            grid=launch["grid"], options=options,
                            kv_tma=bool(c.get("KV_TMA")), rope=bool(c.get("ROPE")), sets=sets)
        print(f"== {name}: grid {launch['grid']}, KV_TMA {bool(c.get('KV_TMA'))}, BLOCK_N {counts['block_n']}, {got['warps']} warps, stages "
              f"{options.get('num_stages', launch['options']['num_stages'])}, regs {got.get('reg')}, stack {got.get('stack')}, "
              f"smem {got['shared']} B; loop {counts['total']} instructions a tile "
              f"({counts['total'] * per128:.0f} a 128 keys)")
        for cat in CATEGORIES:
            print(f"  {cat:8s} {counts['categories'].get(cat, 0):5d}")
        print("  opcodes:", ", ".join(f"{k} {v}" for k, v in sorted(counts["opcodes"].items(), key=lambda x: -x[1])))
        if args.lines:
            for w, n in sorted(counts["lines"].items(), key=lambda x: -x[1])[:args.lines]:
                print(f"    {n:4d} {w}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
