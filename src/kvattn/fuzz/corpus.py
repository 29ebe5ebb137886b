"""Kernel classes and their mutation: most fuzz calls on a GPU reuse kernels already compiled.

A spec's fields split in two. The *class* fields are every host-visible value that picks a
compiled kernel or a launch: dtypes, cache format, head dim, KV heads and group, page size, ``Q``,
layouts and pool forms, every option that becomes a kernel constexpr (a mask, sinks, an LSE, an
output dtype, a window, a scale as a float or a device tensor, ...), and the shapes and host
bounds the plans read: the batch, the query rows (ragged drafts, prefill ``q_lens``), the longest
length a class allows (``max_len``: the table's width, the pool's pages and the host bound
``max_seq_len`` / ``max_kv_len`` follow from it), single decode's length (its K's shape) and the
window sizes (the plans' key span). The *runtime* fields are what the device reads: the lengths
under the bound, the tensor values and page permutation (the seed) and the scales' values. A field
is a class field unless ``RUNTIME`` lists it; ``RUNTIME`` may also name the part of a runtime value
that still picks a kernel (a scale's float/tensor form), which a mutation keeps. Integers a launch
passes (Triton specialises them on ``== 1`` and ``% 16``) and the tensors' alignment then follow
from class fields too; ``tests/test_fuzz_classes.py`` checks that a class's mutations launch the
same kernel specialisations.

:class:`Corpus` draws a function's next call: a fresh spec (:func:`kvattn.fuzz.draws.draw`, a
possibly new class) with the probability of its schedule, otherwise a class already seen (picked
uniformly) with its runtime fields drawn anew by the same drawers (so lengths still land on the
page and tile edges, batches still exceed the SMs). Triton compiles a kernel per class (seconds
each) and caches it: a mutated call costs milliseconds. docs/fuzzing.md, "Classes and mutation".
"""

from __future__ import annotations

import json
import random

from .draws import ARGS, Env, draw, normalise

# Runtime fields of each function -> None (the whole value is runtime) or a function of the value
# giving the part that picks a kernel (kept from the parent by a mutation). What the plans read on
# the host stays a class field: the decode plan's DecodeFacts (shapes, strides, q_len, has_window,
# the optional tensors given, dtypes) and its key span (max_seq_len, the window), MLA's and
# prefill's facts alike (the pool's pages, the table's width, window_left, max_q_len, max_kv_len).
_TENSOR = lambda v: v["tensor"]  # noqa: E731 - a scale: a float (its value a kernel float) or a device tensor
_GIVEN = lambda v: v is None  # noqa: E731 - an optional float: given or not
_SOFT_CAP = lambda v: bool(v)  # noqa: E731 - a soft cap > 0 is a kernel flag; None and 0.0 are off

RUNTIME = {
    "batch_decode": {"lens": None, "bmm1_scale": _TENSOR, "bmm2_scale": _TENSOR, "o_scale": None},
    "xqa": {"lens": None, "q_scale": _TENSOR, "rcp_out_scale": None},
    "single_decode": {"q_scale": _GIVEN, "k_scale": _GIVEN, "v_scale": _GIVEN, "logits_soft_cap": _SOFT_CAP,
                      "sm_scale": _GIVEN, "rope_scale": _GIVEN, "rope_theta": _GIVEN},
    "mla": {"lens": None, "bmm1_scale": _TENSOR, "bmm2_scale": _TENSOR},
    "prefill": {"lens": None, "bmm1_scale": _TENSOR, "bmm2_scale": _TENSOR, "o_sf_scale": _GIVEN},
}

# Chance of a fresh draw once a function has a few classes (``--fresh``): on a GPU most calls then
# reuse compiled kernels (a compile takes seconds, a call milliseconds); on a CPU nothing is
# compiled and every call is fresh, as before classes existed.
FRESH_CUDA = 0.03
FRESH_CPU = 1.0

# Draws of a runtime field that keep its class part, before the parent's own value is taken.
REDRAWS = 12


def class_key(spec: dict) -> str:
    """The spec's class: its class fields and the class part of its runtime fields, as a string."""
    runtime = RUNTIME[spec["function"]]
    key = {"function": spec["function"]}
    for name, _ in ARGS[spec["function"]]:
        if name not in runtime:
            key[name] = spec[name]
        elif runtime[name] is not None:
            key[name] = runtime[name](spec[name])
    return json.dumps(key, sort_keys=True)


def mutate(parent: dict, rng: random.Random, env: Env) -> dict:
    """A new call of ``parent``'s class: its class fields kept, its runtime fields drawn anew (a
    runtime field with a class part is redrawn until that part matches the parent's). Every
    runtime drawer sees all the class fields (the lengths' drawer, ``max_len`` and the query rows
    a request must hold)."""
    function = parent["function"]
    runtime = RUNTIME[function]
    spec = {"function": function, "seed": rng.randrange(2**31)}
    spec.update((name, parent.get(name)) for name, _ in ARGS[function] if name not in runtime)
    for name, drawer in ARGS[function]:
        part = runtime.get(name, False)
        if part is False:
            continue
        if part is None:
            spec[name] = drawer(rng, spec, env)
            continue
        want = part(parent[name])
        for _ in range(REDRAWS):
            value = drawer(rng, spec, env)
            if part(value) == want:
                break
        else:
            value = parent[name]
        spec[name] = value
    return normalise(spec)


def fresh_probability(fresh: float, classes: int) -> float:
    """Chance that a function's next call is a fresh draw, with ``classes`` classes seen: 1 until
    there are two, then ``1 / classes**2`` until it falls to ``fresh`` (a few classes a function
    early, then the given rate: about 6 classes in a function's first 60 calls, ``fresh`` of the
    rest)."""
    if fresh >= 1.0 or classes == 0:
        return 1.0
    return max(fresh, 1.0 / classes**2)


class Corpus:
    """The classes seen so far, per function, and the next call's draw (fresh or mutated).

    With ``fresh`` 1.0 every call is :func:`kvattn.fuzz.draws.draw` and nothing else reads the
    random stream, so a seed draws exactly the calls it drew before classes existed.

    With ``class_seed``, a function's fresh classes come from a stream of their own seeded by it
    (the k-th fresh class of a function is the same for every ``rng``), each with its runtime
    fields drawn from ``rng``: ``--jobs`` workers given one ``class_seed`` compile the same kernels,
    and Triton's disk cache hands each kernel compiled by one of them to the others.
    """

    def __init__(self, fresh: float, env: Env, class_seed: int | None = None):
        if not 0.0 <= fresh <= 1.0:
            raise ValueError(f"fresh: expected a probability in [0, 1], got {fresh!r}")
        self.fresh, self.env, self.class_seed = fresh, env, class_seed
        self.class_rngs: dict = {}  # function -> its stream of fresh classes (with class_seed)
        self.classes: dict = {}  # function -> {class key: first spec of the class}
        self.drawn: dict = {}  # function -> {"fresh": n, "mutated": n}

    def next(self, function: str, rng: random.Random) -> dict:
        seen = self.classes.setdefault(function, {})
        tally = self.drawn.setdefault(function, {"fresh": 0, "mutated": 0})
        p = fresh_probability(self.fresh, len(seen))
        if p >= 1.0 or rng.random() < p:
            if self.class_seed is None:
                spec = draw(function, rng, self.env)
            else:
                classes = self.class_rngs.setdefault(function, random.Random(f"{self.class_seed}:{function}"))
                spec = mutate(draw(function, classes, self.env), rng, self.env)
            seen.setdefault(class_key(spec), spec)
            tally["fresh"] += 1
            return spec
        parent = seen[list(seen)[rng.randrange(len(seen))]]
        tally["mutated"] += 1
        return mutate(parent, rng, self.env)

    def stats(self) -> dict:
        """Per function: classes seen, fresh draws and mutated draws."""
        return {f: {"classes": len(self.classes.get(f, {})), **self.drawn[f]} for f in self.drawn}
