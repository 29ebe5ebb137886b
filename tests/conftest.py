"""Test tiers.

* CPU machine (CI): the reference backend and validation run on CPU tensors; Triton kernels run in
  Triton's interpreter (``TRITON_INTERPRET=1`` is set here, before anything imports triton) on small
  float16/float32 shapes (the interpreter has no bfloat16 arithmetic).
* GPU machine: the same tests, with kernels compiled for the GPU and the full shape grids.

``kernel_device`` is where kernel tests run; ``on_gpu`` tells tests to use their large grids.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib  # noqa: E402

import pytest  # noqa: E402

from kvattn.runtime.backend import TRITON_OPS  # noqa: E402

ON_GPU = torch.cuda.is_available()

# Every kernel module is imported here, under the tier's TRITON_INTERPRET: Triton decides when a
# kernel is defined whether it runs interpreted, so a module first imported inside a test that
# patches TRITON_INTERPRET (``kvattn info`` with the interpreter, say) would leave interpreted
# kernels calling compiled helpers in a GPU process, for every later test of that worker.
for _path in sorted(set(TRITON_OPS.values())):
    importlib.import_module(_path)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``runs_long`` first. Under pytest-xdist's load scheduling the workers take tests
    in collection order, so a long test collected late (the GPU fuzz job: ~200 s on an H200, in a
    top-level file collected after every package's tests) runs alone at the end of the suite;
    started first, it overlaps the rest."""
    items.sort(key=lambda item: item.get_closest_marker("runs_long") is None)


def _switch_state() -> tuple:
    from kvattn.runtime import env as _env

    names = sorted(set(_env.SWITCH_NAMES) | {"TRITON_INTERPRET"})
    return tuple((name, os.environ.get(name)) for name in names) + (("set_batch_invariant", _env._BATCH_INVARIANT[0]),)


@pytest.fixture(autouse=True)
def _switches_kept():
    """A test leaves kvattn's switches (its environment variables, TRITON_INTERPRET and the
    batch-invariant override) as it found them: a leak changes what every later test of the
    process runs, and shows up as some other test failing, in one test order only. The leaking
    test fails here instead, and the state is put back."""
    before = _switch_state()
    yield
    after = _switch_state()
    if after != before:
        from kvattn.runtime import env as _env

        for (name, value), _ in zip(before[:-1], after[:-1]):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _env._BATCH_INVARIANT[0] = before[-1][1]
        changed = [(b, a) for b, a in zip(before, after) if a != b]
        pytest.fail(f"the test left kvattn's switches changed (before, after): {changed}")


@pytest.fixture(autouse=True)
def _fresh_call_caches():
    """No recorded call, and no prefill plan, outlives its test (tests patch what recorded calls and
    prefill plans were planned with: its config tables, the SM count, the staging threshold)."""
    from kvattn.ops.prefill import plan as prefill_plan
    from kvattn.runtime import callcache as _callcache

    _callcache.clear()
    prefill_plan._PLANS.clear()
    yield
    _callcache.clear()
    prefill_plan._PLANS.clear()


# Memory a test worker may keep cached past its test (PyTorch's allocator keeps what a test freed).
# Sixteen workers share one GPU: a worker that had once held tens of GB for a float64 oracle kept
# them, and the other workers' tests ran out of memory one after another (lab/notes/method.md).
KEPT_GPU_BYTES = 2 << 30


@pytest.fixture(autouse=True)
def _gpu_memory_returned():
    yield
    if ON_GPU and torch.cuda.is_initialized() and torch.cuda.memory_reserved() > KEPT_GPU_BYTES:
        torch.cuda.empty_cache()


@pytest.fixture
def kernel_device():
    return torch.device("cuda" if ON_GPU else "cpu")


@pytest.fixture
def on_gpu():
    return ON_GPU


@pytest.fixture
def triton_backend(monkeypatch):
    """Force the Triton kernels (compiled on a GPU, interpreted on the CPU)."""
    monkeypatch.setenv("KVATTN_BACKEND", "triton")
    yield


@pytest.fixture
def reference_backend(monkeypatch):
    monkeypatch.setenv("KVATTN_BACKEND", "reference")
    yield
