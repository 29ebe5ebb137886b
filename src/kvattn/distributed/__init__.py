"""Context-parallel decode: one sequence's KV cache spread over the ranks of a process group.

Each rank holds a slice of every request's keys, attends over it with kvattn's local kernels
(with ``return_lse``, float32 outputs, no sinks), and the ranks exchange their partial states
``(o, lse)`` in one collective and merge them exactly (:func:`kvattn.merge_states`), the sinks
counted once in the merge. The exchange moves ``rows x heads x (D + 1)`` float32 values a rank,
small next to the KV bytes each rank reads.

Works over any ``torch.distributed`` process group (NCCL for CUDA tensors, gloo for CPU ones) of
any size. Sharding, calls and CUDA-graph capture: ``docs/distributed.md``.

Sharding a paged cache (:class:`PageSharding`). A request's *logical* page ``p`` (tokens
``p * page_size ..``) lives on one rank, at a *local* page index there; each rank's page table
lists its own pages in local order (``block_tables[b, i]`` = its pool's id of local page ``i``).

* ``"round_robin"``: page ``p`` on rank ``p % R`` at local index ``p // R``. Balanced at every
  length within one page, and a page never moves as the request grows (the new token goes to
  the rank that owns its page): the scheme for decode, where sequences grow.
* ``"contiguous"``: ranks ``0 .. R-2`` hold ``span_pages`` pages each (rank ``r`` pages
  ``r * span .. (r + 1) * span - 1``), the last rank all the pages past them. Keeps each rank's
  keys contiguous in position, so a window touches one or two ranks only: for a long prompt
  spread once (``span_pages = ceil(pages / R)``), with later tokens appended on the last rank.

All calls take the *global* ``seq_lens`` (the same on every rank; each rank derives its local
lengths on the device, without a host sync) and a global host bound ``max_seq_len``.

Example (one process standing for both ranks of a 2-rank group; each rank computes its state
with :meth:`PageSharding.local_seq_lens` and the local kernel, then the states merge):

>>> import torch, kvattn
>>> from kvattn.distributed import PageSharding
>>> sh = PageSharding(world_size=2, page_size=16)
>>> lens = torch.tensor([40, 0, 17], dtype=torch.int32)
>>> [sh.local_seq_lens(lens, r).tolist() for r in range(2)]
[[24, 0, 16], [16, 0, 1]]
"""

from .context_parallel import batch_decode, mla_decode, single_decode
from .sharding import SCHEMES, PageSharding, shard_kv_cache, shard_range

# The repository's benchmarks/distributed_decode.py times these two pieces of a call alone.
from .context_parallel import _local_lengths  # noqa: F401
from .exchange import _ALL_GATHER  # noqa: F401

__all__ = ["PageSharding", "shard_range", "shard_kv_cache", "batch_decode", "mla_decode", "single_decode"]
