"""kvattn's torch operators (``torch.ops.kvattn.*``): one per Triton kernel family entry point.

Registering the launchers as ``torch.library.custom_op`` s, with fake implementations and exact
``mutates_args``, lets ``torch.compile`` trace through the public functions (the kernels stay
opaque calls). Arguments are flat tensors and numbers: the normalised descriptions of
:mod:`kvattn._inputs` are unpacked by the ``kvattn.ops`` modules.

Eager calls skip the dispatcher (:func:`entry`): a mutating custom op costs tens of microseconds of
Python per call (argument defaults, autograd and in-place bookkeeping), more than a whole decode
kernel at small batch. The op and the direct call run the same launcher.
"""

from __future__ import annotations

from typing import Optional

import torch

from .ops import decode_launch, mla_launch, prefill_launch


def entry(op, impl):
    """``op`` while ``torch.compile`` traces (it needs the registered op), else the plain ``impl``."""
    return op if torch.compiler.is_compiling() else impl


def batch_decode_impl(
    query: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_table: torch.Tensor,
    v_table: torch.Tensor,
    k_sf: Optional[torch.Tensor],
    v_sf: Optional[torch.Tensor],
    seq_lens: torch.Tensor,
    mask: Optional[torch.Tensor],
    sinks: Optional[torch.Tensor],
    logit_factor: float,
    logit_tensor: Optional[torch.Tensor],
    out_factor: float,
    out_tensor: Optional[torch.Tensor],
    out: torch.Tensor,
    workspace: torch.Tensor,
    q_len: int,
    max_seq_len: int,
    window_left: int,
    max_programs: Optional[int],
    enable_pdl: bool,
    lse: Optional[torch.Tensor] = None,
    kv_start: Optional[torch.Tensor] = None,
) -> None:
    """Paged decode into ``out`` (and the base-2 LSE into ``lse``); split-KV partials live in
    ``workspace`` (see ops.decode)."""
    decode_launch.launch_decode(
        query, k, v, out, paged=True, k_sf=k_sf, v_sf=v_sf, k_table=k_table, v_table=v_table,
        seq_lens=seq_lens, max_seq_len=max_seq_len, q_len=q_len, mask=mask, sinks=sinks,
        logit_factor=logit_factor, logit_tensor=logit_tensor, out_factor=out_factor, out_tensor=out_tensor,
        window_left=window_left, workspace=workspace, max_programs=max_programs, enable_pdl=enable_pdl, lse=lse,
        kv_start=kv_start,
    )


batch_decode = torch.library.custom_op("kvattn::batch_decode", batch_decode_impl,
                                       mutates_args=("out", "workspace", "lse"))


@batch_decode.register_fake
def _batch_decode_fake(query, k, v, k_table, v_table, k_sf, v_sf, seq_lens, mask, sinks, logit_factor,
                       logit_tensor, out_factor, out_tensor, out, workspace, q_len, max_seq_len, window_left,
                       max_programs, enable_pdl, lse=None, kv_start=None) -> None:
    return None


def single_decode_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    logit_factor: float,
    logit_tensor: Optional[torch.Tensor],
    out_factor: float,
    out_tensor: Optional[torch.Tensor],
    pos_encoding_mode: str,
    window_left: int,
    soft_cap: float,
    rope_scale: float,
    rope_theta: float,
    use_tensor_cores: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One query token over contiguous ``k, v [L, Hkv, D]``: ``(out [Hq, D], lse float32 [Hq])``."""
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(q.shape[0], dtype=torch.float32, device=q.device)
    single_decode_into_impl(q, k, v, logit_factor, logit_tensor, out_factor, out_tensor, pos_encoding_mode,
                            window_left, soft_cap, rope_scale, rope_theta, use_tensor_cores, out, lse)
    return out, lse


single_decode = torch.library.custom_op("kvattn::single_decode", single_decode_impl, mutates_args=())


@single_decode.register_fake
def _single_decode_fake(q, k, v, logit_factor, logit_tensor, out_factor, out_tensor, pos_encoding_mode,
                        window_left, soft_cap, rope_scale, rope_theta, use_tensor_cores):
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(q.shape[0], dtype=torch.float32)


def single_decode_into_impl(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    logit_factor: float,
    logit_tensor: Optional[torch.Tensor],
    out_factor: float,
    out_tensor: Optional[torch.Tensor],
    pos_encoding_mode: str,
    window_left: int,
    soft_cap: float,
    rope_scale: float,
    rope_theta: float,
    use_tensor_cores: bool,
    out: torch.Tensor,
    lse: torch.Tensor,
) -> None:
    """:func:`single_decode_impl` into given ``out [Hq, D]`` (q's dtype or float32) and ``lse [Hq]``."""
    length = k.shape[0]
    decode_launch.launch_decode(  # [Hq, D] tensors are one row of the launcher's [rows, Hq, D]
        q, k, v, out, paged=False, fixed_len=length, max_seq_len=length,
        logit_factor=logit_factor, logit_tensor=logit_tensor, out_factor=out_factor, out_tensor=out_tensor,
        lse=lse, window_left=window_left,
        rope=(rope_scale, rope_theta) if pos_encoding_mode == "ROPE_LLAMA" else None,
        alibi=pos_encoding_mode == "ALIBI", soft_cap=soft_cap, use_tensor_cores=use_tensor_cores,
    )


single_decode_into = torch.library.custom_op("kvattn::single_decode_into", single_decode_into_impl,
                                             mutates_args=("out", "lse"))


@single_decode_into.register_fake
def _single_decode_into_fake(q, k, v, logit_factor, logit_tensor, out_factor, out_tensor, pos_encoding_mode,
                             window_left, soft_cap, rope_scale, rope_theta, use_tensor_cores, out, lse) -> None:
    return None


# ---------------------------------------------------------------------------------------------
# context attention (prefill)
# ---------------------------------------------------------------------------------------------
def context_impl(
    query: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_table: torch.Tensor,
    v_table: torch.Tensor,
    k_sf: Optional[torch.Tensor],
    v_sf: Optional[torch.Tensor],
    seq_lens: torch.Tensor,
    cum_seq_lens_q: torch.Tensor,
    sinks: Optional[torch.Tensor],
    logit_factor: float,
    logit_tensor: Optional[torch.Tensor],
    out_factor: float,
    out_tensor: Optional[torch.Tensor],
    out: torch.Tensor,
    out_sf: Optional[torch.Tensor],
    workspace: torch.Tensor,
    max_q_len: int,
    max_kv_len: int,
    window_left: int,
    o_sf_scale: float,
    sf_start: int,
    skip_factor: float,
    lse: Optional[torch.Tensor] = None,
) -> None:
    """Paged causal prefill into ``out`` (NVFP4: codes in ``out``, swizzled scales in ``out_sf``),
    and the rows' base-2 LSE into ``lse``; see ops.prefill. The workspace is not used."""
    prefill_launch.launch_context(
        query, k, v, k_table, v_table, k_sf, v_sf, seq_lens, cum_seq_lens_q, sinks, out, out_sf,
        max_q_len=max_q_len, logit_factor=logit_factor, logit_tensor=logit_tensor, out_factor=out_factor,
        out_tensor=out_tensor, window_left=window_left, o_sf_scale=o_sf_scale, sf_start=sf_start,
        skip_factor=skip_factor, lse=lse,
    )


context = torch.library.custom_op("kvattn::context", context_impl, mutates_args=("out", "out_sf", "lse"))


@context.register_fake
def _context_fake(query, k, v, k_table, v_table, k_sf, v_sf, seq_lens, cum_seq_lens_q, sinks, logit_factor,
                  logit_tensor, out_factor, out_tensor, out, out_sf, workspace, max_q_len, max_kv_len, window_left,
                  o_sf_scale, sf_start, skip_factor, lse=None) -> None:
    return None


# ---------------------------------------------------------------------------------------------
# MLA decode
# ---------------------------------------------------------------------------------------------
def mla_decode_impl(
    query: torch.Tensor,
    kv: torch.Tensor,
    table: torch.Tensor,
    seq_lens: torch.Tensor,
    logit_factor: float,
    logit_tensor: Optional[torch.Tensor],
    out_factor: float,
    out_tensor: Optional[torch.Tensor],
    out: torch.Tensor,
    workspace: torch.Tensor,
    max_seq_len: int,
    lse: Optional[torch.Tensor] = None,
) -> None:
    """MLA decode into ``out [B, Hq, 512]`` (and the base-2 LSE into ``lse [B, Hq]``) over latent
    rows ``kv [P, page, 1, 576]`` (see ops.mla)."""
    mla_launch.launch_mla(
        query, kv, table, seq_lens, out, max_seq_len=max_seq_len, logit_factor=logit_factor,
        logit_tensor=logit_tensor, out_factor=out_factor, out_tensor=out_tensor, workspace=workspace, lse=lse,
    )


mla_decode = torch.library.custom_op("kvattn::mla_decode", mla_decode_impl,
                                     mutates_args=("out", "workspace", "lse"))


@mla_decode.register_fake
def _mla_decode_fake(query, kv, table, seq_lens, logit_factor, logit_tensor, out_factor, out_tensor, out,
                     workspace, max_seq_len, lse=None) -> None:
    return None
