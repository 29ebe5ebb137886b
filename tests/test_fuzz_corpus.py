"""Kernel classes and their mutation (kvattn.fuzz.corpus): a mutated call keeps its parent's class
and draws its runtime fields anew, every function and many classes keep being exercised, and
``--fresh 1.0`` draws exactly the calls a seed drew before classes existed."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from kvattn.fuzz import corpus, draws, fuzz
from kvattn.fuzz.compiles import CompileCounter
from kvattn.fuzz.runner import Report


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


GPU_ENV = draws.Env(device="cuda", sm_count=132, tiles={"decode": [16, 32, 64], "mla": [32, 64], "prefill": [64, 128]})


def test_every_runtime_field_is_an_argument_of_its_function():
    for function, runtime in corpus.RUNTIME.items():
        names = {name for name, _ in draws.ARGS[function]}
        assert set(runtime) <= names, (function, set(runtime) - names)


@pytest.mark.parametrize("function", draws.FUNCTIONS)
def test_a_mutation_keeps_every_class_field_and_redraws_the_runtime(function):
    rng = random.Random(11)
    runtime = corpus.RUNTIME[function]
    changed = Counter()
    for _ in range(120):
        parent = draws.draw(function, rng, GPU_ENV)
        for _ in range(3):
            child = corpus.mutate(parent, rng, GPU_ENV)
            assert corpus.class_key(child) == corpus.class_key(parent), (parent, child)
            assert child == draws.normalise(child)  # the rules between keys hold
            for name, _ in draws.ARGS[function]:
                if name not in runtime:
                    assert child[name] == parent[name], name
                elif child[name] != parent[name]:
                    changed[name] += 1
            changed["seed"] += child["seed"] != parent["seed"]
    # Every runtime field takes new values (a field with a class part: within that part).
    want = (set(runtime) | {"seed"}) - {"drafts"}  # (drafts: None unless the class is ragged)
    assert set(changed) >= want, (function, want - set(changed))


def test_class_key_ignores_runtime_values_and_keeps_their_class_part():
    rng = random.Random(5)
    spec = draws.draw("batch_decode", rng, GPU_ENV)
    same = dict(spec, lens=[n + 1 for n in spec["lens"]], seed=spec["seed"] + 1,
                bmm1_scale=dict(spec["bmm1_scale"], value=spec["bmm1_scale"]["value"] * 3))
    assert corpus.class_key(same) == corpus.class_key(spec)
    other = dict(spec, bmm1_scale=dict(spec["bmm1_scale"], tensor=not spec["bmm1_scale"]["tensor"]))
    assert corpus.class_key(other) != corpus.class_key(spec)  # a device scale is another kernel
    window = dict(spec, window_left=-1 if spec["window_left"] >= 0 else 3)
    assert corpus.class_key(window) != corpus.class_key(spec)
    assert corpus.class_key(dict(spec, head_dim=spec["head_dim"] * 2)) != corpus.class_key(spec)


def test_fresh_one_draws_the_seeds_calls():
    """CI's fixed-seed run: with fresh 1.0 the corpus is draws.draw and nothing else reads the
    random stream, so a seed's calls are those it drew before classes existed."""
    env = draws.Env()
    ours, theirs = random.Random(7), random.Random(7)
    pool = corpus.Corpus(1.0, env)
    for i in range(60):
        function = draws.FUNCTIONS[i % len(draws.FUNCTIONS)]
        assert pool.next(function, ours) == draws.draw(function, theirs, env)
        assert ours.random() == theirs.random()  # the mode seed the runner draws next


def test_fuzz_on_the_cpu_is_fresh_and_reproduces_its_seed(reference_backend):
    a = fuzz(torch.device("cpu"), calls=5, seed=4, only=("single_decode",), modes=("plain",), quiet=True)
    b = fuzz(torch.device("cpu"), calls=5, seed=4, only=("single_decode",), modes=("plain",), quiet=True, fresh=1.0)
    assert a.fresh == 1.0 and a.classes["single_decode"]["mutated"] == 0
    assert a.as_json()["counts"] == b.as_json()["counts"] and a.classes == b.classes


def test_schedule_draws_fresh_early_then_at_the_given_rate():
    assert corpus.fresh_probability(0.03, 0) == 1.0
    assert corpus.fresh_probability(0.03, 1) == 1.0
    assert corpus.fresh_probability(0.03, 2) == 0.25
    assert corpus.fresh_probability(0.03, 40) == 0.03
    assert corpus.fresh_probability(1.0, 40) == 1.0
    with pytest.raises(ValueError, match="fresh"):
        corpus.Corpus(1.5, draws.Env())


def test_many_draws_keep_every_function_and_many_classes():
    rng = random.Random(2)
    pool = corpus.Corpus(0.03, GPU_ENV)
    parents = {f: Counter() for f in draws.FUNCTIONS}
    for i in range(2500):
        function = draws.FUNCTIONS[i % len(draws.FUNCTIONS)]
        spec = pool.next(function, rng)
        parents[function][corpus.class_key(spec)] += 1
    stats = pool.stats()
    for function in draws.FUNCTIONS:
        s = stats[function]
        assert s["fresh"] + s["mutated"] == 500
        assert 4 <= s["classes"] <= 60 and s["mutated"] > 400, (function, s)
        # Uniform over the classes: none of them takes most of the calls.
        assert len(parents[function]) == s["classes"]
        assert max(parents[function].values()) < 0.5 * 500, (function, parents[function].most_common(2))


def test_mutated_calls_pass_on_the_reference(monkeypatch, reference_backend):
    monkeypatch.setenv("KVATTN_DEBUG", "1")  # a mutated call is legal: the device-value checks pass
    report = fuzz(torch.device("cpu"), calls=40, seed=3, modes=("plain",), quiet=True, fresh=0.0)
    assert report.calls == 40 and not report.failed, [f["outcome"]["why"] for f in report.failures]
    # fresh 0: only the schedule's first draws are fresh (two classes a function, then 1 / classes**2).
    assert all(s["mutated"] >= 3 and s["fresh"] >= 2 for s in report.classes.values()), report.classes


def test_compile_counter_counts_and_chains():
    from triton import knobs

    seen = []
    before = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = lambda **kw: seen.append(kw)
    try:
        counter = CompileCounter()
        with counter.installed():
            knobs.runtime.jit_post_compile_hook(key="k")
            knobs.runtime.jit_post_compile_hook(key="l")
        assert counter.count == 2 and seen == [{"key": "k"}, {"key": "l"}]
        assert knobs.runtime.jit_post_compile_hook is not None and counter.count == 2
        knobs.runtime.jit_post_compile_hook(key="m")  # the old hook back: no longer counted
        assert counter.count == 2 and len(seen) == 3
    finally:
        knobs.runtime.jit_post_compile_hook = before


def test_compile_counter_records_constexprs_and_disk_cache_loads():
    """KVATTN_FUZZ_COMPILE_LOG's record of a kernel: its constexprs by parameter name (Triton's
    repr has none) and whether the compile was a load from the disk cache (the listener's
    cache_hit, told just before the hook)."""
    from types import SimpleNamespace

    from triton import knobs

    fn = SimpleNamespace(jit_function=SimpleNamespace(params=[SimpleNamespace(name="x_ptr"),
                                                              SimpleNamespace(name="BLOCK")]))
    data = '{"attrs_keys": [[0]], "attrs_vals": [[["tt.divisibility", 16]]]}'
    counter = CompileCounter()
    with counter.installed():
        knobs.compilation.listener(cache_hit=True)
        knobs.runtime.jit_post_compile_hook(repr="k[...]", fn=fn, compile={"constants": {(1,): 64},
                                            "specialization_data": data, "num_warps": 4})
        knobs.compilation.listener(cache_hit=False)
        knobs.runtime.jit_post_compile_hook(repr="k[...]", fn=fn, compile={"constants": {(1,): 128}})
    first, second = counter.kernels
    assert first["constants"] == {"BLOCK": 64} and first["attrs"] == {"x_ptr": [["tt.divisibility", 16]]}
    assert first["from_disk_cache"] is True and second["from_disk_cache"] is False
    assert second["constants"] == {"BLOCK": 128} and counter.count == 2 and counter.from_disk == 1
    assert knobs.compilation.listener is None or knobs.compilation.listener.__name__ != "listener"


def test_timing_reports_the_rate_and_warm_calls():
    r = Report("cuda", 0, ("plain",), ("xqa",), calls=10, seconds=2.0,
               counts={"xqa": {"plain": {"calls": 10, "mismatches": 0, "errors": 0}}}, busy={"xqa": 1.5},
               compiles={"xqa": {"kernels": 3, "cold_calls": 2, "warm_seconds": 0.4}})
    t = r.timing()
    assert t["calls_per_second"] == 5.0
    assert t["per_function"]["xqa"] == {"calls": 10, "seconds": 1.5, "calls_per_second": 5.0, "ms_per_call": 150.0,
                                        "kernels_compiled": 3, "cold_calls": 2, "kernels_from_disk_cache": 0,
                                        "warm_ms_per_call": 50.0}
    assert r.as_json()["timing"] == t


# ---------------------------------------------------------------------------------------------
# The GPU: a mutated call reuses its class's kernels
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled kernels need a GPU")
@pytest.mark.parametrize("mode", draws.MODES)
@pytest.mark.parametrize("function", draws.FUNCTIONS)
def test_mutated_calls_reuse_compiled_kernels(function, mode, triton_backend):
    """A class pins every host value that picks a kernel (tests/test_fuzz_classes.py checks the
    launch keys on the CPU; here Triton's own compiles, Gluon kernels and TMA descriptors
    included): once a class's first call has compiled, its mutations compile nothing, in every
    mode (the batch-invariant mode's request alone is one of the busiest requests: one shape a
    class)."""
    from kvattn.fuzz import run_spec
    from kvattn.fuzz.modes import applicable
    from kvattn.fuzz.runner import environment

    device = torch.device("cuda")
    if not applicable(mode, function, device):
        pytest.skip(f"{mode} does not apply to {function}")
    env = environment(device)
    rng = random.Random(0)
    counter = CompileCounter()
    calls, cold = 16, []
    with counter.installed():
        for _ in range(3):  # a few classes, each warmed by its first call
            parent = draws.draw(function, rng, env)
            run_spec(parent, mode, device, 0)
            for i in range(calls):
                before = counter.count
                child = corpus.mutate(parent, rng, env)
                outcome = run_spec(child, mode, device, i)
                assert outcome["result"] == "ok", outcome
                if counter.count > before:
                    cold.append((child, counter.reprs[before:]))
    assert not cold, f"{len(cold)} of {3 * calls} mutated {function} calls compiled: {cold[:2]}"


def test_shared_classes_are_the_same_stream_for_every_worker():
    """``--shared-classes``: the k-th fresh class of a function is the same in every worker; the
    runtime values are each worker's own."""
    pools = [corpus.Corpus(0.2, GPU_ENV, class_seed=9) for _ in range(2)]
    rngs = [random.Random(1), random.Random(2)]
    fresh: list = [[], []]
    for w in range(2):
        for i in range(300):
            function = draws.FUNCTIONS[i % len(draws.FUNCTIONS)]
            before = pools[w].stats().get(function, {"fresh": 0})["fresh"]
            spec = pools[w].next(function, rngs[w])
            if pools[w].stats()[function]["fresh"] > before:
                fresh[w].append((function, corpus.class_key(spec), spec["seed"]))
    n = min(len(fresh[0]), len(fresh[1]))
    by_function = [{f: [k for g, k, _ in fresh[w] if g == f] for f in draws.FUNCTIONS} for w in range(2)]
    for f in draws.FUNCTIONS:
        m = min(len(by_function[0][f]), len(by_function[1][f]))
        assert m >= 2 and by_function[0][f][:m] == by_function[1][f][:m], f
    assert n and {s for _, _, s in fresh[0]}.isdisjoint({s for _, _, s in fresh[1]})  # own tensor values
