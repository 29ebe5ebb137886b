"""FlashInfer's prebuild (``benchmarks/peers_flashinfer.py``) builds exactly the modules the timed
peers load, where their first use looks for them.

FlashInfer cannot be imported here, so the checks are on the key derivation and the build plumbing:
- a stand-in FlashInfer whose entry points derive their JIT module from the arguments they are
  handed, the way FlashInfer 0.7.2's do (written out here, not taken from the harness), records
  what the real peer builders ask for on CPU problems; that set must be the prebuild's;
- the module keys of a few sweep rows, written out by hand from FlashInfer's generators;
- the prebuild runs each module's ninja in that module's own build directory (where FlashInfer's
  first use runs it), never one ninja over all modules from the JIT directory, and keeps the nvcc
  processes within the limit;
- with ninja itself: a build run from a parent directory leaves the module directory's dry run
  dirty (the cause of the recompiles), a build in the module directory leaves it clean.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import peers_flashinfer as fi  # noqa: E402
from benchmarks import problems, run  # noqa: E402
from benchmarks.shapes import Shape  # noqa: E402
from benchmarks.sweep import SMOKE_SWEEP, SWEEP  # noqa: E402

CPU = torch.device("cpu")
SWEEP_TAG = ("sweep",)
NAMES = {torch.bfloat16: "bfloat16", torch.float8_e4m3fn: "fp8", torch.int32: "int32", torch.int64: "int64"}
POS = {"NONE": 0, "ROPE_LLAMA": 1}
GRID_DECODE = Shape("decode", 2, 33, page_size=16, num_qo_heads=4, num_kv_heads=2, head_dim=64)  # fa2-tc, fa2, xqa

# Small shapes of every kind the peers serve: the sweep's (bf16 on tensor cores at D 64 / 128 / 256,
# speculative rows, fp8 through XQA at pages of 16 / 32 / 64 and groups 1 / 4 / 8, MLA bf16 / fp8)
# and the grid's (CUDA-core decode, bf16 XQA with drafts, single decode with RoPE, FA3 prefill).
SHAPES = [
    *SMOKE_SWEEP,
    Shape("decode", 2, 40, page_size=32, num_qo_heads=4, num_kv_heads=2, head_dim=256, tags=SWEEP_TAG),
    Shape("decode", 3, 50, page_size=64, layout="HND", num_qo_heads=4, num_kv_heads=2, head_dim=64,
          ragged=True, len_seed=3, tags=SWEEP_TAG),
    Shape("spec_decode", 2, 40, q_len=3, page_size=16, layout="HND", num_qo_heads=4, num_kv_heads=2, tags=SWEEP_TAG),
    Shape("decode", 2, 70, page_size=16, kv_dtype="fp8", num_qo_heads=8, num_kv_heads=1, tags=SWEEP_TAG),
    Shape("decode", 2, 70, page_size=64, kv_dtype="fp8", layout="HND", num_qo_heads=16, num_kv_heads=2,
          tags=SWEEP_TAG),
    Shape("mla", 2, 40, num_qo_heads=16, num_kv_heads=1, head_dim=576, page_size=16, kv_dtype="fp8", q_dtype="fp8",
          tags=SWEEP_TAG),
    GRID_DECODE,
    Shape("decode", 2, 33, page_size=16, kv_dtype="fp8", num_qo_heads=4, num_kv_heads=2, head_dim=64),
    Shape("spec_decode", 2, 40, q_len=2, page_size=16, num_qo_heads=4, num_kv_heads=2, head_dim=64),
    Shape("single_decode", 1, 48, num_qo_heads=4, num_kv_heads=4, head_dim=64, pos_encoding_mode="ROPE_LLAMA"),
    Shape("prefill", 2, 40, q_len=8, page_size=16, num_qo_heads=4, num_kv_heads=2, head_dim=64),
]


class _DerivingFlashInfer:
    """FlashInfer's entry points reduced to the module each one loads, derived from what it is
    handed as FlashInfer 0.7.2 derives it (``asked`` collects them, as module keys)."""

    def __init__(self):
        asked = self.asked = []

        def name(dtype):
            return NAMES[dtype]

        class Decode:
            def __init__(self, ws, layout, use_tensor_cores=False, backend="auto"):
                assert backend == "fa2"
                self.tc = use_tensor_cores

            def plan(self, indptr, indices, last, hq, hkv, d, page, *, q_data_type, kv_data_type, o_data_type,
                     sm_scale, q_len_per_req, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None):
                cap = (logits_soft_cap or 0.0) > 0
                args = (name(q_data_type), name(kv_data_type), name(o_data_type), name(indptr.dtype), d, d,
                        POS[pos_encoding_mode], window_left != -1, cap)
                # tensor cores: get_batch_prefill_module("fa2", ...) -> its equal-stride primary module
                self.key = (("fa2-tc", "_gen_batch_prefill_primary_module", ("fa2", *args, False)) if self.tc
                            else ("fa2-decode", "gen_batch_decode_module", args))
                self.args = args
                asked.append(self.key)

            def run(self, q, kv, out):
                if self.tc and kv[0].stride() != kv[1].stride():  # run() then loads the independent-stride module
                    asked.append(("fa2-tc", "_gen_batch_prefill_independent_paged_module", ("fa2", *self.args, False)))
                return out

        class Prefill:
            def __init__(self, ws, layout, backend="auto"):
                assert backend == "fa3"

            def plan(self, qo_indptr, indptr, indices, last, hq, hkv, d, page, *, causal, sm_scale, q_data_type,
                     kv_data_type, o_data_type, pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None):
                asked.append(("fa3-prefill", "gen_batch_prefill_module",
                              ("fa3", name(q_data_type), name(kv_data_type), name(o_data_type), name(indptr.dtype),
                               d, d, POS[pos_encoding_mode], window_left != -1, (logits_soft_cap or 0.0) > 0, False)))

            def run(self, q, kv, out):
                return out

        def xqa_batch_decode_with_kv_cache(q, kv, ws, tables, seq, max_len, *, bmm1_scale, bmm2_scale, out,
                                           kv_layout, q_len_per_req, mask, window_left=-1):
            k = kv[0]
            heads, page = (k.shape[2], k.shape[1]) if kv_layout == "NHD" else (k.shape[1], k.shape[2])
            asked.append(("xqa", "gen_xqa_module", (name(q.dtype), name(k.dtype), page, q.shape[-1],
                                                    q.shape[-2] // heads, window_left >= 0, name(out.dtype),
                                                    q_len_per_req, False)))
            return out

        def single_decode_with_kv_cache(q, k, v, *, kv_layout, pos_encoding_mode, sm_scale, window_left=-1,
                                        logits_soft_cap=None):
            d = q.shape[-1]
            asked.append(("single", "gen_single_decode_module",
                          (name(q.dtype), name(k.dtype), name(q.dtype), d, d, POS[pos_encoding_mode],
                           window_left != -1, (logits_soft_cap or 0.0) > 0)))
            return torch.empty_like(q)

        class MLA:
            def __init__(self, ws, backend="auto"):
                assert backend == "fa3"

            def plan(self, *, metadata, num_heads, head_dim_ckv, head_dim_kpe, page_size, causal, sm_scale,
                     q_data_type, kv_data_type, output_dtype=None):
                out = q_data_type if output_dtype is None else output_dtype
                asked.append(("fa3-mla", "gen_batch_mla_module",
                              ("fa3", name(q_data_type), name(kv_data_type), name(out), name(metadata.qo_indptr.dtype),
                               head_dim_ckv, head_dim_kpe, False)))

            def run(self, *, query, kv_cache, out, **scales):
                return out

        class Meta:
            @staticmethod
            def csr(qo_indptr, kv_indptr, kv_indices, kv_len_arr):
                return types.SimpleNamespace(qo_indptr=qo_indptr)

        self.BatchDecodeWithPagedKVCacheWrapper = Decode
        self.BatchPrefillWithPagedKVCacheWrapper = Prefill
        self.decode = types.SimpleNamespace(xqa_batch_decode_with_kv_cache=xqa_batch_decode_with_kv_cache)
        self.single_decode_with_kv_cache = single_decode_with_kv_cache
        self.mla = types.SimpleNamespace(BatchMLAPagedAttentionWrapper=MLA, MLAPlanMetadata=Meta)


@pytest.fixture
def deriving_flashinfer(monkeypatch):
    fake = _DerivingFlashInfer()
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    monkeypatch.setitem(sys.modules, "flashinfer.mla", fake.mla)
    fi.reset_import_state()
    yield fake
    fi.reset_import_state()


def test_the_prebuild_builds_what_the_peers_ask_for(deriving_flashinfer):
    for shape in SHAPES:
        problem = problems.build(shape, CPU, l2_bytes=1 << 40, workspace_mib=16)
        for _, make in fi.variants(problem):
            for fn in make().fns:
                fn()
    asked = set(deriving_flashinfer.asked)
    assert asked == set(fi.variant_keys(SHAPES))
    kinds = {k[0] for k in asked}
    assert kinds == {"fa2-tc", "fa2-decode", "xqa", "single", "fa3-prefill", "fa3-mla"}  # every peer was asked


def test_a_call_off_the_prebuilt_arguments_is_refused(deriving_flashinfer):
    """A peer handed tensors its module key does not describe (here: an fp16 query) raises before
    FlashInfer sees them, instead of compiling an unlisted module in the timed phase."""
    problem = problems.build(GRID_DECODE, CPU, l2_bytes=1 << 40, workspace_mib=16)
    problem.sets[0].spec.native["q"] = problem.sets[0].spec.native["q"].half()
    assert len(list(fi.variants(problem))) == 3
    for _, make in fi.variants(problem):
        with pytest.raises(ValueError, match="query dtype torch.float16, expected bfloat16"):
            make()
    assert deriving_flashinfer.asked == []


@pytest.mark.parametrize("row, keys", [
    ("sw00 ", [("fa2-tc", "_gen_batch_prefill_primary_module",
                ("fa2", "bfloat16", "bfloat16", "bfloat16", "int32", 256, 256, 0, False, False, False))]),
    ("sw02 ", [("xqa", "gen_xqa_module", ("bfloat16", "fp8", 16, 128, 4, False, "bfloat16", 1, False))]),
    ("sw13 ", [("xqa", "gen_xqa_module", ("bfloat16", "fp8", 64, 128, 8, False, "bfloat16", 1, False))]),
    ("sw31 ", [("fa2-tc", "_gen_batch_prefill_primary_module",
                ("fa2", "bfloat16", "bfloat16", "bfloat16", "int32", 128, 128, 0, False, False, False))]),
    ("sw64 ", [("fa3-mla", "gen_batch_mla_module", ("fa3", "bfloat16", "fp8", "bfloat16", "int32", 512, 64, False))]),
], ids=["sw00-fa2-tc-D256", "sw02-xqa-fp8-p16-g4", "sw13-xqa-fp8-p64-g8", "sw31-spec-q3-fa2-tc", "sw64-mla-fp8"])
def test_sweep_rows_module_keys(row, keys):
    (shape,) = [s for s in SWEEP if s.id.startswith(row)]
    got = [k for name, _ in fi.kernels(shape)[0] for k in fi.modules(name, fi.fi_call(name, shape))]
    assert got == keys
    assert set(keys) <= set(fi.variant_keys(SWEEP))


def test_sweep_variants_are_the_rows_modules():
    keys = fi.variant_keys(SWEEP)
    per_row = {k for s in SWEEP for name, _ in fi.kernels(s)[0] for k in fi.modules(name, fi.fi_call(name, s))}
    assert set(keys) == per_row and len(keys) == len(per_row) == 11
    assert [fi.describe(k) for k in keys] == [
        "fa2-tc bf16 D128", "fa2-tc bf16 D256", "fa2-tc bf16 D64", "fa3-mla bf16", "fa3-mla fp8",
        "xqa fp8 p16 D128 g4", "xqa fp8 p16 D128 g8", "xqa fp8 p32 D128 g4", "xqa fp8 p32 D128 g8",
        "xqa fp8 p64 D128 g4", "xqa fp8 p64 D128 g8"]
    odd = ("fa2-tc", "_gen_batch_prefill_primary_module",
           ("fa2", "bfloat16", "bfloat16", "bfloat16", "int64", 128, 128, 0, True, False, False))
    assert fi.describe(odd) == "fa2-tc bf16 D128 (idx=int64, sliding_window)"


# -- the build plumbing, against a stand-in flashinfer.jit -----------------------------------------


class _Spec:
    def __init__(self, root: Path, generator: str, args: tuple, number: int):
        self.generator, self.args = generator, args
        self.name = f"{generator}_{number}"
        self.build_dir = root / self.name
        self.ninja_path = self.build_dir / "build.ninja"
        self.lock_path = root / f"{self.name}.lock"
        self.sources = [Path(f"{i}.cu") for i in range(10 if "prefill" in generator else 3)]

    def write_ninja(self):
        self.build_dir.mkdir(parents=True, exist_ok=True)
        self.ninja_path.write_text("")


@pytest.fixture
def jit_standin(monkeypatch, tmp_path):
    """``flashinfer`` with the JIT generators and ``run_ninja``: records each build's directory,
    ninja file and job count, and the most jobs running at once."""
    state = types.SimpleNamespace(specs=[], ninjas=[], running=0, most=0, lock=threading.Lock())

    def generator(gen_name):
        def make(*args):
            spec = _Spec(tmp_path, gen_name, args, len(state.specs))
            state.specs.append(spec)
            return spec
        return make

    def run_ninja(workdir, ninja_file, verbose, max_jobs=None):
        with state.lock:
            state.running += max_jobs
            state.most = max(state.most, state.running)
        time.sleep(0.02)
        with state.lock:
            state.running -= max_jobs
            state.ninjas.append((Path(workdir), Path(ninja_file), max_jobs))

    attention = types.SimpleNamespace(**{g: generator(g) for g in fi.GENERATOR_FIELDS if g != "gen_xqa_module"})
    jit = types.ModuleType("flashinfer.jit")
    mods = {
        "flashinfer": types.SimpleNamespace(jit=jit, __version__="stand-in"),
        "flashinfer.jit": jit,
        "flashinfer.jit.attention": types.SimpleNamespace(modules=attention),
        "flashinfer.jit.attention.modules": attention,
        "flashinfer.jit.xqa": types.SimpleNamespace(gen_xqa_module=generator("gen_xqa_module")),
        "flashinfer.jit.cpp_ext": types.SimpleNamespace(run_ninja=run_ninja),
    }
    jit.attention, jit.xqa, jit.cpp_ext = mods["flashinfer.jit.attention"], mods["flashinfer.jit.xqa"], \
        mods["flashinfer.jit.cpp_ext"]
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(fi, "up_to_date", lambda spec: spec.generator != "gen_xqa_module")
    monkeypatch.setenv("FLASHINFER_JIT_PREBUILD_MAX_JOBS", "12")
    fi.reset_import_state()
    yield state
    fi.reset_import_state()


def test_prebuild_builds_each_module_in_its_own_build_directory(jit_standin):
    shapes = run.select_shapes(["sweep"])
    logs = []
    info = fi.prebuild(shapes, log=logs.append)
    assert info["error"] is None, info["error"]
    specs, ninjas = jit_standin.specs, jit_standin.ninjas
    assert len(specs) == len(info["variants"]) == 11
    # each module's own ninja file, run in its own build directory (FlashInfer's first use runs it there)
    assert sorted((w, f) for w, f, _ in ninjas) == sorted((s.build_dir, s.ninja_path) for s in specs)
    # the generators got FlashInfer's dtypes, in the order of the module keys
    tc = [s for s in specs if s.generator == "_gen_batch_prefill_primary_module"]
    assert sorted(s.args[5] for s in tc) == [64, 128, 256]
    assert all(s.args[:5] == ("fa2", torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32) for s in tc)
    # one job per translation unit, 12 at most at any time
    assert all(jobs == (10 if w.name.startswith("_gen_batch_prefill") else 3) for w, _, jobs in ninjas)
    assert 10 <= jit_standin.most <= 12
    assert set(info["variant_seconds"]) == set(info["variants"])
    assert info["stale"] == [n for n in info["variants"] if n.startswith("xqa")]  # the stand-in's dry run
    assert "still to compile on first use: xqa" in logs[-1]


def test_parallel_builds_wait_for_free_jobs():
    running, most, lock = [0], [0], threading.Lock()

    def build_one(spec, jobs):
        with lock:
            running[0] += jobs
            most[0] = max(most[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= jobs
        return float(jobs)

    specs = [types.SimpleNamespace(sources=[0] * n) for n in (1, 20, 3, 3, 2, 5)]
    seconds = fi.build_in_parallel(specs, 6, build_one)
    assert seconds == [1.0, 6.0, 3.0, 3.0, 2.0, 5.0]  # each spec's own result, in the order given
    assert most[0] <= 6


# -- ninja itself ----------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("ninja") is None, reason="needs the ninja executable")
def test_ninja_reuses_a_build_only_from_its_own_directory(tmp_path):
    """The module's outputs, built by a ninja run from the parent directory (one ninja over all
    modules, as ``build_jit_specs`` runs it), still look dirty to a ninja run in the module's
    directory: its ``.ninja_log`` has no record of them. Built from there, they are clean."""
    mod = tmp_path / "jit" / "mod"
    mod.mkdir(parents=True)
    (mod / "a.txt").write_text("a")
    ninja_file = mod / "build.ninja"
    ninja_file.write_text(f"rule cp\n  command = cp $in $out\nbuild {mod / 'b.txt'}: cp {mod / 'a.txt'}\n")
    (tmp_path / "jit" / "all.ninja").write_text(f"subninja {ninja_file}\n")
    spec = types.SimpleNamespace(build_dir=mod, ninja_path=ninja_file)
    subprocess.run(["ninja", "-C", str(tmp_path / "jit"), "-f", "all.ninja"], check=True, capture_output=True)
    assert (mod / "b.txt").read_text() == "a"
    assert not fi.up_to_date(spec)
    subprocess.run(["ninja", "-C", str(mod), "-f", str(ninja_file)], check=True, capture_output=True)
    assert fi.up_to_date(spec)


# -- the timed phase's record of a peer's set-up ---------------------------------------------------


@pytest.mark.parametrize("hint_s", [60.0, 0.0], ids=["prebuilt", "compiled"])
def test_peer_records_carry_their_set_up_seconds(deriving_flashinfer, monkeypatch, hint_s):
    from benchmarks.runner import Options, run_shape
    from kvattn.benchmarking.timing import Timer

    monkeypatch.setattr(fi, "COMPILE_HINT_S", hint_s)
    opt = Options(l2_bytes=1 << 40, workspace_mib=16, flex=False, sdpa_backends=())
    recs = run_shape(GRID_DECODE, CPU, Timer(CPU, warmup_ms=1, rep_ms=1), {}, opt, log=lambda *a: None)
    fi_recs = [r for r in recs if r["family"] == fi.FAMILY]
    assert [r["impl"] for r in fi_recs] == ["fi-fa2-tc", "fi-fa2", "fi-xqa"]
    assert all(0 <= r["build_s"] < 60 for r in fi_recs)
    assert all(("compiled in the timed phase?" in r["note"]) == (hint_s == 0.0) for r in fi_recs)


def test_row_log_shows_a_long_set_up():
    recs = [{"impl": "kvattn", "status": "ok", "us": 10.0, "fraction": 0.5},
            {"impl": "fi-fa2-tc", "status": "ok", "us": 9.0, "fraction": 0.6, "build_s": 38.04},
            {"impl": "fi-xqa", "status": "ok", "us": 9.5, "fraction": 0.55, "build_s": 0.01}]
    assert run._summary(recs) == "kvattn 10.0us 0.50 | fi-fa2-tc 9.0us 0.60 (set-up 38.0s) | fi-xqa 9.5us 0.55"
