"""Host time of eager kvattn calls: wall microseconds per call and a cProfile of where it goes.

The target (docs/benchmarking.md) is <= 20 us of host time per eager call at batch-1 decode (Python and
launch, no GPU wait). ``host`` is the median of single calls each made with the GPU idle (a
synchronise before each call, outside the timed part): what a call costs the host. ``queued`` is
the best of 10 rounds of calls queued back to back and synchronised once: once the GPU work of a
call is longer than its host time (lab/notes/host-path.md, Host path: a CUDA-graph replay of 1x32768 takes 66 us on an
H100), the launch queue fills and ``queued`` measures the GPU, not the host.

``--breakdown`` also replays each call's kernel launches alone (the same launch objects and
arguments, back to back): the launches' host cost against the Python around them.

``--compare`` also times every shape with ``KVATTN_FAST_LAUNCH=0`` (each kernel launched through
``kernel[grid](...)``, Triton's own path) and checks that both paths give the same bits.

``--fake-gpu`` runs on a machine without a GPU: CPU tensors, a faked Triton driver and compiler,
and compiled kernels whose launcher (a Triton ``CudaLauncher`` whose C entry point is a no-op taking
the same arguments) does nothing; the CPU tensors take the fast path's raw-pointer launch as CUDA
tensors do. Everything up to the launcher's C entry point runs for real (validation, planning,
Triton's ``JITFunction.run`` or the fast path). It measures the Python part of the host time only,
on this machine's CPU.

Usage (on the device, from the repository root)::

    PYTHONPATH=src python benchmarks/profile_host.py [--calls 2000] [--compare] [--profile] [--breakdown]
    PYTHONPATH=src python benchmarks/profile_host.py --fake-gpu [--compare]   # any machine
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import statistics
import time

if __package__ in (None, ""):  # run as a script
    import _paths  # noqa: F401

import torch  # noqa: E402

from benchmarks import problems  # noqa: E402
from benchmarks.shapes import Shape  # noqa: E402

SHAPES = [
    Shape("decode", 1, 32768),
    Shape("decode", 1, 4096),
    Shape("single_decode", 1, 4096, num_qo_heads=32, num_kv_heads=32),
    Shape("single_decode", 1, 4096, num_qo_heads=32, num_kv_heads=32, pos_encoding_mode="ROPE_LLAMA"),
]


def xqa_call(device: torch.device, kv_len: int = 32768, hq: int = 32, hkv: int = 8, d: int = 128, page: int = 16):
    """``kvattn.xqa.xqa`` at batch 1 over flat head pools (its own input form)."""
    import kvattn

    pages = kv_len // page
    k = torch.randn(pages * page * hkv, d, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(1, 1, hq, d, device=device, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    table = torch.randperm(pages, device=device, dtype=torch.int32).view(1, pages)
    lens = torch.full((1, 1), kv_len, device=device, dtype=torch.uint32)
    ws = torch.zeros(128 << 20, device=device, dtype=torch.uint8)
    sem = torch.zeros(8, device=device, dtype=torch.uint32)

    def call():
        kvattn.xqa.xqa(q, k, v, table, lens, out, ws, sem, hkv, page)
        return out

    return call


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_p90(seconds: list) -> tuple[float, float]:
    """(median, 90th percentile) in microseconds of wall times in seconds."""
    seconds = sorted(seconds)
    return statistics.median(seconds) * 1e6, seconds[int(0.9 * (len(seconds) - 1))] * 1e6


MIN_CALLS = 20  # timed calls a deadline never cuts: fewer make a median of noise


def host_times(fn, calls: int, deadline: float | None = None) -> tuple[float, float]:
    """(median, 90th percentile) wall microseconds of ``calls`` single calls, each made with the
    GPU idle; fewer (never under ``MIN_CALLS``) where ``time.perf_counter()`` passes ``deadline``
    (a run's time budget, shared among what it times)."""
    for _ in range(20):
        fn()
    times = []
    least = min(calls, MIN_CALLS)
    for i in range(calls):
        _sync()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        if deadline is not None and i + 1 >= least and t1 > deadline:
            break
    _sync()
    return median_p90(times)


def host_us(fn, calls: int) -> float:
    """Median wall time of ``calls`` single calls, each made with the GPU idle."""
    return host_times(fn, calls)[0]


def queued_us(fn, calls: int) -> float:
    """Best of 10 rounds (shared machines are noisy) of ``calls / 10`` back-to-back calls."""
    for _ in range(20):
        fn()
    _sync()
    rounds, best = 10, float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(max(1, calls // rounds)):
            fn()
        best = min(best, (time.perf_counter() - t0) / max(1, calls // rounds))
    _sync()
    return best * 1e6


def fake_launcher(kernel):
    """A ``CudaLauncher`` (Triton 3.6's, so the fast path calls its C entry point ``launch``
    directly, as on a GPU) whose ``launch`` checks its argument count and does nothing. Triton
    3.7's launcher has no such entry point (the fast path calls ``CompiledKernel.run``): there the
    fake is a ``run`` that checks its argument count and does nothing."""
    from triton.backends.nvidia import driver as nvidia_driver
    from triton.backends.nvidia.driver import CudaLauncher

    if not hasattr(nvidia_driver, "_BASE_ARGS_FORMAT"):
        # run(grid x/y/z, stream, function, metadata, launch metadata, enter/exit hooks, *params)
        expected_run = 9 + len(kernel.params)

        class FakeRun:
            global_scratch_size = profile_scratch_size = 0

            def __call__(self, *args):
                if len(args) != expected_run:
                    raise TypeError(f"{kernel.__name__} run: expected {expected_run} arguments, got {len(args)}")

        return FakeRun()

    expected = 13 + len(kernel.params)  # _BASE_ARGS_FORMAT's 13, then every kernel parameter

    def launch(*args):
        if len(args) != expected:
            raise TypeError(f"{kernel.__name__} launcher: expected {expected} arguments, got {len(args)}")

    run = object.__new__(CudaLauncher)
    run.launch, run.num_ctas, run.launch_cooperative_grid, run.launch_pdl = launch, 1, False, False
    run.global_scratch_size = run.profile_scratch_size = 0
    run.global_scratch_align = run.profile_scratch_align = 1
    return run


def fake_gpu() -> None:
    """Fake the GPU side of Triton: a driver answering device 0 / stream 0 and a compile that
    returns a kernel whose launcher does nothing (see the module docstring)."""
    import types

    import triton.runtime.jit as jit
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import CompiledKernel

    from kvattn.ops.decode import plan as decode_launch

    try:
        from kvattn.runtime import fast_launch
    except ImportError:  # a kvattn from before the fast path (to compare with)
        fast_launch = None
    try:
        from kvattn.runtime import launch_replay
    except ImportError:  # a kvattn whose replay lived in fast_launch (to compare with)
        launch_replay = None
    if not isinstance(decode_launch.decode_split_kernel, jit.JITFunction):
        raise SystemExit("--fake-gpu: unset TRITON_INTERPRET (the kernels must be compiled-mode JITFunctions)")
    active = types.SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: 0,
                                   get_current_target=lambda: GPUTarget("cuda", 90, 32))
    jit.driver = types.SimpleNamespace(active=active)

    def do_compile(kernel, key, signature, device, constexprs, options, attrs, warmup):
        compiled = object.__new__(CompiledKernel)
        compiled.hash, compiled.name, compiled.src, compiled.module = key, kernel.__name__, None, 1
        compiled.function, compiled.packed_metadata, compiled._run = 1, (4, 1, 0), fake_launcher(kernel)
        kernel.device_caches[device][0][key] = compiled
        kernel.cache_key  # noqa: B018  (fills used_global_vals, as a compile does)
        return compiled

    jit.JITFunction._do_compile = do_compile
    if fast_launch is not None:
        fast_launch.driver = jit.driver
        fast_launch._device = types.SimpleNamespace(is_interpreter=lambda: False)
        # The fake GPU's tensors are CPU tensors: let them take the raw-pointer path a CUDA tensor takes.
        fast_launch._on_gpu = lambda t: True
    if launch_replay is not None:
        launch_replay.driver = jit.driver
    os.environ["TRITON_INTERPRET"] = "1"  # kvattn: CPU tensors may take the Triton backend
    os.environ["KVATTN_BACKEND"] = "triton"
    # Its tensors are CPU tensors, on which kvattn checks device values by default: check them as
    # on a GPU (only when asked), or the checks' own ops would keep calls from being replayed.
    os.environ.setdefault("KVATTN_DEBUG", "0")
    from kvattn._inputs import checks as _input_checks

    # compiled-mode kernels: bfloat16 caches are fine
    _input_checks._kernels_interpreted = lambda: False


def _bits(result) -> torch.Tensor:
    tensors = result if isinstance(result, (tuple, list)) else (result,)
    return torch.cat([t.detach().contiguous().view(torch.uint8).reshape(-1) for t in tensors])


def _set_fast(on: bool) -> None:
    os.environ["KVATTN_FAST_LAUNCH"] = "1" if on else "0"


@contextlib.contextmanager
def triton_runs():
    """Records every ``JITFunction.run`` (Triton's own launch path) inside the block."""
    from triton.runtime.jit import JITFunction

    runs, run = [], JITFunction.run

    def counting(*args, **kwargs):
        runs.append(1)
        return run(*args, **kwargs)

    JITFunction.run = counting
    try:
        yield runs
    finally:
        JITFunction.run = run


def launches_of(fn) -> list:
    """The fast-path launches one call of ``fn`` makes, as ``(launch, call)`` to replay."""
    from kvattn.runtime import fast_launch

    seen, call_launch = [], fast_launch.Launch.__call__

    def recording(self, call):
        seen.append((self, call))
        return call_launch(self, call)

    fast_launch.Launch.__call__ = recording
    saved = os.environ.get("KVATTN_CALL_CACHE")
    os.environ["KVATTN_CALL_CACHE"] = "0"  # (a replayed call skips Launch.__call__)
    try:
        fn()
    finally:
        fast_launch.Launch.__call__ = call_launch
        if saved is None:
            del os.environ["KVATTN_CALL_CACHE"]
        else:
            os.environ["KVATTN_CALL_CACHE"] = saved
    return seen


def breakdown(fn, calls: int) -> str:
    """Host time of the call's kernel launches alone (the same ``Launch`` objects and arguments,
    replayed back to back), against the whole call: what is Python around them."""
    launches = launches_of(fn)

    def replay():
        for launch, call in launches:
            launch(call)

    whole, bare = queued_us(fn, calls), queued_us(replay, calls)
    return (f"   breakdown: {len(launches)} launches {bare:5.1f} us, the rest of the call "
            f"{whole - bare:5.1f} us (whole {whole:5.1f})")


def profile(fn, calls: int = 500) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    _sync()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    return s.getvalue()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--compare", action="store_true", help="also time Triton's own launch path (KVATTN_FAST_LAUNCH=0)")
    ap.add_argument("--profile", action="store_true", help="also print the cProfile of the first shape")
    ap.add_argument("--fake-gpu", action="store_true", help="CPU tensors, Triton's GPU side faked (any machine)")
    ap.add_argument("--breakdown", action="store_true", help="also time each call's kernel launches alone")
    args = ap.parse_args(argv)
    if args.fake_gpu:
        fake_gpu()
        device, l2 = torch.device("cpu"), 50 << 20
    else:
        device = torch.device("cuda")
        l2 = torch.cuda.get_device_properties(device).L2_cache_size
    cases = [(shape.id, problems.build(shape, device, l2_bytes=l2, workspace_mib=128).sets[0].kvattn)
             for shape in SHAPES]
    cases.append(("xqa 1x32768 (flat pools)", xqa_call(device)))
    for i, (name, fn) in enumerate(cases):
        _set_fast(True)
        fn()  # the first call of each launch goes through Triton and is cached
        with triton_runs() as runs:
            line = f"{name:50s} host {host_us(fn, args.calls):6.1f} us/call (queued {queued_us(fn, args.calls):6.1f})"
        if runs:  # the numbers are not the fast path's
            line += f"   ({len(runs)} launches through JITFunction.run)"
        if args.compare:
            fast = _bits(fn()).clone()
            _set_fast(False)
            line += f"   Triton's path {host_us(fn, args.calls):6.1f} (queued {queued_us(fn, args.calls):6.1f})"
            if not args.fake_gpu:  # (no kernel runs on a faked GPU)
                line += "   same bits" if torch.equal(_bits(fn()), fast) else "   OUTPUTS DIFFER"
            _set_fast(True)
        if args.breakdown:
            line += breakdown(fn, args.calls)
        print(line, flush=True)
        if args.profile and i == 0:
            print(profile(fn))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
