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
    assert lens.tolist() == [n + ns["steps"] for n in ns["prompt_lens"]]
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
