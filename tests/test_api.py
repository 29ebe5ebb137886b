"""The public API: the five seed signatures exactly, re-exports, the xqa alias, docstring examples."""

import doctest
import importlib
import inspect

import pytest

import kvattn

_ = inspect.Parameter.empty
# (name, default) in order, written out from the seed documents (shared/seeds/*.txt).
SEEDS = {
    "decode.xqa_batch_decode_with_kv_cache": [
        ("query", _), ("kv_cache", _), ("workspace_buffer", _), ("block_tables", _), ("seq_lens", _),
        ("max_seq_len", _), ("bmm1_scale", 1.0), ("bmm2_scale", 1.0), ("window_left", -1), ("out", None),
        ("sinks", None), ("kv_layout", "NHD"), ("enable_pdl", None), ("q_len_per_req", 1), ("o_scale", 1.0),
        ("mask", None), ("kv_cache_sf", None),
        # FlashInfer 0.7.2.post1
        ("q_cu_seq_lens", None),
    ],
    # The seed's position 14 is sm_count; FlashInfer 0.7.2.post1's (below) is kv_layout, and an int
    # there is taken as the seed's sm_count (test_xqa_release.py).
    "xqa.xqa": [
        ("q", _), ("k_cache", _), ("v_cache", _), ("page_table", _), ("seq_lens", _), ("output", _),
        ("workspace_buffer", _), ("semaphores", _), ("num_kv_heads", _), ("page_size", _), ("sinks", None),
        ("q_scale", 1.0), ("kv_scale", None), ("sliding_win_size", 0),
        # FlashInfer 0.7.2.post1
        ("kv_layout", "NHD"), ("sm_count", None), ("enable_pdl", None), ("rcp_out_scale", 1.0), ("q_seq_len", 1),
        ("mask", None),
    ],
    "decode.single_decode_with_kv_cache": [
        ("q", _), ("k", _), ("v", _), ("kv_layout", "NHD"), ("pos_encoding_mode", "NONE"),
        ("use_tensor_cores", False), ("q_scale", None), ("k_scale", None), ("v_scale", None), ("window_left", -1),
        ("logits_soft_cap", None), ("sm_scale", None), ("rope_scale", None), ("rope_theta", None),
        ("return_lse", False),
    ],
    "mla.xqa_batch_decode_with_kv_cache_mla": [
        ("query", _), ("kv_cache", _), ("workspace_buffer", _), ("qk_nope_head_dim", _), ("kv_lora_rank", _),
        ("qk_rope_head_dim", _), ("block_tables", _), ("seq_lens", _), ("max_seq_len", _), ("out", None),
        ("bmm1_scale", 1.0), ("bmm2_scale", 1.0), ("sinks", None), ("enable_pdl", None),
    ],
    "prefill.trtllm_batch_context_with_kv_cache": [
        ("query", _), ("kv_cache", _), ("workspace_buffer", _), ("block_tables", _), ("seq_lens", _),
        ("max_q_len", _), ("max_kv_len", _), ("bmm1_scale", _), ("bmm2_scale", _), ("batch_size", _),
        ("cum_seq_lens_q", _), ("cum_seq_lens_kv", _), ("window_left", -1), ("out", None), ("out_dtype", None),
        ("o_sf_scale", None), ("o_sf_vec_size", None), ("kv_layout", "HND"), ("enable_pdl", None),
        ("sinks", None),
        # position 20: the seed's kv_block_scales (still a keyword), FlashInfer 0.7.2.post1's kv_cache_sf
        ("kv_cache_sf", None), ("skip_softmax_threshold_scale_factor", None),
        ("uses_shared_paged_kv_idx", True),
        # FlashInfer 0.7.2.post1
        ("causal", True), ("lse", None), ("return_lse", False), ("multi_ctas_kv_counter_buffer", None),
        ("use_fp16_softmax", None), ("uses_spcompress", None), ("backend", "trtllm-gen"),
    ],
}
# FlashInfer 0.7.2.post1's keyword-only arguments (besides kvattn's own keyword-only extras).
RELEASE_KEYWORD_ONLY = {
    "xqa.xqa": ("q_cu_seq_lens", "k_sf_cache", "v_sf_cache"),
    "prefill.trtllm_batch_context_with_kv_cache": ("kv_block_scales",),
}


def _function(path):
    module, name = path.split(".")
    return getattr(importlib.import_module(f"kvattn.{module}"), name)


@pytest.mark.parametrize("path", list(SEEDS))
def test_signature_matches_seed(path):
    params = list(inspect.signature(_function(path)).parameters.values())
    seed = SEEDS[path]
    head = params[: len(seed)]
    assert [p.name for p in head] == [n for n, _ in seed]
    for p, (name, default) in zip(head, seed):
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, name
        assert p.default is default or (p.default == default and type(p.default) is type(default)), (
            f"{name}: default {p.default!r}, seed {default!r}")
    # Extra arguments (SPEC: newer FlashInfer keywords) must be keyword-only with defaults.
    for p in params[len(seed):]:
        assert p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is not inspect.Parameter.empty, p.name
    names = [p.name for p in params]
    assert all(n in names for n in RELEASE_KEYWORD_ONLY.get(path, ()))


@pytest.mark.parametrize("name", ["xqa_batch_decode_with_kv_cache", "single_decode_with_kv_cache",
                                  "xqa_batch_decode_with_kv_cache_mla", "trtllm_batch_context_with_kv_cache"])
def test_reexported_from_package(name):
    assert getattr(kvattn, name) is next(_function(p) for p in SEEDS if p.endswith("." + name))
    assert name in kvattn.__all__


def test_modules_and_fp4tensor_exported():
    for mod in ("decode", "xqa", "mla", "prefill", "formats"):
        assert mod in kvattn.__all__ and inspect.ismodule(getattr(kvattn, mod))
    assert kvattn.FP4Tensor is kvattn.formats.FP4Tensor


def test_xqa_module_is_callable_alias():
    assert callable(kvattn.xqa)
    assert kvattn.xqa.xqa is _function("xqa.xqa")
    with pytest.raises(TypeError, match="^q:"):
        kvattn.xqa(None, None, None, None, None, None, None, None, 1, 16)


@pytest.mark.parametrize("module", ["kvattn", "kvattn.decode", "kvattn.xqa", "kvattn.mla", "kvattn.prefill",
                                    "kvattn.formats", "kvattn.testing", "kvattn.dense", "kvattn.merge",
                                    "kvattn.distributed", "kvattn.distributed.sharding"])
def test_docstring_examples(module):
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{module} has no examples"
    assert result.failed == 0
