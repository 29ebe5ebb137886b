"""Shrinking a failing spec, and the reproducer snippet.

:func:`shrink` tries smaller specs one edit at a time -- fewer requests, shorter lengths, fewer
heads, a smaller head dim, each option back to its "off" value (``draws.OPTIONS``) -- and keeps an
edit whenever the call still fails the same way (a mismatch stays a mismatch, an error keeps its
exception type), until no edit helps or the budget of tries is spent. :func:`snippet` prints the
result as a Python program that rebuilds the call and checks it (:func:`kvattn.fuzz.replay`).
"""

from __future__ import annotations

import pprint
import time
from typing import Callable, Iterator

from .draws import DEPENDENT, OPTIONS, normalise


def _same_failure(a: dict, b: dict) -> bool:
    if a["result"] == "ok" or a["result"] != b["result"]:
        return False
    return a["result"] != "error" or a.get("error_type") == b.get("error_type")


def candidates(spec: dict) -> Iterator[dict]:
    """Smaller specs, the biggest cuts first."""
    s = spec
    # Fewer requests: keep one, the first half, or all but one.
    if "lens" in s and len(s["lens"]) > 1:
        n = len(s["lens"])
        for keep in [[i] for i in range(n)] + [list(range(n // 2))] + [[j for j in range(n) if j != i] for i in range(n)]:
            if not keep:
                continue
            c = dict(s, lens=[s["lens"][i] for i in keep])
            for per_request in ("q_lens", "drafts"):  # lists with one entry a request
                if isinstance(s.get(per_request), list):
                    c[per_request] = [s[per_request][i] for i in keep]
            yield c
    # Shorter requests: each length halved, then down by one.
    for key in ("lens", "q_lens"):
        if key in s:
            for i, n in enumerate(s[key]):
                for smaller in (n // 2, n - 1):
                    if 0 <= smaller < n:
                        vals = list(s[key])
                        vals[i] = smaller
                        yield dict(s, **{key: vals})
    if "length" in s:
        for smaller in (s["length"] // 2, s["length"] - 1):
            if 0 <= smaller < s["length"]:
                yield dict(s, length=smaller)
    # Fewer heads.
    for key in ("group", "kv_heads", "heads"):
        if key in s and s[key] > 1:
            yield dict(s, **{key: 1})
            yield dict(s, **{key: s[key] // 2})
    # Options off, one at a time (with the options that depend on them).
    for key, off in OPTIONS[s["function"]].items():
        if key in s and s[key] != off:
            c = dict(s, **{key: off})
            for dep in DEPENDENT.get(key, ()):
                if dep in OPTIONS[s["function"]]:
                    c[dep] = OPTIONS[s["function"]][dep]
            yield c


def shrink(spec: dict, failure: dict, run: Callable[[dict], dict], budget: int = 200,
           deadline: float | None = None) -> tuple:
    """The smallest spec found that fails like ``failure``, within ``budget`` tries and before
    ``deadline`` (``time.perf_counter()``); returns ``(spec, outcome, tries)``."""
    best, best_outcome, tries = spec, failure, 0
    improved = True
    while improved and tries < budget:
        improved = False
        for cand in candidates(best):
            if deadline is not None and time.perf_counter() > deadline:
                return best, best_outcome, tries
            cand = normalise(cand)
            if cand == best:
                continue
            tries += 1
            outcome = run(cand)
            if _same_failure(failure, outcome):
                best, best_outcome, improved = cand, outcome, True
                break
            if tries >= budget:
                break
    return best, best_outcome, tries


def _describe(value) -> str:
    import torch

    from ..formats import FP4Tensor

    if isinstance(value, torch.Tensor):
        text = f"{str(value.dtype).replace('torch.', '')} {list(value.shape)}"
        if value.numel() == 1 and value.dim() <= 1:
            text += f" = {value.flatten()[0].item():.6g}"
        elif not value.is_contiguous():
            text += f" strides {list(value.stride())}"
        return text
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_describe(v) for v in value) + ")"
    if isinstance(value, FP4Tensor):
        return f"FP4Tensor {list(value.data.shape)}"
    return repr(value)


def describe(spec: dict) -> list:
    """The call a spec makes, one ``# name: value`` comment line an argument (tensors as dtype,
    shape and, for views, strides; the lengths and tables in full when short)."""
    import torch

    from .calls import build

    try:
        call = build(spec, "cpu")
    except Exception as exc:  # the builder itself failing is the finding then
        return [f"# (the call could not be built: {type(exc).__name__}: {exc})"]
    lines = []
    for name, value in call.kwargs.items():
        text = _describe(value)
        if name in ("seq_lens", "block_tables", "page_table", "cum_seq_lens_q") and value.numel() <= 16:
            text += f" {value.to(torch.int64).tolist()}"
        lines.append(f"#   {name}: {text}")
    return lines


def snippet(spec: dict, mode: str, device: str, mode_seed: int, why: str) -> str:
    """A Python program reproducing one failure: rebuilds the call from its spec, runs it in its
    mode and raises AssertionError while the failure is still there. Comments list the call's
    arguments."""
    body = pprint.pformat(spec, width=100, sort_dicts=False)
    public = {"batch_decode": "kvattn.decode.xqa_batch_decode_with_kv_cache", "xqa": "kvattn.xqa.xqa",
              "single_decode": "kvattn.decode.single_decode_with_kv_cache",
              "mla": "kvattn.mla.xqa_batch_decode_with_kv_cache_mla",
              "prefill": "kvattn.prefill.trtllm_batch_context_with_kv_cache"}[spec["function"]]
    return (
        f"# kvattn fuzz reproducer: {spec['function']}, mode {mode}, on {device}\n"
        f"# {why}\n"
        f"# {public}(\n" + "\n".join(describe(spec)) + "\n# )\n"
        "from kvattn.fuzz import replay\n\n"
        f"spec = {body}\n"
        f"replay(spec, mode={mode!r}, device={device!r}, mode_seed={mode_seed})\n"
    )
