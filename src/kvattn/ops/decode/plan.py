"""Launchers of the decode kernels: pick the config, size the grid and the KV split, launch.

Everything here reads host-side facts only (shapes, strides, dtypes, the SM count, the host bound
``max_seq_len``): nothing waits for the device, and with ``out`` and ``workspace`` given nothing
is allocated (but a copy of non-contiguous ``seq_lens``), so a call can be captured in a CUDA
graph and replayed with new lengths and tables.

Host time. What a call derives from its host facts (a :class:`DecodeFacts`: config, row tiling,
strides, constexprs, and per split count the grid and both launches) is a :class:`_Plan`, built by
a function of those facts alone and cached under them; a call then computes only its split count
(memoised per ``max_seq_len``/window span), reads the data pointers and launches through
:mod:`..launch.fast_launch`, every kernel argument named once in :func:`_split_launch` /
:func:`_combine_launch`. Plans are rebuilt, not cached, while a ``decode_configs.override`` is
active.
"""

from __future__ import annotations

import operator
from dataclasses import replace
from itertools import compress, repeat
from typing import NamedTuple

import torch

from ...runtime import device as _device, env as _env
from ..._formats_table import BY_DTYPE, BY_NAME
from ...formats import FP8_DTYPE
from . import configs as decode_configs
from ...runtime import fast_launch
from ..common.combine import lanes_combine_kernel
from .kernels import SPLIT_TUPLES, decode_combine_kernel, decode_split_kernel
from ...runtime.common import (
    arch, cdiv, device_guard, int32_lengths, kv_format_code, next_power_of_2, words_aligned, words_allowed,
)
from ...runtime.plans import cached_plan
from ...runtime.workspace import MAX_COUNTERS, capturing, launch_counters, partials_fit, split_partials
from ..common.balance import unit_cap
from ..common.splits import combine_block_s, invariant_span, invariant_splits

try:  # TMA reads of contiguous caches (Triton 3.4+)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None

# The tile packs Q_LEN x GROUP query rows; a larger group is cut into several row blocks.
MIN_BLOCK_M = 16  # tl.dot's smallest M

# A call's values, by name (fast_launch.CallLayout): its tensors, _ALWAYS then the _OPTIONAL ones
# that are given, its ints and its floats; each launch names the value each kernel parameter takes
# (an absent optional tensor's parameter takes the query, which the kernel never reads for it).
_ALWAYS = ("query", "k", "v", "out", "part_o", "part_lse", "counters")
_OPTIONAL = ("k_sf", "v_sf", "k_table", "v_table", "seq_lens", "mask", "sinks", "logit", "out_scale", "lse",
             "kv_start")
_INTS = ("fixed_len", "window_left")
_FLOATS = ("logit_factor", "out_factor", "soft_cap", "rope_theta", "rope_scale")
_NONES = tuple(repeat(None, len(_OPTIONAL)))

_MAX_SPANS = 4096  # split counts memoised per plan


def _as_rows(shape: tuple, stride: tuple) -> tuple[tuple, tuple]:
    """Shape and strides of a query or output as ``[rows, Hq, D]``: ``[B, 1, Hq, D]`` (xqa's beam
    dim) drops dim 1, ``[Hq, D]`` (one row) gains a leading dim, with the strides ``q[:, 0]`` and
    ``q.unsqueeze(0)`` would have (they are kernel arguments, so they pick the specialisation)."""
    if len(shape) == 4:
        return (shape[0], shape[2], shape[3]), (stride[0], stride[2], stride[3])
    if len(shape) == 2:
        return (1, shape[0], shape[1]), (shape[0] * stride[0], stride[0], stride[1])
    return tuple(shape), tuple(stride)


def _lse_row_stride(stride: tuple | None, num_heads: int) -> int:
    """Row stride of an LSE ``[rows, Hq]``, or of ``[Hq]`` as one row (what ``lse.unsqueeze(0)``
    would have); 0 without an LSE."""
    if stride is None:
        return 0
    return stride[0] if len(stride) == 2 else num_heads * stride[0]


def _row_tiling(rows: int, head_dim: int, use_dot: bool) -> tuple[int, int]:
    """``(BLOCK_M, M_BLOCKS)`` for ``rows`` query rows per (request, KV head)."""
    if not use_dot:
        return 1, rows
    cap = 128 if head_dim <= 128 else 64
    block_m = min(max(MIN_BLOCK_M, next_power_of_2(rows)), cap)
    return block_m, cdiv(rows, block_m)


# ---------------------------------------------------------------------------------------------
# plans
# ---------------------------------------------------------------------------------------------
class DecodeFacts(NamedTuple):
    """Every host fact a decode plan reads: the key of the plan cache. ``launch_decode`` computes
    each into a local of the field's name and builds the record from them (a test checks the
    names and their order), positionally: keyword construction of 33 fields costs microseconds of
    host time a call (``lab/notes/host-path.md``)."""

    device: torch.device
    interpreter: bool  # TRITON_INTERPRET: the interpreter's config table, no inline PTX
    q_shape: tuple  # [rows, Hq, D], [rows, 1, Hq, D] or [Hq, D] (one row)
    q_stride: tuple
    k_shape: tuple  # [P, page, Hkv, Ds] (paged) or Hkv (contiguous [L, Hkv, Ds]: L is fixed_len, per call)
    k_stride: tuple
    v_stride: tuple
    kv_dtype: torch.dtype
    out_shape: tuple
    out_stride: tuple
    out_dtype: torch.dtype
    present: tuple  # bool per _OPTIONAL tensor: given or not
    ksf_stride: tuple | None
    vsf_stride: tuple | None
    kt_stride: tuple | None
    vt_stride: tuple | None
    same_table: bool  # K and V read one page table
    mask_stride: tuple | None
    lse_stride: tuple | None
    ws_numel: int | None  # workspace bytes (None: partials allocated)
    paged: bool
    q_len: int
    has_window: bool  # window_left >= 0 (the window itself is a per-call int)
    has_rope: bool  # RoPE (its scale and theta are per-call floats)
    alibi: bool
    has_soft_cap: bool  # a soft cap > 0 (its value is a per-call float)
    use_tensor_cores: bool | None
    max_programs: int | None
    enable_pdl: bool
    kv_aligned4: bool  # the words formats' base pointers 4-byte aligned (words_aligned)
    fused_merge: bool  # KVATTN_FUSED_MERGE
    kv_aligned16: bool  # contiguous K and V 16-byte aligned (TMA)
    graph_capture: bool  # RoPE over a contiguous cache while capturing a CUDA graph (tma_readable)
    batch_invariant: bool = False  # kvattn.set_batch_invariant / KVATTN_BATCH_INVARIANT


class _Plan:
    """Everything a call derives from its host facts (:class:`DecodeFacts`).

    Built from the facts alone, so two calls with equal facts get equal plans. The split count
    also depends on the call's key span; :meth:`launches` memoises it per span.
    """

    def __init__(self, facts: DecodeFacts):
        f = facts
        q_shape, q_stride = _as_rows(f.q_shape, f.q_stride)
        out_stride = _as_rows(f.out_shape, f.out_stride)[1]
        self.rows_total, self.num_heads, self.head_dim = q_shape
        self.batch = self.rows_total // f.q_len
        if f.paged:
            self.num_pages, self.page_size, self.num_kv_heads = f.k_shape[0], f.k_shape[1], f.k_shape[2]
            self.k_strides, self.v_strides = tuple(f.k_stride[:3]), tuple(f.v_stride[:3])
        else:  # [L, Hkv, D]: page 0, slot = token
            self.num_pages, self.page_size, self.num_kv_heads = 1, 1, f.k_shape
            self.k_strides, self.v_strides = (0, f.k_stride[0], f.k_stride[1]), (0, f.v_stride[0], f.v_stride[1])
        self.group = self.num_heads // self.num_kv_heads
        fmt = BY_DTYPE[f.kv_dtype]
        self.kv_format = fmt.name
        sf_strides = (*f.ksf_stride[:3], *f.vsf_stride[:3]) if fmt.scale_block else ()  # (block scales: paged only)
        self.kv_code = kv_format_code(self.kv_format, words_allowed(f.device, f.interpreter, f.kv_aligned4),
                                      (*self.k_strides, *self.v_strides), self.head_dim, sf_strides)
        self.rows = f.q_len * self.group
        arch_name = arch(f.device, f.interpreter)
        cfg0 = decode_configs.config(arch_name, self.kv_format, self.head_dim, 16, f.has_rope)
        use_dot = self.rows > 1
        if self.rows == 1:
            # One query row: tensor cores (M padded to 16) are still the only path whose K/V loads
            # Triton pipelines, so the table may prefer them even when the caller did not ask.
            use_dot = cfg0.dot_single_row or bool(f.use_tensor_cores)
        self.use_dot = use_dot
        self.block_m, self.m_blocks = _row_tiling(self.rows, self.head_dim, use_dot)
        self.items = self.batch * self.num_kv_heads * self.m_blocks
        self.sm_count = _device.sm_count(f.device)
        bandwidth = _device.memory_bandwidth(f.device)  # peak copy bytes/s (0: unknown), what the H200 rules read
        self.bandwidth = bandwidth
        table = (arch_name, self.kv_format, self.head_dim, self.block_m, f.has_rope)  # what every table is read by
        # Batch-invariant mode: the main table only (the others are chosen by the batch, the SM
        # count or the call's key bound), fixed-span splits, always the combine launch.
        self.invariant = invariant = f.batch_invariant
        long_tiles = not invariant and decode_configs.wants_long_tiles(*table, page_size=self.page_size,
                                                                       items=self.items, sm_count=self.sm_count)
        few_items = not invariant and not long_tiles and decode_configs.wants_few_item_tiles(
            *table, items=self.items, sm_count=self.sm_count)
        # On a GPU of more copy bandwidth an SM than the long tiles were measured on, the main
        # table's tiles replace them (configs.main_replaces_long), at the long tiles' merge round
        # where that round matters (_merge_round_of).
        main_for_long = long_tiles and decode_configs.main_replaces_long(
            *table, sm_count=self.sm_count, bandwidth=bandwidth)
        long_tiles = long_tiles and not main_for_long
        # (a uniform launch of those tiles merged by the combine launch: configs.combine_stages)
        self.combine_stages_ok = main_for_long
        self.cfg = cfg = decode_configs.config(*table, "long" if long_tiles else ("few" if few_items else "main"))
        # past the long tiles' bandwidth an SM (an H200): where the one-row rules below apply
        past_bw = decode_configs.past_sm_bandwidth(bandwidth, self.sm_count, cfg.long_max_sm_gbps)
        # Launches of fewer programs than SMs may split down to one tile (num_splits)
        self.tile_splits_ok = not invariant and decode_configs.tile_splits(
            cfg, paged=f.paged, sm_count=self.sm_count, bandwidth=bandwidth)
        # Spans of at most SHORT_SPAN keys may take another table, and so may launches whose K/V
        # bytes are few enough for streaming tiles (per-span choices: see config_for).
        self.cfg_short = None
        if not invariant and decode_configs.has_short_tiles(*table, page_size=self.page_size):
            self.cfg_short = decode_configs.config(*table, "short")
        self.cfg_stream, self.stream_span = None, 0  # longest span that takes the streaming tiles
        stream_kind = None
        if invariant:
            pass
        elif decode_configs.wants_stream_tiles(*table, items=self.items, sm_count=self.sm_count):
            stream_kind = "stream"
        elif decode_configs.wants_one_row_tiles("rope_stream", *table, paged=f.paged, rows=self.rows):
            stream_kind = "rope_stream"
        if stream_kind is not None:
            self.stream_span = decode_configs.stream_span(
                batch=self.batch, num_kv_heads=self.num_kv_heads,
                row_bytes=fmt.row_bytes(self.head_dim), l2_bytes=_device.l2_bytes(f.device))
            self.cfg_stream = decode_configs.config(*table, stream_kind)
        # keys a split of the streaming tiles holds at most (0: any; paged launches' stream table only)
        self.stream_split_keys = 0 if stream_kind != "stream" else decode_configs.stream_split_limit(
            self.cfg_stream, batch=self.batch, sm_count=self.sm_count, bandwidth=bandwidth)
        # Past the streaming spans, one-row launches over a contiguous cache take their own table.
        self.cfg_contig = None
        if self.cfg_stream is not None and decode_configs.wants_one_row_tiles("contig", *table, paged=f.paged,
                                                                              rows=self.rows):
            self.cfg_contig = decode_configs.config(*table, "contig")
            # pipelined at the config's one_row_stages on a GPU past the long tiles' bandwidth an SM
            # (configs._SM90_CONTIG_PIPELINED_STAGES)
            if self.cfg_contig.one_row_stages and past_bw:
                self.cfg_contig = replace(self.cfg_contig, num_stages=self.cfg_contig.one_row_stages)
        per_split = self.rows_total * self.num_heads * (self.head_dim + 1)
        self.fit = partials_fit(f.ws_numel, per_split, cfg.max_splits)
        # Split launches merge in their own last program (one counter an item) where they can.
        self.merge = f.fused_merge and self.items <= MAX_COUNTERS and not invariant
        self.has_workspace = f.ws_numel is not None
        self.merge_rows = min(self.block_m, next_power_of_2(self.rows))
        self.rope_query = f.has_rope and use_dot and self.rows == 1
        # fp8 caches with at most 8 query rows a KV head may put the keys in the products' M dim
        # (S^T = K Q^T, O^T = V^T P^T: mma.sync with N = 8 instead of 8 rows padded to a 16-row M
        # tile), where the config's keys_in_m allows it (_keys_in_m; lab/notes/formats.md "Formats:
        # where the fp8 decode loop's instructions go"). Either way such a launch runs 8 rows a
        # program: rows in M at 8 rows (Triton pads the products' M, the softmax stays at 8 rows)
        # beat 16 rows on every fp8 row timed
        # (lab/notes/formats.md "Formats: rows in M at 8 rows for short requests").
        self.keys_in_m_ok = (self.kv_format == "fp8" and use_dot and self.rows <= KEYS_IN_M_ROWS and self.m_blocks == 1
                             and not f.has_rope and not f.alibi)
        tma_rules = dict(
            paged=f.paged, compiled=not f.interpreter and _device.has_tma(f.device), kv_format=self.kv_format,
            aligned16=f.kv_aligned16, strides=(*f.k_stride[:2], *f.v_stride[:2]), rope=f.has_rope,
            rope_query=self.rope_query,
        )
        self.tma_ok = tma_readable(graph_capture=f.graph_capture, **tma_rules)
        # An eager plan whose captured twin may read by TMA warms that kernel up (launch_decode).
        self.tma_twin = not f.graph_capture and f.has_rope and tma_readable(graph_capture=True, **tma_rules)
        self.warmed: set = set()
        self.gdc = cfg.pdl and not f.interpreter
        self.q_len, self.paged, self.has_window = f.q_len, f.paged, f.has_window
        self.rope, self.alibi = f.has_rope, f.alibi
        self.soft_cap, self.max_programs, self.enable_pdl = f.has_soft_cap, f.max_programs, f.enable_pdl
        self.same_table = f.same_table
        # Token offsets computed where the page ids load and carried in their place: paged caches
        # without block scales, strides multiples of 16 elements (the kernel declares the offsets
        # so, for 16-byte copies); V takes K's offsets where the tables and the strides are the
        # same (_page_offsets; lab/notes/formats.md "Formats: where the fp8 decode loop's
        # instructions go", candidate b).
        aligned = all(s % 16 == 0 for s in (*self.k_strides, *self.v_strides))
        self.page_offsets_mode = 0 if not f.paged or fmt.scale_block or not aligned else (
            2 if f.same_table and self.k_strides == self.v_strides else 1)
        self.has = dict(zip(_OPTIONAL, f.present))
        # Page runs (_page_runs): tiles that start at multiples of BLOCK_N (no window, no first
        # keys: split_bounds cuts whole tiles from key 0)
        self.whole_tiles = not f.has_window and not self.has["kv_start"]
        self.out_fp8 = f.out_dtype == FP8_DTYPE
        self.strides = dict(
            q=tuple(q_stride[:2]), out=tuple(out_stride[:2]), k=self.k_strides, v=self.v_strides,
            k_sf=tuple(f.ksf_stride[:3]) if f.ksf_stride is not None and f.paged else (0, 0, 0),
            v_sf=tuple(f.vsf_stride[:3]) if f.vsf_stride is not None and f.paged else (0, 0, 0),
            k_table=tuple(f.kt_stride[:2]) if f.kt_stride is not None else (0, 0),
            v_table=tuple(f.vt_stride[:2]) if f.vt_stride is not None else (0, 0),
            mask=tuple(f.mask_stride[:2]) if f.mask_stride is not None else (0, 0),
            lse=_lse_row_stride(f.lse_stride, self.num_heads),
        )
        self.layout = fast_launch.CallLayout(_ALWAYS + tuple(compress(_OPTIONAL, f.present)), _INTS, _FLOATS)
        # Ragged batches may take the balanced split (common.balance), decided on the device from
        # the lengths; not with windows or first keys (their spans are not the lengths), xqa's capped
        # grid, batch-invariant mode, or a batch past one plan's register vector.
        self.balance_ok = (f.paged and not invariant and not f.has_window and not self.has["kv_start"]
                           and f.max_programs is None and 1 < self.batch <= MAX_BALANCED_BATCH)
        if main_for_long:
            self.cfg = self._merge_round_of(decode_configs.config(*table, "long"))
        # One query row an item of a paged cache, on a GPU past the long tiles' bandwidth an SM: a
        # span whose launch splits takes the config's one_row_stages (configs._SM90_THREE_AN_SM_STAGES).
        self.cfg_one_row = None
        if (not invariant and f.paged and self.rows == 1 and self.cfg.one_row_stages
                and self.cfg.one_row_stages != self.cfg.num_stages and past_bw):
            self.cfg_one_row = replace(self.cfg, num_stages=self.cfg.one_row_stages)
        # RoPE single decode on a GPU past the long tiles' bandwidth an SM: the config's wider
        # tiles (configs._SM90_ROPE_WIDE) for the plan's table and its streaming one.
        if not invariant and f.has_rope and not f.paged and self.rows == 1 and past_bw:
            self.cfg = _rope_wide(self.cfg)
            self.cfg_stream = self.cfg_stream and _rope_wide(self.cfg_stream)
        self._by_span: dict[int, tuple] = {}
        self._balances: dict[tuple, Balance | None] = {}  # by (config, split count)
        self._by_splits: dict[tuple, tuple] = {}  # by (config, split count, balanced)

    def _merge_round_of(self, long: decode_configs.DecodeConfig) -> decode_configs.DecodeConfig:
        """The main tiles, merging as many partials a round as the ``long`` tiles they replace
        (``configs.main_replaces_long``) where that round sets how many programs a request runs on.

        The main tiles' 4-warp programs load half the partials a round of the long tiles' 8-warp
        ones at the same ``balance_merge_values``, which at 8 query rows a KV head halves a
        request's unit cap in a balanced launch (``common.balance.unit_cap``: 16 against 32).
        Where a unit is one program (one KV head, one row block) the cap sets how many programs
        the longest request of a ragged batch runs on. Measured on an H200, same run: sw12 (45
        log-normal requests to 51550 keys, p64, 8/1 heads) 66.4 us on the long tiles, 89.5 on the
        main tiles, 62.3 on the main tiles at the long tiles' round; sw07 (22 requests to 88289,
        p16, 8/1) 186 / 220 / 187; 64 x 8192 p16 8/1 (an equal batch) 91.6 / 85.4 / 85.7. More KV
        heads spread a unit over that many programs, and their launches keep the main table's
        round as measured (lab/notes/decode.md "Decode: the long tiles on an H200")."""
        cfg = self.cfg
        if not (self.balance_ok and self.merge) or self.num_kv_heads * self.m_blocks != 1:
            return cfg
        values = long.balance_merge_values * long.num_warps // cfg.num_warps
        wide = replace(cfg, balance_merge_values=values)
        if unit_cap(_balanced_merge_block_s(self, wide, 1)) <= unit_cap(_balanced_merge_block_s(self, cfg, 1)):
            return cfg
        return wide

    def config_for(self, span: int) -> decode_configs.DecodeConfig:
        """The launch config of a key span: the short-request table up to ``SHORT_SPAN`` keys
        where the plan has one, the streaming table up to ``stream_span``, past it the one-row
        contiguous table where the plan has one, else the plan's table (at its ``one_row_stages``
        where the plan has that form and the span's launch splits at them). On an H200 a span whose
        streaming splits would be longer than ``configs.stream_split_limit`` keys takes the plan's
        table instead."""
        if self.cfg_short is not None and span <= decode_configs.SHORT_SPAN:
            return self.cfg_short
        if self.cfg_stream is not None and span <= self.stream_span and (
                not self.stream_split_keys or span <= self.stream_split_keys * self.num_splits(span, self.cfg_stream)):
            return self.cfg_stream
        if self.cfg_contig is not None:
            return self.cfg_contig
        if self.cfg_one_row is not None and self.num_splits(span, self.cfg_one_row) > 1:
            return self.cfg_one_row
        return self.cfg

    def num_splits(self, span: int, cfg: decode_configs.DecodeConfig | None = None) -> int:
        if self.invariant:
            cfg = cfg or self.config_for(span)
            splits = invariant_splits(cfg, span)
            if self.has_workspace and splits > self.fit:
                per_split = self.rows_total * self.num_heads * (self.head_dim + 1) * 4
                raise ValueError(
                    f"workspace_buffer: batch-invariant mode needs {splits} splits of "
                    f"{invariant_span(cfg)} keys for max_seq_len={span}, at least "
                    f"{16 + 16384 + splits * per_split} bytes, got a workspace with room for {self.fit}")
            return splits
        cfg = cfg or self.config_for(span)
        splits = self._whole_wave_splits(span, cfg)
        # Fewer programs than SMs: each program's chain of tiles, not the bytes, sets the time, so
        # the splits may be as short as one tile (configs.tile_splits). Not where a launch merging
        # in the kernel has the keys in M: more splits would move its merge to the combine launch,
        # whose rows in M were slower there (2 x 1338 fp8 keys 12.8 -> 13.4 us).
        if (self.tile_splits_ok and self.items * splits < self.sm_count and cfg.block_n < cfg.min_chunk
                and not (_keys_in_m(self, cfg) and self.merges(cfg, splits))):
            splits = max(splits, self._whole_wave_splits(span, replace(cfg, min_chunk=cfg.block_n)))
        return splits

    def _whole_wave_splits(self, span: int, cfg: decode_configs.DecodeConfig) -> int:
        """``configs.num_splits`` for this plan's launch of ``cfg`` over ``span`` keys."""
        return decode_configs.num_splits(
            cfg, items=self.items, span=span, sm_count=self.sm_count, fit=self.fit,
            max_programs=self.max_programs, kv_format=self.kv_format, head_dim=self.head_dim,
            rope_query=self.rope_query,
        )

    def combine_form(self, span: int, cfg: decode_configs.DecodeConfig, splits: int) -> tuple:
        """``(cfg, splits)`` of a uniform launch of the plan's own table whose splits the combine
        launch merges: on an fp8 cache the rows in M unless the config's ``combine_keys_in_m``;
        where the main tiles replace the long ones, splits of at most ``configs.COMBINE_STAGES_KEYS``
        keys run the config's ``combine_stages`` (three programs an SM: more, shorter splits) where
        that launch still merges by the combine launch. Measured: lab/notes/decode-combine-launches.md."""
        if cfg is not self.cfg:  # (the short-request, streaming and contiguous tables keep their own)
            return cfg, splits
        if self.keys_in_m_ok and cfg.keys_in_m and not cfg.combine_keys_in_m:
            cfg = replace(cfg, keys_in_m=False)
        if (self.combine_stages_ok and cfg.combine_stages and cfg.combine_stages != cfg.num_stages
                and span <= decode_configs.COMBINE_STAGES_KEYS * splits):
            alt = replace(cfg, num_stages=cfg.combine_stages)
            alt_splits = self.num_splits(span, alt)
            if alt_splits > 1 and not self.merges(alt, alt_splits):
                return alt, alt_splits
        return cfg, splits

    def merges(self, cfg: decode_configs.DecodeConfig, splits: int) -> bool:
        """Whether a launch of ``splits`` splits merges them in its own last programs."""
        return self.merge and splits > 1 and cdiv(splits, _merge_block_s(self, cfg, splits)) <= MAX_MERGE_ROUNDS

    def balance(self, cfg: decode_configs.DecodeConfig, splits: int) -> Balance | None:
        """The balanced launch's sizes for ``splits`` uniform splits, or None where the plan does
        not allow one (common.balance): its programs merge in the kernel (counters, with two more
        for the dynamic deal), a batch found uniform merges its ``splits`` partials in at most
        ``MAX_BALANCED_ROUNDS`` rounds, its partials fit the workspace, and the launch is of the
        kind the balanced split was measured to pay on (``configs.balance_pays``; not the
        short-request tiles, whose spans are too short to be unbalanced, nor the streaming tiles,
        whose unpipelined units the deal serialises: lab/notes/decode-ragged-batches.md "The
        streaming tiles keep the uniform split").

        The grid is one wave of resident programs (``configs.resident_slots``), whatever the
        split: the programs deal the units to themselves (a ragged batch's cut from its lengths,
        a uniform batch's ``splits`` a request), so a batch of few items still spreads over the
        whole GPU, and no program of a later wave starts only to find nothing left. Key spans
        under ``min_span`` keep the uniform launch (``configs.balance_min_span``: the uniform
        launch runs in one wave, and its programs are no longer than the balanced plan's units)."""
        if (not self.balance_ok or cfg.balance_waves <= 0 or not self.merge or self.items + 2 > MAX_COUNTERS
                or cfg is self.cfg_short or cfg is self.cfg_stream):
            return None
        merge_block_s = _balanced_merge_block_s(self, cfg, splits)
        if cdiv(splits, merge_block_s) > MAX_BALANCED_ROUNDS:
            return None
        if not decode_configs.balance_pays(cfg, items=self.items, sm_count=self.sm_count, kv_format=self.kv_format,
                                           head_dim=self.head_dim, rope_query=self.rope_query):
            return None
        slots = decode_configs.resident_slots(cfg, sm_count=self.sm_count, kv_format=self.kv_format,
                                              head_dim=self.head_dim, rope_query=self.rope_query, balanced=True)
        per_unit = self.num_kv_heads * self.m_blocks  # programs a unit (every KV head and row block)
        target = max(self.batch * splits, decode_configs.balance_target(
            cfg, sm_count=self.sm_count, programs_per_unit=per_unit,
            kv_format=self.kv_format, head_dim=self.head_dim, rope_query=self.rope_query))
        # A ragged plan has at most target + batch units (each request rounds up once), in lanes
        # lanes + batch (unit b + l: common.balance.lane_span), a uniform one batch x splits; a
        # request at most common.balance.unit_cap(merge_block_s) (ragged) or splits.
        lanes = bool(cfg.balance_lanes) and slots >= 2 * per_unit
        units = max(target, slots // per_unit if lanes else 0) + self.batch
        if self.has_workspace and units > self.fit * self.batch:
            return None
        min_span = decode_configs.balance_min_span(cfg, items=self.items, splits=splits, slots=slots)
        return Balance(target, units, merge_block_s, slots, min_span, lanes)

    def launches(self, span: int) -> tuple:
        """``(split launch, combine launch or None, numel_o, numel_lse, merged)`` for a key span
        (``merged``: the split launch merges its partials itself, with counters)."""
        hit = self._by_span.get(span)
        if hit is not None:
            return hit
        cfg = self.config_for(span)
        splits = self.num_splits(span, cfg)
        if (cfg, splits) not in self._balances:
            self._balances[cfg, splits] = self.balance(cfg, splits)
        bal = self._balances[cfg, splits]
        if bal is not None and span < bal.min_span:
            bal = None
        if bal is None and splits > 1 and not self.merges(cfg, splits):
            cfg, splits = self.combine_form(span, cfg, splits)
        hit = self._by_splits.get((cfg, splits, bal is not None))
        if hit is None:
            if bal is not None:
                rows = bal.units * self.q_len * self.num_heads
                combine = _lanes_combine_launch(self, cfg, splits, bal) if _combine_units(self, cfg, bal) else None
                hit = (_split_launch(self, cfg, splits, bal), combine, rows * self.head_dim, rows, True)
            else:
                numel_o = splits * self.rows_total * self.num_heads * self.head_dim
                numel_lse = splits * self.rows_total * self.num_heads
                merged = self.merges(cfg, splits)
                combine = _combine_launch(self, splits) if splits > 1 and not merged else None
                hit = (_split_launch(self, cfg, splits), combine, numel_o, numel_lse, merged)
            self._by_splits[cfg, splits, bal is not None] = hit
        if len(self._by_span) >= _MAX_SPANS:
            self._by_span.clear()
        self._by_span[span] = hit
        return hit


MAX_BALANCED_BATCH = 1024  # requests a balanced plan holds (one register vector a program)


class Balance(NamedTuple):
    """Sizes of a balanced launch (``common.balance``)."""

    target: int  # units a ragged plan aims at
    units: int  # units a plan has at most (the partials' room)
    merge_block_s: int  # partials the in-kernel merge loads a round
    programs: int  # the grid: one wave of resident programs, which deal the units among themselves
    min_span: int  # shorter key spans keep the uniform launch (configs.balance_min_span)
    lanes: bool = False  # a ragged batch in lanes (common.balance.lane_span), not dealt


# The in-kernel merge loads MERGE_BLOCK_S splits a round, each round an L2 round trip on the
# critical path (~1 us on an H100): past two rounds the combine launch (~2 us after the last split
# program) is the faster merge (lab/notes/decode.md "Decode: merging the split partials").
MAX_MERGE_ROUNDS = 2
# A balanced launch has no combine launch, so a batch it finds uniform merges its splits in the
# kernel: allowed up to 4 rounds (~3 us after the last split, ~1 us past the combine launch it
# replaces), which takes the last-wave split counts (configs.tail_fit, at most TAIL_SPLITS = 16) of
# few-item launches at 4 partials a round: 45 requests at 8/1 heads on long tiles, 14 splits.
MAX_BALANCED_ROUNDS = 4
# The partials a balanced launch's merge loads a round are sized for this many (_merge_block_s's
# register budget caps it first except on one-row tiles), whatever MAX_UNITS is: the round size
# the balanced launches were measured with.
_BALANCED_ROUND_UNITS = 16


# float32 values a thread the in-kernel merge loads a round (_merge_block_s): 32 took the one-row
# RoPE kernel from 128 registers to 168, a program less an SM.
_MERGE_VALUES = 16


def _rope_wide(cfg: decode_configs.DecodeConfig) -> decode_configs.DecodeConfig:
    return replace(cfg, block_n=cfg.rope_wide_block_n) if cfg.rope_wide_block_n else cfg


def _merge_block_s(plan: _Plan, cfg: decode_configs.DecodeConfig, splits: int, values: int = _MERGE_VALUES) -> int:
    """Splits the in-kernel merge loads a round: their [MERGE_ROWS, D] float32 outputs at
    ``values`` a thread (a balanced launch: its config's ``balance_merge_values``)."""
    return min(next_power_of_2(splits), max(1, values * 32 * cfg.num_warps // (plan.merge_rows * plan.head_dim)))


def _balanced_merge_block_s(plan: _Plan, cfg: decode_configs.DecodeConfig, splits: int) -> int:
    """Splits a balanced launch's merge loads a round for ``splits`` uniform splits."""
    return _merge_block_s(plan, cfg, max(splits, _BALANCED_ROUND_UNITS), cfg.balance_merge_values)


def _given(plan: _Plan, name: str) -> str:
    """The call value an optional tensor's parameter takes: the tensor, or the query standing in
    for an absent one (never read: its constexpr switch is off)."""
    return name if plan.has[name] else "query"


# Query rows a keys-in-M tile holds (its products' N dim: one mma.sync n8 column block).
KEYS_IN_M_ROWS = 8


def _keys_in_m(plan: _Plan, cfg: decode_configs.DecodeConfig) -> bool:
    """Whether the split launch puts the keys in the products' M dim (the kernel's KEYS_IN_M): an
    fp8 cache, at most KEYS_IN_M_ROWS query rows a KV head, no RoPE / ALiBi (``plan.keys_in_m_ok``),
    and the config's ``keys_in_m`` (a field, so ``--ab NAME:decode:keys_in_m=0`` times it off)."""
    return bool(cfg.keys_in_m) and plan.keys_in_m_ok


def _page_offsets(plan: _Plan, cfg: decode_configs.DecodeConfig) -> int:
    """The kernel's PAGE_OFFSETS: 0 (page ids carried, offsets a row in the load layout), 1 (K's and
    V's token offsets where the ids load), 2 (V's are K's: one table, equal strides), from
    ``plan.page_offsets_mode`` and the config's ``page_offsets`` (``--ab NAME:decode:page_offsets=0``)."""
    return plan.page_offsets_mode if cfg.page_offsets else 0


# Runs of a tile at most (PAGE_RUNS): pages of 16 keys on 64-key tiles
PAGE_RUNS_MAX = 4


def page_runs_rule(*, page_offsets: int, whole_tiles: bool, page_size: int, block_n: int, num_warps: int) -> bool:
    """The kernel's PAGE_RUNS from a launch's constexpr facts (``_page_runs`` adds the config switch
    and the int32 bound; ``benchmarks/ptx_snapshot.py`` takes it as is): token offsets where the
    page ids load (``page_offsets`` > 0), tiles cut whole from key 0 (``whole_tiles``: no window, no
    first keys), and a tile that fits (``tile_page_runs``)."""
    return page_offsets > 0 and whole_tiles and tile_page_runs(page_size, block_n, num_warps)


def tile_page_runs(page_size: int, block_n: int, num_warps: int) -> bool:
    """The tile's part of the kernel's PAGE_RUNS (``page_runs_rule``): the tile holds whole pages (at
    most PAGE_RUNS_MAX) or lies in one, and has fewer keys than the program has threads.

    Why the keys: with a key or more a thread, Triton loads the page ids one a thread and moves the
    offsets to the copies' layout through shared memory (PAGE_OFFSETS), already about one multiply
    a thread a tile, and runs cost more (sm_90a, Triton 3.6: fp8 128-key tiles on 4 warps 553 ->
    558-604 SASS instructions a tile, bf16 D 64 on 128-key tiles 430 -> 475). With fewer keys
    Triton computes the ids and offsets in the copies' layout, one for each of a thread's 8 rows
    (bf16 64-key tiles on pages of 64: 533 -> ~340 a tile; pages of 16: 542 -> ~390)."""
    whole = page_size % block_n == 0 or (block_n % page_size == 0 and block_n // page_size <= PAGE_RUNS_MAX)
    return whole and block_n < 32 * num_warps


def _page_runs(plan: _Plan, cfg: decode_configs.DecodeConfig) -> bool:
    """The kernel's PAGE_RUNS: a tile's addresses a run of rows in one page at a time (one page id
    and 64-bit offset a run, a row's int32 offset in its page). Taken with the page offsets
    (``_page_offsets``) on whole tiles where the tile fits (``page_runs_rule``), a row's
    offset in its page fits int32, and the config's ``page_runs`` (``--ab NAME:decode:page_runs=0``)."""
    fits = (plan.page_size - 1) * max(plan.k_strides[1], plan.v_strides[1]) + plan.head_dim < 2**31
    return bool(cfg.page_runs) and fits and page_runs_rule(
        page_offsets=_page_offsets(plan, cfg), whole_tiles=plan.whole_tiles, page_size=plan.page_size,
        block_n=cfg.block_n, num_warps=cfg.num_warps)


def _split_launch(plan: _Plan, cfg: decode_configs.DecodeConfig, splits: int,
                  bal: Balance | None = None) -> fast_launch.Launch:
    """The split kernel's launch, every argument by its parameter's name, the kernel's tuples by
    their members' (``bal``: balanced)."""
    s, has = plan.strides, plan.has
    num_items = plan.items * splits  # (balanced: the uniform split's items; a ragged plan deals its units)
    tma = cfg.tma and plan.tma_ok
    persistent = plan.max_programs is not None and num_items > plan.max_programs
    programs = bal.programs if bal else (plan.max_programs if persistent else num_items)
    keys_in_m = _keys_in_m(plan, cfg)
    return fast_launch.Launch(
        decode_split_kernel, (programs,),
        layout=plan.layout,
        per_call=dict(
            q_ptr="query", k_ptr="k", v_ptr="v", k_sf_ptr=_given(plan, "k_sf"), v_sf_ptr=_given(plan, "v_sf"),
            k_table_ptr=_given(plan, "k_table"), v_table_ptr=_given(plan, "v_table"),
            seq_lens_ptr=_given(plan, "seq_lens"), kv_start_ptr=_given(plan, "kv_start"), mask_ptr=_given(plan, "mask"),
            sinks_ptr=_given(plan, "sinks"),
            logit_scale_ptr=_given(plan, "logit"), out_scale_ptr=_given(plan, "out_scale"), out_ptr="out",
            lse_ptr=_given(plan, "lse"), part_o_ptr="part_o", part_lse_ptr="part_lse", counter_ptr="counters",
            fixed_len="fixed_len", window_left="window_left", logit_factor="logit_factor", out_factor="out_factor",
            soft_cap_value="soft_cap", rope_theta="rope_theta", rope_scale="rope_scale",
        ),
        fixed=dict(
            stride_q_t=s["q"][0], stride_q_h=s["q"][1], stride_o_t=s["out"][0], stride_o_h=s["out"][1],
            stride_k_p=s["k"][0], stride_k_s=s["k"][1], stride_k_h=s["k"][2],
            stride_v_p=s["v"][0], stride_v_s=s["v"][1], stride_v_h=s["v"][2],
            stride_ksf_p=s["k_sf"][0], stride_ksf_s=s["k_sf"][1], stride_ksf_h=s["k_sf"][2],
            stride_vsf_p=s["v_sf"][0], stride_vsf_s=s["v_sf"][1], stride_vsf_h=s["v_sf"][2],
            stride_kt_b=s["k_table"][0], stride_kt_p=s["k_table"][1],
            stride_vt_b=s["v_table"][0], stride_vt_p=s["v_table"][1],
            stride_mask_b=s["mask"][0], stride_mask_r=s["mask"][1], stride_lse_t=s["lse"],
            num_items=num_items, num_rows=plan.rows_total, num_splits=splits, num_pages=plan.num_pages,
            alibi_n=1 << (plan.num_heads.bit_length() - 1),  # largest power of 2 <= Hq (ALiBi slopes)
            batch=plan.batch, unit_target=bal.target if bal else 1,
        ),
        constexprs=dict(
            HEAD_DIM=plan.head_dim, PAGE_SIZE=plan.page_size, NUM_KV_HEADS=plan.num_kv_heads, GROUP=plan.group,
            Q_LEN=plan.q_len, BLOCK_M=KEYS_IN_M_ROWS if plan.keys_in_m_ok else plan.block_m, BLOCK_N=cfg.block_n,
            M_BLOCKS=plan.m_blocks, KEYS_IN_M=keys_in_m,
            KV_FORMAT=plan.kv_code, PAGED=plan.paged, SAME_TABLE=plan.same_table,
            HAS_WINDOW=plan.has_window, HAS_MASK=has["mask"], HAS_SINKS=has["sinks"], LOGIT_PTR=has["logit"],
            OUT_PTR=has["out_scale"], OUT_FP8=plan.out_fp8, STORE_LSE=has["lse"], ROPE=plan.rope, ALIBI=plan.alibi,
            SOFT_CAP=plan.soft_cap, USE_DOT=plan.use_dot, PAGE_AHEAD=cfg.page_ahead,
            PREFETCH=0 if plan.paged or tma else cfg.prefetch, KV_EVICT_FIRST=cfg.evict_first, KV_TMA=tma,
            MERGE=bal is not None or plan.merges(cfg, splits), MERGE_ROWS=plan.merge_rows,
            MERGE_BLOCK_S=bal.merge_block_s if bal else _merge_block_s(plan, cfg, splits),
            PERSISTENT=persistent,
            USE_PDL=plan.gdc, HAS_KV_START=has["kv_start"],
            SPLIT_SPAN=invariant_span(cfg) if plan.invariant else 0,
            BALANCED=bal is not None, BLOCK_B=next_power_of_2(plan.batch) if bal else 1,
            MIN_CHUNK=cfg.balance_min_chunk if bal else 0, DEAL_SLOT=MAX_COUNTERS - 2 if bal else 0,
            LANES=bool(bal and bal.lanes),
            LANE_CAP=_lane_cap(plan, cfg, bal), MERGE_UNITS=_combine_units(plan, cfg, bal),
            PAGE_OFFSETS=_page_offsets(plan, cfg), PAGE_RUNS=_page_runs(plan, cfg),
        ),
        options=dict(
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            **({"maxnreg": cfg.maxnreg} if cfg.maxnreg else {}),
            **({"launch_pdl": True} if plan.gdc and plan.enable_pdl else {}),
        ),
        ptx_hints=tma and cfg.evict_first,
        tuples=SPLIT_TUPLES,
    )


def _lane_cap(plan: _Plan, cfg: decode_configs.DecodeConfig, bal: Balance | None) -> int:
    """A request's lanes at most in a lanes launch (the kernel's LANE_CAP; 0: not one): the
    config's cap, else the combine launch's where it merges the requests of more units, else the
    in-kernel merge's unit cap."""
    if not (bal and bal.lanes):
        return 0
    if cfg.balance_lanes_cap:
        return cfg.balance_lanes_cap
    return decode_configs.COMBINE_LANE_CAP if _combine_units(plan, cfg, bal) else unit_cap(bal.merge_block_s)


def _combine_units(plan: _Plan, cfg: decode_configs.DecodeConfig, bal: Balance | None) -> int:
    """The kernel's MERGE_UNITS: a lanes launch of one program a unit (one KV head, one row block)
    leaves requests of more units to the lanes combine launch (``configs.combine_units``); 0:
    none. Launches of more programs a unit merge in the kernel: there the second launch cost
    more than the merge it took over (lab/notes/decode-ragged-batches.md "Next for sw12: the lanes
    merged by the combine launch")."""
    if not (bal and bal.lanes) or plan.num_kv_heads * plan.m_blocks != 1:
        return 0
    return decode_configs.combine_units(cfg, sm_count=plan.sm_count, bandwidth=plan.bandwidth)


def _lanes_combine_launch(plan: _Plan, cfg: decode_configs.DecodeConfig, splits: int,
                          bal: Balance) -> fast_launch.Launch:
    """The lanes combine kernel's launch (``common.combine.lanes_combine_kernel``)."""
    s, has = plan.strides, plan.has
    return fast_launch.Launch(
        lanes_combine_kernel, (plan.rows_total, plan.num_heads),
        layout=plan.layout,
        per_call=dict(part_o_ptr="part_o", part_lse_ptr="part_lse", seq_lens_ptr=_given(plan, "seq_lens"),
                      sinks_ptr=_given(plan, "sinks"), out_scale_ptr=_given(plan, "out_scale"), out_ptr="out",
                      lse_ptr=_given(plan, "lse"), capacity="fixed_len", out_factor="out_factor"),
        fixed=dict(stride_o_t=s["out"][0], stride_o_h=s["out"][1], stride_lse_t=s["lse"], batch=plan.batch,
                   num_splits=splits, lanes=bal.programs // (plan.num_kv_heads * plan.m_blocks)),
        constexprs=dict(
            NUM_HEADS=plan.num_heads, HEAD_DIM=plan.head_dim, Q_LEN=plan.q_len,
            BLOCK_S=combine_block_s(_lane_cap(plan, cfg, bal), plan.head_dim, False), MIN_CHUNK=cfg.balance_min_chunk,
            BLOCK_N=cfg.block_n, BLOCK_B=next_power_of_2(plan.batch), LANE_CAP=_lane_cap(plan, cfg, bal),
            MERGE_UNITS=_combine_units(plan, cfg, bal), HAS_SINKS=has["sinks"], OUT_PTR=has["out_scale"],
            OUT_FP8=plan.out_fp8, STORE_LSE=has["lse"], USE_PDL=plan.gdc,
        ),
        options=dict(num_warps=4, num_stages=2, **({"launch_pdl": True} if plan.gdc else {})),
    )


def _combine_launch(plan: _Plan, splits: int) -> fast_launch.Launch:
    """The combine kernel's launch, every argument by its parameter's name."""
    s, has = plan.strides, plan.has
    return fast_launch.Launch(
        decode_combine_kernel, (plan.rows_total, plan.num_heads),
        layout=plan.layout,
        per_call=dict(part_o_ptr="part_o", part_lse_ptr="part_lse", sinks_ptr=_given(plan, "sinks"),
                      out_scale_ptr=_given(plan, "out_scale"), out_ptr="out", lse_ptr=_given(plan, "lse"),
                      out_factor="out_factor"),
        fixed=dict(stride_o_t=s["out"][0], stride_o_h=s["out"][1], stride_lse_t=s["lse"], num_rows=plan.rows_total,
                   num_splits=splits),
        constexprs=dict(
            NUM_HEADS=plan.num_heads, HEAD_DIM=plan.head_dim,
            BLOCK_S=combine_block_s(splits, plan.head_dim, plan.invariant), HAS_SINKS=has["sinks"],
            OUT_PTR=has["out_scale"], OUT_FP8=plan.out_fp8, STORE_LSE=has["lse"], USE_PDL=plan.gdc,
        ),
        options=dict(num_warps=4, num_stages=2, **({"launch_pdl": True} if plan.gdc else {})),
    )


def tma_readable(*, paged: bool, compiled: bool, kv_format: str, aligned16: bool, strides: tuple, rope: bool,
                 rope_query: bool, graph_capture: bool) -> bool:
    """Whether a launch may read its cache by TMA (``common.tma_kv_tile``): a contiguous 16-bit
    cache on a GPU with TMA (compiled, not interpreted), whose bases (``aligned16``) and token and
    head ``strides`` (elements) are 16-byte aligned, TMA's rules; under RoPE only the one-row
    kernel (``rope_query``), whose K rows go to the product unrotated.

    Only in CUDA-graph capture: Triton encodes a descriptor on the host at every launch, which
    took an eager RoPE single decode from 48 to 79 us of host time a call on an H100 host, more
    than the ~2.5 us of GPU time it saves there (lab/notes/host-path.md "Host path: TMA descriptors in eager calls"); a replay pays
    no host time, so captured calls take the faster kernel and eager ones the raw-pointer launch.
    """
    return (
        TensorDescriptor is not None and graph_capture and compiled and not paged
        and BY_NAME[kv_format].element_bits == 16 and aligned16 and all(x * 2 % 16 == 0 for x in strides)
        and (rope_query or not rope)
    )


def tma_descriptors(k: torch.Tensor, v: torch.Tensor, block_n: int, rope_query: bool) -> tuple:
    """Tensor descriptors of a contiguous cache ``[L, Hkv, D]`` as ``[Hkv, L, D]`` for
    ``common.tma_kv_tile``: ``[1, block_n, D]`` boxes, K's ``[1, block_n, D / 2]`` under RoPE
    (the one-row kernel reads K's two rotation halves apart)."""
    dim = k.shape[-1]
    descs = []
    for t, width in ((k, dim // 2 if rope_query else dim), (v, dim)):
        sl, sh, _ = t.stride()
        descs.append(TensorDescriptor(t, [t.shape[1], t.shape[0], dim], [sh, sl, 1], [1, block_n, width]))
    return tuple(descs)


_KV_SLOTS = (_ALWAYS.index("k"), _ALWAYS.index("v"))  # K and V's places among a call's tensors


def _descriptors(k: torch.Tensor, v: torch.Tensor, split: fast_launch.Launch, plan: _Plan) -> dict:
    """K and V's descriptors for ``split``, by their places among the call's tensors, for
    ``fast_launch.with_descriptors``."""
    return dict(zip(_KV_SLOTS, tma_descriptors(k, v, split.constexprs["BLOCK_N"], plan.rope_query)))


_PLANS: dict[DecodeFacts, _Plan] = {}


def _plan(facts: DecodeFacts) -> _Plan:
    return cached_plan(_PLANS, facts, _Plan, bool(decode_configs._override))


def launch_decode(
    query: torch.Tensor,  # [rows, Hq, D], [rows, 1, Hq, D] or [Hq, D] (one row)
    k: torch.Tensor,  # [P, page, Hkv, Ds] (paged) or [L, Hkv, Ds]
    v: torch.Tensor,
    out: torch.Tensor,  # the query's shape
    *,
    paged: bool,
    k_sf=None,  # NVFP4 block scales
    v_sf=None,
    k_table=None,  # page tables [B, pages_per_seq] (paged)
    v_table=None,
    seq_lens=None,  # [B] or [B, 1] (paged)
    max_seq_len: int = 0,  # paged: the host bound of seq_lens; not paged: k's length, read here
    q_len: int = 1,
    mask=None,
    sinks=None,
    logit_factor: float = 1.0,
    logit_tensor=None,
    out_factor: float = 1.0,
    out_tensor=None,
    lse=None,  # [rows, Hq] or [Hq]
    window_left: int = -1,
    workspace=None,  # None: the split partials are allocated
    rope: bool = False,  # RoPE (LLaMA) of q and k, with rope_scale, rope_theta
    rope_scale: float = 1.0,
    rope_theta: float = 1e4,
    alibi: bool = False,
    soft_cap: float = 0.0,
    use_tensor_cores: bool | None = None,
    max_programs=None,
    enable_pdl: bool = False,
    kv_start=None,  # [B] first key each request may see (paged)
) -> None:
    """Launch decode attention into ``out``, with the query's GPU current: Triton launches on the
    current device, and a multi-GPU caller's tensors may live on another one."""
    if not query.numel():  # an empty batch (validation rejects zero heads): nothing to write or plan
        return
    device_index = query.get_device()  # -1 on the CPU
    with device_guard(device_index):
        if seq_lens is not None:
            seq_lens = int32_lengths(seq_lens)
        if mask is not None:
            mask = mask.view(torch.int16)
            if mask.stride(-1) != 1:
                mask = mask.contiguous()
        if sinks is not None and sinks.stride(-1) != 1:
            sinks = sinks.contiguous()
        if paged:
            same_table = k_table is v_table or (
                k_table.data_ptr() == v_table.data_ptr() and k_table.stride() == v_table.stride()
            )
            if kv_start is not None:
                kv_start = int32_lengths(kv_start)
            # Paged, the kernel reads fixed_len as the tables' capacity in tokens and clamps every
            # length to it (lab/notes/robustness.md "Device-side clamps").
            fixed_len = min(k_table.shape[-1], v_table.shape[-1]) * k.shape[1]
        else:  # no page tables: one request, every key of k (its fixed_len)
            k_table = v_table = seq_lens = kv_start = None
            fixed_len = max_seq_len = k.shape[0]
            same_table = True
        optional = (k_sf, v_sf, k_table, v_table, seq_lens, mask, sinks, logit_tensor, out_tensor, lse, kv_start)
        # Every host fact the plan reads, each in a local of its DecodeFacts field's name.
        device = query.device
        interpreter = _env.triton_interpret()
        q_shape, q_stride = query.shape, query.stride()
        k_shape, k_stride, v_stride, kv_dtype = k.shape if paged else k.shape[1], k.stride(), v.stride(), k.dtype
        out_shape, out_stride, out_dtype = out.shape, out.stride(), out.dtype
        present = tuple(map(operator.is_not, optional, _NONES))
        ksf_stride = k_sf.stride() if k_sf is not None else None
        vsf_stride = v_sf.stride() if v_sf is not None else None
        kt_stride = k_table.stride() if k_table is not None else None
        vt_stride = v_table.stride() if v_table is not None else None
        mask_stride = mask.stride() if mask is not None else None
        lse_stride = lse.stride() if lse is not None else None
        ws_numel = workspace.numel() if workspace is not None else None
        has_window = window_left >= 0
        has_rope = rope
        if not rope:  # (unread: every call without RoPE launches with the same values)
            rope_scale, rope_theta = 1.0, 1e4
        has_soft_cap = soft_cap > 0
        kv_aligned4 = words_aligned(k, v, k_sf, v_sf)
        fused_merge = _env.fused_merge()
        kv_aligned16 = not paged and k.data_ptr() % 16 == 0 and v.data_ptr() % 16 == 0
        graph_capture = has_rope and not paged and capturing(device)  # (TMA: tma_readable)
        batch_invariant = _env.batch_invariant()
        facts = DecodeFacts._make((
            device, interpreter, q_shape, q_stride, k_shape, k_stride, v_stride, kv_dtype, out_shape, out_stride,
            out_dtype, present, ksf_stride, vsf_stride, kt_stride, vt_stride, same_table, mask_stride, lse_stride,
            ws_numel, paged, q_len, has_window, has_rope, alibi, has_soft_cap, use_tensor_cores, max_programs,
            enable_pdl, kv_aligned4, fused_merge, kv_aligned16, graph_capture, batch_invariant,
        ))
        plan = _plan(facts)
        span = min(max_seq_len, window_left + q_len) if has_window else max_seq_len
        split, combine, numel_o, numel_lse, merged = plan.launches(span)
        part_o, part_lse = split_partials(combine is not None or merged, workspace, numel_o, numel_lse, out)
        counters = launch_counters(workspace, device, plan.items) if merged else out
        call = fast_launch.call_args(  # in plan.layout's order: _ALWAYS, the given _OPTIONAL, _INTS, _FLOATS
            (query, k, v, out, part_o, part_lse, counters, *compress(optional, present)),
            (fixed_len, window_left), (logit_factor, out_factor, soft_cap, rope_theta, rope_scale), device_index,
        )
        if split.constexprs["KV_TMA"]:
            call = fast_launch.with_descriptors(call, _descriptors(k, v, split, plan))
        elif plan.tma_twin and split not in plan.warmed:
            # An eager call whose capture would read by TMA (another kernel): compile and load that
            # kernel now, so that capturing the same call after eager warm-up loads no module.
            plan.warmed.add(split)
            twin = _plan(facts._replace(graph_capture=True)).launches(span)[0]  # the same facts, captured
            if twin.constexprs["KV_TMA"]:
                twin.warmup(fast_launch.with_descriptors(call, _descriptors(k, v, twin, plan)))
        split(call)
        if combine is not None:
            combine(call)
