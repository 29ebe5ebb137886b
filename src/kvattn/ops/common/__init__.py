"""``@triton.jit`` building blocks shared by the decode, prefill and MLA kernel families, one module
a topic:

- :mod:`.softmax_merge`: online softmax, finalisation, split-KV work division and the merge of
  split partials (the base-2 logit conventions every family follows are in its docstring);
- :mod:`.masks`: causal + sliding window (and a prefill tile's key ranges), speculative-decode draft
  bits, sinks;
- :mod:`.paging`: page ids, token offsets in strided (paged or contiguous) caches, L2 prefetch;
- :mod:`.kv_formats`: the ``KV_FORMAT`` codes (from the format table, :mod:`kvattn._formats`);
- :mod:`.dequant`: a cache tile into registers, whatever its format (fp8 / NVFP4 dequantised);
- :mod:`.positions`: RoPE and ALiBi;
- :mod:`.quantize`: fp8 rounding and NVFP4 encoding of outputs;
- :mod:`.tiles`: the tile products and the logit soft cap;
- :mod:`.predicates`: a scalar condition widened into a mask that every Triton's loads and stores take;
- :mod:`.combine`: the combine kernel, merging split partials (decode's and MLA's launches), and
  :mod:`.splits`: the host rules of split launches both families follow (not re-exported);
- :mod:`.balance`, :mod:`.gluon_compat`, :mod:`.gluon_dequant`: the balanced split, Gluon's
  version shims and its dequantising pieces (imported by name).

The package re-exports every piece, so a kernel module imports the shared vocabulary as
``from ..common import name`` whichever topic holds it.
"""

from __future__ import annotations

from .predicates import as_mask  # noqa: F401
from .softmax_merge import (  # noqa: F401
    LOG2E, online_softmax_step, online_softmax_step_tile, full_tile_softmax, softmax_finalize, merge_partials, split_bounds,
)
from .masks import window_causal_allowed, spec_draft_allowed, sink_logits2, causal_key_ranges  # noqa: F401
from .kv_formats import (  # noqa: F401
    KV_HALF, KV_FP8, KV_NVFP4, KV_FP8_WORDS, KV_NVFP4_WORDS, is_nvfp4, has_block_scales, element_bits, storage_bytes,
)
from .paging import (  # noqa: F401
    load_page_ids, token_pages, token_offsets, kv_token_offsets, page_token_offsets, prefetch_rows_l2,
    load_run_ids, run_pages,
)
from .dequant import (  # noqa: F401
    e2m1_values, NVFP4_PAIRS_PTX, nvfp4_words_f16, e4m3_words_f16, tma_kv_tile, opaque, l2_policy, load_words,
    float16_operand, load_kv_tile,
)
from .positions import (  # noqa: F401
    FAST_TRIG, TWO_PI_A, TWO_PI_B, TWO_PI_C, INV_TWO_PI, rope_freqs, rope_angle, rope_table, rope_rotate,
    rope_query_per_key, alibi_slopes,
)
from .quantize import FP8_MAX, round_to_e4m3, store_scaled, e2m1_codes, quantize_nvfp4_rows  # noqa: F401
from .tiles import tile_scores, tile_diagonal, tile_pv, soft_cap  # noqa: F401
