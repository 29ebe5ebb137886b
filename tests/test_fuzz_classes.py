"""A fuzz class (kvattn.fuzz.corpus) pins every host value that picks a compiled kernel: the
mutations of a class launch exactly the kernel specialisations its first call launched.

Triton compiles a kernel for each new specialisation: the constexprs, the options, and of every
other argument its Triton 3.6 specialisation (:mod:`kvattn.runtime.arg_specs`: an int's ``== 1``,
``% 16 == 0`` and width, a tensor's dtype and 16-byte alignment). Here every launch the plans make
is caught at :class:`kvattn.runtime.fast_launch.Launch` and replaced by that key, on the CPU: the
plans run their host code with the interpreter's facts (``TRITON_INTERPRET=1``) and nothing is
launched, so the shapes are the GPU's draws and the test takes seconds. A mutation that launched
another key would compile on a GPU (the GPU side: ``tests/test_fuzz_corpus.py``,
``test_mutated_calls_mostly_reuse_compiled_kernels``).
"""

from __future__ import annotations

import random

import pytest
import torch

import kvattn.decode
import kvattn.mla
import kvattn.prefill
import kvattn.xqa
from kvattn.fuzz import corpus, draws
from kvattn.fuzz.calls import build, public
from kvattn.fuzz.modes import _busiest
from kvattn.invariance import batch_invariant
from kvattn.runtime import fast_launch
from kvattn.runtime.arg_specs import Unspecializable, arg_spec

class _GpuDraws(draws.Env):
    """A GPU's draws (batches past the SMs, its config tables' tile sizes), with ordinary lengths
    up to 256 rather than 2048 and an eighth of the oracle's budget (the ``cheap_caches`` fixture):
    the CPU builds every cache, and NVFP4 quantisation on the CPU is slow."""

    @property
    def max_len(self) -> int:
        return 256


GPU_ENV = _GpuDraws(device="cuda", sm_count=132, tiles={"decode": [16, 32, 64], "mla": [32, 64], "prefill": [64, 128]})
CLASSES, MUTATIONS = 12, 5


def launch_key(launch: fast_launch.Launch, call) -> tuple:
    """What Triton picks a compiled kernel by, for one launch of ``call``."""
    call = launch.described(call)
    values = launch._pick(call.triton_values() + launch._bound)
    spec = []
    for (name, is_constexpr), value in zip(fast_launch._parameters(launch.kernel), values):
        if is_constexpr:
            spec.append((name, type(value).__name__, repr(value)))
        else:
            try:
                spec.append((name, arg_spec(value)))
            except Unspecializable:  # a tensor descriptor: its type and block shape
                spec.append((name, type(value).__name__, repr(getattr(value, "block_shape", None))))
    return getattr(launch.kernel, "__name__", repr(launch.kernel)), tuple(spec), tuple(sorted(launch.options.items()))


@pytest.fixture(autouse=True)
def cheap_caches(monkeypatch):
    monkeypatch.setattr(draws, "ORACLE_ELEMENTS", draws.ORACLE_ELEMENTS // 8)


@pytest.fixture
def launches(monkeypatch):
    """The launch keys of the calls made inside the test (a list, cleared by the test), with
    every launch caught before it reaches Triton."""
    monkeypatch.setenv("KVATTN_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the plans' host code runs on CPU tensors
    monkeypatch.setenv("KVATTN_CALL_CACHE", "0")  # every call planned, none replayed
    for module in (kvattn.decode, kvattn.xqa, kvattn.mla, kvattn.prefill):
        # GPU draws have bfloat16 caches, which the interpreter refuses; nothing runs here.
        monkeypatch.setattr(module, "check_interpretable", lambda *named: None)
    seen: list = []
    monkeypatch.setattr(fast_launch.Launch, "__call__", lambda self, call: seen.append(launch_key(self, call)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield seen
    torch.set_num_threads(threads)


def _keys(call, seen: list) -> frozenset:
    seen.clear()
    public(call.function)(**call.kwargs)
    return frozenset(seen)


@pytest.mark.parametrize("function", draws.FUNCTIONS)
def test_mutations_of_a_class_launch_its_kernels(function, launches):
    rng = random.Random(5)
    launched = 0
    for _ in range(CLASSES):
        parent = draws.draw(function, rng, GPU_ENV)
        first = _keys(build(parent), launches)
        launched += bool(first)
        for _ in range(MUTATIONS):
            child = corpus.mutate(parent, rng, GPU_ENV)
            assert _keys(build(child), launches) == first, (parent, child)
    assert launched >= CLASSES // 2  # (an empty batch launches nothing)


@pytest.mark.parametrize("function", [f for f in draws.FUNCTIONS if f != "single_decode"])
def test_a_request_alone_launches_the_kernels_of_its_class(function, launches):
    """The batch-invariant mode's second call (one of the busiest requests of the batch alone):
    its slices are copied to storage of their own, so which request it is does not change the
    pointers' alignment, and it is always a request of the class's largest row count (ragged
    drafts and prefill ``q_lens`` give each request its own)."""
    rng = random.Random(8)
    for _ in range(CLASSES):
        parent = draws.draw(function, rng, GPU_ENV)
        if not parent["batch"]:
            continue
        with batch_invariant():
            call = build(parent)
            alone = _keys(call.request(_busiest(call, rng)), launches)
            for _ in range(MUTATIONS):
                child = build(corpus.mutate(parent, rng, GPU_ENV))
                b = _busiest(child, rng)
                assert _keys(child.request(b), launches) == alone, (parent, b)


def test_a_mutated_length_is_under_the_class_bound_and_reaches_it():
    rng = random.Random(3)
    at_bound = zero = 0
    for _ in range(200):
        parent = draws.draw("batch_decode", rng, GPU_ENV)
        child = corpus.mutate(parent, rng, GPU_ENV)
        assert child["max_len"] == parent["max_len"] == max(parent["lens"] + [0])
        assert all(n <= child["max_len"] for n in child["lens"])
        at_bound += child["max_len"] in child["lens"]
        zero += 0 in child["lens"]
    assert at_bound > 60 and zero > 20
