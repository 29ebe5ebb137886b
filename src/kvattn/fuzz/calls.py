"""From a spec (:mod:`kvattn.fuzz.draws`) to tensors and a call of the public function.

:func:`build` makes every tensor from the spec's seed (random values, never zeros; pages scattered
over a random permutation of the pool; NaN in every cache slot no request uses; NaN-poisoned output
buffers), and returns a :class:`Call`: ``run()`` calls the public function, ``expected()`` the
float64 formulation (:mod:`kvattn.dense`) on the tensors as they are now (so a graph replay after
lengths and tables were rewritten in place is checked against the new values), ``request(b)`` the
same call for request ``b`` alone (batch-invariant mode) and ``rewrite(rng)`` new lengths, tables
and scale values written into the call's own tensors (CUDA-graph mode).

The public functions are looked up by module attribute at each call, so a test can monkeypatch one.
The builders, one module a family: ``build_decode.py`` (batch decode, xqa, single decode),
``build_mla.py``, ``build_prefill.py``; what they share: ``build_common.py``; the :class:`Call`:
``call.py``.
"""

from __future__ import annotations

import torch

from .build_decode import _batch_decode, _single_decode, _xqa
from .build_mla import _mla
from .build_prefill import _prefill
from .call import Call, public, request_rows, row_counts  # noqa: F401  (the fuzzer's names for a built call)

BUILDERS = {"batch_decode": _batch_decode, "xqa": _xqa, "single_decode": _single_decode, "mla": _mla,
            "prefill": _prefill}


def build(spec: dict, device="cpu") -> Call:
    """The call a spec describes, its tensors on ``device``. Options the spec lacks take their
    "off" values, so a reproducer written before an argument was registered still runs."""
    from .draws import OPTIONS

    spec = {**OPTIONS[spec["function"]], **spec}
    return BUILDERS[spec["function"]](spec, torch.device(device))
