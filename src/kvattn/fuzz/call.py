"""The :class:`Call` a builder returns: the public function's keyword arguments, the float64
expectation, the output buffers poisoned before each run; and :func:`request_rows` (a request's
rows of an output). The public functions are looked up by module attribute at each call, so a test
can monkeypatch one."""

from __future__ import annotations

import importlib
import random
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..formats import FP4Tensor, dequantize_nvfp4_output
from ..testing import poison_


PUBLIC = {
    "batch_decode": ("kvattn.decode", "xqa_batch_decode_with_kv_cache"),
    "xqa": ("kvattn.xqa", "xqa"),
    "single_decode": ("kvattn.decode", "single_decode_with_kv_cache"),
    "mla": ("kvattn.mla", "xqa_batch_decode_with_kv_cache_mla"),
    "prefill": ("kvattn.prefill", "trtllm_batch_context_with_kv_cache"),
}


def public(function: str) -> Callable:
    module, name = PUBLIC[function]
    return getattr(importlib.import_module(module), name)


@dataclass
class Call:
    """One materialised call. ``out_kind`` picks the tolerance ("half", "float32", "fp8",
    "nvfp4"); ``stored_scale`` divides the exact output where the function stores it divided
    (an fp8 batch-decode output, by ``o_scale``)."""

    function: str
    kwargs: dict
    exact: Callable[[], tuple]  # () -> (float64 output, float64 LSE or None), on the CPU
    out_kind: str
    buffers: list = field(default_factory=list)  # output / LSE buffers the call writes, poisoned before each run
    stored_scale: float = 1.0
    o_sf_scale: float = 1.0
    return_lse: bool = False
    request: Optional[Callable[[int], "Call"]] = None
    rewrite: Optional[Callable[[random.Random], None]] = None
    batch: int = 1

    def poison(self) -> None:
        for t in self.buffers:
            poison_(t)

    def run(self):
        """Poison the output buffers, call the public function, return ``(out, lse or None)`` as
        float32 tensors on the call's device (an NVFP4 output dequantised)."""
        self.poison()
        return self.outputs(public(self.function)(**self.kwargs))

    def outputs(self, result):
        if self.function == "xqa":
            out = self.kwargs["output"]
            lse = result if self.return_lse else None
        elif self.return_lse:
            out, lse = result
        else:
            out, lse = result, None
        if isinstance(out, FP4Tensor):
            out = dequantize_nvfp4_output(out, self.o_sf_scale)
        return out, lse

    def expected(self):
        return self.exact()


def _packed(call: Call):
    """The offsets of the requests' packed query rows (prefill, ragged drafts), or None."""
    return call.kwargs.get("cum_seq_lens_q") if call.function == "prefill" else call.kwargs.get("q_cu_seq_lens")


def request_rows(call: Call, b: int) -> slice:
    """The rows of ``call``'s output (and LSE) that belong to request ``b``."""
    spec_rows = {"batch_decode": call.kwargs.get("q_len_per_req") or 1}
    packed = _packed(call)
    if packed is not None:
        cum = packed.tolist()
        return slice(cum[b], cum[b + 1])
    n = spec_rows.get(call.function, 1)
    return slice(b * n, (b + 1) * n)


def row_counts(call: Call) -> list:
    """Query rows of each request of ``call`` (one read of the packed offsets)."""
    packed = _packed(call)
    if packed is None:
        return [request_rows(call, 0).stop] * call.batch
    cum = packed.tolist()
    return [hi - lo for lo, hi in zip(cum, cum[1:])]
