"""From each public function to its kernel launch: the chain of kvattn's own Python calls on the
stack when a kernel is launched, kept within four calls (docs/extending.md, "Layers"): the
validation (what the call cache runs on a miss) -> the op's entry -> the plan -> the launch.

Each public function is called once, on a tiny shape, with the Triton backend: every
``fast_launch.Launch`` call (and any ``kernel[grid]`` outside one) notes the stack and returns
without launching, so no kernel runs (the stack down to a launch does not depend on what the
launch does). The chain is the kvattn frames from the public function to the launch: validation
helpers that returned before are not on it; the call cache's ``CallCache.run`` and the public
function's own closure (the call the cache runs on a miss) do not count as hops. Run with ``-s``
to see each function's chain.
"""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch
import triton.runtime.jit as triton_jit

import kvattn
from kvattn.runtime import callcache as _callcache
from kvattn.runtime import fast_launch
from kvattn.testing import make_paged_kv

MAX_HOPS = 4  # validation -> op entry -> plan -> Launch.__call__ (issue 39's "at most 4 calls")
_PACKAGE = os.path.dirname(kvattn.__file__) + os.sep
_GENERATED = "<kvattn op "  # opdecl's generated entries (runtime/opdecl.py)


def _kvattn_frame(code: types.CodeType) -> bool:
    return code.co_filename.startswith(_PACKAGE) or code.co_filename.startswith(_GENERATED)


def _name(code: types.CodeType) -> str:
    path = code.co_filename
    if path.startswith(_PACKAGE):
        path = path[len(_PACKAGE):-len(".py")].replace(os.sep, ".")
    else:
        path = path.strip("<>")
    return f"{path}:{getattr(code, 'co_qualname', code.co_name)}"  # (co_qualname: Python 3.11+)


class Launches:
    """The kvattn frames on the stack at each launch, outermost first, and the launching call."""

    def __init__(self):
        self.stacks: list[tuple[list[types.CodeType], str]] = []

    def note(self, frame, launch: str) -> None:
        codes = []
        while frame is not None:
            if _kvattn_frame(frame.f_code):
                codes.append(frame.f_code)
            frame = frame.f_back
        self.stacks.append((codes[::-1], launch))


def stub_launches(monkeypatch) -> Launches:
    """Every launch from now on noted, none made (``Launch.__call__``, ``Launch.warmup`` and any
    ``kernel[grid]`` outside them)."""
    seen = Launches()

    def launch(self, call):
        seen.note(sys._getframe(1), "fast_launch:Launch.__call__")

    def warmup(self, call):
        seen.note(sys._getframe(1), "fast_launch:Launch.warmup")

    def grid(self, grid):
        seen.note(sys._getframe(1), f"{getattr(self, '__name__', self)}[grid]")
        return lambda *args, **kwargs: None

    monkeypatch.setattr(fast_launch.Launch, "__call__", launch)
    monkeypatch.setattr(fast_launch.Launch, "warmup", warmup)
    monkeypatch.setattr(triton_jit.KernelInterface, "__getitem__", grid)
    monkeypatch.setenv("KVATTN_DEBUG", "0")  # (device-value checks: validation helpers, not the path)
    _callcache.clear()
    return seen


@pytest.fixture
def launches(monkeypatch, triton_backend):
    return stub_launches(monkeypatch)


def chain(stack: list, launch: str, public) -> list[str]:
    """The hops from ``public`` to the launch, the launching call the last: the frames after the
    public function's, less the call cache's and the public function's own closures."""
    starts = [i for i, c in enumerate(stack) if c is public.__code__]
    assert starts, f"{public.__qualname__} is not on the stack at {launch}: {[_name(c) for c in stack]}"
    closures = (c for c in public.__code__.co_consts if isinstance(c, types.CodeType))
    skipped = {_callcache.CallCache.run.__code__, *closures}
    return [_name(c) for c in stack[starts[0] + 1:] if c not in skipped] + [launch]


# ---------------------------------------------------------------------------------------------
# one small call per public function (float16 where the interpreter computes: nothing runs here,
# but the backend's checks still refuse bfloat16 caches under the interpreter)
# ---------------------------------------------------------------------------------------------
F16 = torch.float16


def _paged(lens, *, hkv=2, d=64, page=16, dtype=F16, **kw):
    return make_paged_kv(list(lens), num_kv_heads=hkv, head_dim=d, page_size=page, dtype=dtype, **kw)


def batch_decode(device):
    case = _paged([5, 20], device=device)
    q = torch.randn(2, 4, 64, dtype=F16, device=device)
    ws = torch.zeros(1 << 20, dtype=torch.uint8, device=device)
    fn = kvattn.decode.xqa_batch_decode_with_kv_cache
    return fn, lambda: fn(q, case.kv_cache, ws, case.block_tables, case.seq_lens, 20, bmm1_scale=0.125)


def batch_decode_ragged(device):
    case = _paged([5, 20], device=device)
    q = torch.randn(3, 4, 64, dtype=F16, device=device)
    ws = torch.zeros(1 << 20, dtype=torch.uint8, device=device)
    cu = torch.tensor([0, 1, 3], dtype=torch.int32, device=device)
    fn = kvattn.decode.xqa_batch_decode_with_kv_cache
    return fn, lambda: fn(q, case.kv_cache, ws, case.block_tables, case.seq_lens, 20, bmm1_scale=0.125,
                          q_len_per_req=2, q_cu_seq_lens=cu)


def xqa(device):
    case = _paged([5, 20], page=32, device=device)
    q = torch.randn(2, 1, 4, 64, dtype=F16, device=device)
    k, v = (case.kv_cache[:, i].reshape(-1, 64) for i in (0, 1))
    ws = torch.zeros(1 << 20, dtype=torch.uint8, device=device)
    lens = case.seq_lens.view(-1, 1).to(torch.uint32)
    sem = torch.zeros(8, dtype=torch.uint32, device=device)
    fn = kvattn.xqa.xqa
    return fn, lambda: fn(q, k, v, case.block_tables, lens, torch.empty_like(q), ws, sem, 2, 32)


def single_decode(device, **kw):
    q = torch.randn(4, 64, dtype=F16, device=device)
    k, v = (torch.randn(20, 2, 64, dtype=F16, device=device) for _ in range(2))
    fn = kvattn.decode.single_decode_with_kv_cache
    return fn, lambda: fn(q, k, v, **kw)


def mla(device):
    # bfloat16 query over an fp8 latent cache: the interpreter takes it (float16 products)
    case = make_paged_kv([5, 20], num_kv_heads=1, head_dim=576, page_size=16, kv_format="fp8", form="shared",
                         device=device)
    q = torch.randn(2, 1, 16, 576, device=device).to(torch.bfloat16)
    ws = torch.zeros(1 << 22, dtype=torch.uint8, device=device)
    fn = kvattn.mla.xqa_batch_decode_with_kv_cache_mla
    return fn, lambda: fn(q, case.kv_cache[:, 0, :, 0], ws, 128, 512, 64, case.block_tables, case.seq_lens, 20,
                          bmm1_scale=0.07)


def prefill(device, kv_format=None):
    case = _paged([20, 40], page=16, layout="HND", kv_format=kv_format, device=device)
    cum_q = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
    cum_kv = torch.tensor([0, 20, 60], dtype=torch.int32, device=device)
    q = torch.randn(12, 4, 64, dtype=F16, device=device)
    ws = torch.zeros(1 << 22, dtype=torch.uint8, device=device)
    fn = kvattn.prefill.trtllm_batch_context_with_kv_cache
    return fn, lambda: fn(q, case.kv_cache, ws, case.block_tables, case.seq_lens, 7, 40, 0.125, 1.0, 2, cum_q, cum_kv,
                          kv_cache_sf=case.kv_cache_sf)


CALLS = {
    "batch_decode": batch_decode,
    "batch_decode-ragged-drafts": batch_decode_ragged,
    "xqa": xqa,
    "single_decode": single_decode,
    "single_decode-rope": lambda device: single_decode(device, pos_encoding_mode="ROPE_LLAMA"),
    "mla": mla,
    "prefill": prefill,
    "prefill-fp8-staged": lambda device: prefill(device, kv_format="fp8"),
}


def assert_within_target(name: str, fn, seen: Launches) -> None:
    assert seen.stacks, f"{name}: no launch"
    chains = [chain(stack, launch, fn) for stack, launch in seen.stacks]
    for hops in chains:
        print(f"\n{name}: {len(hops)} hops: {fn.__qualname__} -> " + " -> ".join(hops))
    longest = max(chains, key=len)
    assert len(longest) <= MAX_HOPS, f"{name}: {len(longest)} hops: " + " -> ".join(longest)


@pytest.mark.parametrize("name", list(CALLS))
def test_public_function_reaches_its_launches_in_four_hops(name, launches, kernel_device):
    fn, call = CALLS[name](kernel_device)
    call()  # (the cache's miss path: a key seen once runs the ordinary way)
    assert_within_target(name, fn, launches)


def _staged_prefill(fp8_query=False):
    """A quantised cache's pages staged in the workspace before the attention (Hopper's Gluon route)."""
    from kvattn.formats import FP8_DTYPE

    from .test_call_cache import prefill_case

    fn, args, kwargs = prefill_case(lens=(3000, 700), lq=(500, 700))
    query = args[0].to(FP8_DTYPE) if fp8_query else args[0]
    return fn, (query, args[1].to(FP8_DTYPE), torch.zeros(1 << 26, dtype=torch.uint8), *args[3:]), kwargs


def _gpu_cases() -> dict:
    from .test_call_cache import CASES

    return {**CASES, "prefill-fp8-staged-hopper": _staged_prefill,
            "prefill-fp8q-staged-hopper": lambda: _staged_prefill(fp8_query=True)}


@pytest.mark.parametrize("name", list(_gpu_cases()))
def test_gpu_routes_reach_their_launches_in_four_hops(name, monkeypatch):
    """The routes a GPU takes (test_call_cache's calls on a faked GPU, Hopper's Gluon, TMA and
    staging routes planned on a faked Hopper), their launches noted as above."""
    from .test_call_cache import HOPPER, fake_hopper
    from .test_fast_launch import FakeGPU

    FakeGPU(monkeypatch)
    if name in HOPPER or name.endswith("-hopper"):
        fake_hopper(monkeypatch)
    seen = stub_launches(monkeypatch)
    torch.manual_seed(0)
    fn, args, kwargs = _gpu_cases()[name]()
    fn(*args, **kwargs)
    assert_within_target(name, fn, seen)
