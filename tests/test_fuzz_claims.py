"""``--jobs --shared-classes`` workers claim the classes they compile first (kvattn.fuzz.claims):
one worker compiles a class, the others run classes they have warmed meanwhile."""

from __future__ import annotations

import os
import random
import time

import torch

from kvattn.fuzz import claims, corpus, draws, fuzz
from kvattn.fuzz.runner import _unclaimed

GPU_ENV = draws.Env(device="cuda", sm_count=132, tiles={"decode": [16, 32, 64], "mla": [32, 64], "prefill": [64, 128]})


def test_the_first_worker_claims_a_class_the_others_wait_for_its_done_mark(tmp_path):
    a, b = claims.Claims(str(tmp_path)), claims.Claims(str(tmp_path))
    key = ("class", "plain")
    assert a.ready(key)  # claimed by a
    assert not b.ready(key)  # a is compiling it
    assert b.ready(("class", "invariant"))  # another family: other kernels, its own claim
    a.ran(key)
    assert b.ready(key) and key not in b.mine  # done: b loads the kernels from the disk cache
    assert a.ready(key) and key in a.warm


def test_a_stale_claim_is_free(tmp_path, monkeypatch):
    a, b = claims.Claims(str(tmp_path)), claims.Claims(str(tmp_path))
    key = ("class", "plain")
    assert a.ready(key) and not b.ready(key)
    (claim,) = tmp_path.glob("*.claim")
    old = time.time() - claims.STALE_SECONDS - 1
    os.utime(claim, (old, old))
    assert b.ready(key)  # its worker died before marking it done


def test_a_claimed_class_is_put_off_for_a_warm_one(tmp_path):
    rng = random.Random(4)
    pool = corpus.Corpus(0.03, GPU_ENV, class_seed=1)
    ours, theirs = claims.Claims(str(tmp_path)), claims.Claims(str(tmp_path))
    warm = pool.next("xqa", rng)
    ours.ran((corpus.class_key(warm), "plain"))
    new = corpus.mutate(draws.draw("xqa", random.Random(99), GPU_ENV), rng, GPU_ENV)
    pool.classes["xqa"][corpus.class_key(new)] = new
    assert theirs.ready((corpus.class_key(new), "plain"))  # another worker compiles it
    got = _unclaimed(new, "graph", pool, ours, rng)
    assert corpus.class_key(got) == corpus.class_key(warm) and got != warm  # a new call of the warm class
    # With no warm class of the function in that mode family, the turn is put off.
    assert theirs.ready((corpus.class_key(new), "invariant"))
    assert _unclaimed(new, "invariant", pool, ours, rng) is None
    theirs.ran((corpus.class_key(new), "invariant"))
    assert _unclaimed(new, "invariant", pool, ours, rng) is new  # done: its kernels on the disk cache


def test_workers_with_claims_run_every_call(tmp_path, reference_backend):
    """Two workers' loops over one claims directory (in turn here): every call runs, the second
    puts off nothing the first has marked done."""
    torch.set_num_threads(1)
    for seed in (0, 1):
        report = fuzz(torch.device("cpu"), calls=6, seed=seed, only=("single_decode", "mla"), modes=("plain",),
                      quiet=True, fresh=0.5, class_seed=3, claims=str(tmp_path))
        assert report.calls == 6 and not report.failed, report.failures
    assert not list(tmp_path.glob("*.claim")) or list(tmp_path.glob("*.done"))


def test_a_turn_put_off_goes_to_the_next_function_and_its_own_fresh_class(tmp_path, reference_backend):
    """At the start no class is warm: a worker that finds the first class of a function claimed
    moves on, and its next fresh draw of that function (the second class) is its own to compile."""
    torch.set_num_threads(1)
    env = draws.Env()
    first = corpus.Corpus(0.03, env, class_seed=3).next("single_decode", random.Random(0))
    claims.Claims(str(tmp_path)).ready((corpus.class_key(first), "plain"))  # another worker's
    report = fuzz(torch.device("cpu"), calls=4, seed=0, only=("single_decode", "mla"), modes=("plain",),
                  quiet=True, fresh=0.03, class_seed=3, claims=str(tmp_path))
    assert report.calls == 4 and not report.failed, report.failures
    assert report.counts["single_decode"]["plain"]["calls"] >= 1 and report.counts["mla"]["plain"]["calls"] >= 1
    assert report.classes["single_decode"]["classes"] >= 2  # the claimed one was put off for the next
