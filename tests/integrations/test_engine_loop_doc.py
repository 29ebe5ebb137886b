"""The engine loop of ``docs/transformers.md`` runs as written and computes attention.

The test executes the document's Python block (on CPU through the reference backend; on a GPU with
the kernels and the CUDA-graph replay of the decode step), then recomputes the last decode step
from the pages the loop wrote: each request's keys and values gathered through its page table, and
float64 softmax attention of the step's queries over them.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parents[2] / "docs" / "transformers.md"


def engine_loop_code() -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    return next(b for b in blocks if "def decode_step" in b)


def test_engine_loop_runs_and_attends():
    ns: dict = {}
    exec(compile(engine_loop_code(), str(DOC), "exec"), ns)  # noqa: S102 - our own document
    kv, tables, lens = ns["kv_cache"], ns["tables_dev"], ns["seq_lens1"]
    q, out, scale, page = ns["q1"], ns["out1"], ns["scale"], ns["page"]
    prompt_lens, steps = ns["prompt_lens"], ns["steps"]
    assert lens.tolist() == [n + steps for n in prompt_lens]
    # Replay the document's random draws: the K/V every token should have in the cache.
    gen = torch.Generator().manual_seed(0)
    Hq, Hkv, D, dtype = ns["Hq"], ns["Hkv"], ns["D"], ns["dtype"]
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(kv.device, dtype)  # noqa: E731
    total = sum(prompt_lens)
    _, k_pre, v_pre = rand(total, Hq, D), rand(total, Hkv, D), rand(total, Hkv, D)
    rand(q.shape[0], Hq, D), rand(q.shape[0], Hkv, D), rand(q.shape[0], Hkv, D)  # the initial buffers
    k_steps, v_steps = [], []
    for _ in range(steps):
        rand(q.shape[0], Hq, D)
        k_steps.append(rand(q.shape[0], Hkv, D))
        v_steps.append(rand(q.shape[0], Hkv, D))
    start = 0
    for b, n in enumerate(prompt_lens):
        want_k = torch.cat([k_pre[start:start + n]] + [ks[b:b + 1] for ks in k_steps])
        want_v = torch.cat([v_pre[start:start + n]] + [vs[b:b + 1] for vs in v_steps])
        start += n
        t = torch.arange(n + steps, device=kv.device)
        pages = tables[b].long()[t // page]
        assert torch.equal(kv[pages, 0, t % page], want_k)
        assert torch.equal(kv[pages, 1, t % page], want_v)
    for b in range(q.shape[0]):
        n = int(lens[b])
        t = torch.arange(n, device=kv.device)
        pages = tables[b].long()[t // page]
        k = kv[pages, 0, t % page].double()  # [n, Hkv, D]
        v = kv[pages, 1, t % page].double()
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        s = torch.einsum("hd,nhd->hn", q[b].double(), k) * scale
        ref = torch.einsum("hn,nhd->hd", s.softmax(-1), v)
        err = (out[b].double() - ref).norm() / ref.norm()
        assert float(err) < 2e-2, (b, float(err))
