"""kvattn inside transformers models, token for token against transformers' own attention.

Small random-initialised models built from transformers configs (no download): a Llama-style GQA
model, an MQA one with head_dim 128, a Qwen2 model whose layers alternate sliding-window and full
attention, and a gpt-oss model (attention sinks, sliding-window layers, MoE). Greedy generation of a
batch of prompts of different lengths through transformers' continuous batching
(``generate_batch``) with ``attn_implementation="kvattn"`` must give the tokens transformers' own
paged implementation gives, and the log-probability of each generated token must agree (float32 on
CPU through kvattn's reference backend: tight; bfloat16 on a GPU through the kernels: bf16
tolerance). Prompts longer than the batch-token budget are prefilled in chunks, so the chunked
prefill path (queries over cached and new tokens) runs too. ``model.generate`` (contiguous cache)
is checked the same way against SDPA.

The whole file is skipped when transformers is not importable.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers")
if tuple(int(x) for x in transformers.__version__.split(".")[:2]) < (5, 17):
    pytest.skip(f"the integration targets transformers >= 5.17, found {transformers.__version__}",
                allow_module_level=True)

from transformers import GenerationConfig  # noqa: E402

from kvattn.integrations import transformers as kvattn_tf  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPE = torch.bfloat16 if ON_GPU else torch.float32
# Per-step log-probability agreement: float32 on both sides on CPU; on a GPU both sides round
# activations to bfloat16 every layer (two different kernels), so the gap is bf16 noise.
LOGPROB_TOL = 0.25 if ON_GPU else 2e-4
NEW_TOKENS = 10 if ON_GPU else 6


def _cb_fields():
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    return ContinuousBatchingConfig, {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}


def cb_config(page_size=16, max_batch_tokens=48, num_blocks=96, **extra):
    """A small ContinuousBatchingConfig under either name of the page size (``block_size`` before 5.18)."""
    cls, fields = _cb_fields()
    kw = dict(num_blocks=num_blocks, max_batch_tokens=max_batch_tokens, max_requests_per_batch=8,
              return_logprobs=True, **extra)
    kw["page_size" if "page_size" in fields else "block_size"] = page_size
    if "auto_switch_to_flash" in fields:
        kw["auto_switch_to_flash"] = False
    return cls(**{k: v for k, v in kw.items() if k in fields})


def make_model(kind: str, dtype=DTYPE):
    torch.manual_seed({"llama": 0, "mqa": 1, "qwen2": 2, "gpt_oss": 3, "llama_d256": 4}[kind])
    common = dict(vocab_size=128, num_hidden_layers=2, max_position_embeddings=256, initializer_range=0.25,
                  tie_word_embeddings=False)
    if kind == "llama":
        cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=64, **common)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "mqa":
        cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=192, num_attention_heads=2,
                                       num_key_value_heads=1, head_dim=128, **common)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "llama_d256":
        cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=256, **common)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "qwen2":  # head_dim = hidden_size / heads = 64
        cfg = transformers.Qwen2Config(hidden_size=256, intermediate_size=256, num_attention_heads=4,
                                       num_key_value_heads=2, use_sliding_window=True, sliding_window=12,
                                       max_window_layers=0, layer_types=["sliding_attention", "full_attention"],
                                       **common)
        model = transformers.Qwen2ForCausalLM(cfg)
    elif kind == "gpt_oss":
        cfg = transformers.GptOssConfig(hidden_size=128, intermediate_size=128, num_attention_heads=4,
                                        num_key_value_heads=2, head_dim=64, num_local_experts=4,
                                        num_experts_per_tok=2, sliding_window=12,
                                        layer_types=["sliding_attention", "full_attention"], **common)
        model = transformers.GptOssForCausalLM(cfg)
        with torch.no_grad():  # random-init sinks of a useful size (the default init leaves them tiny)
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0.0, 1.0)
    else:
        raise ValueError(kind)
    return model.to(DEVICE, dtype).eval()


def prompts(count=4, lengths=(5, 37, 20, 1), vocab=128, seed=0, model=None, new_tokens=NEW_TOKENS):
    """Random prompts of the given lengths. With ``model`` (GPU tier), each prompt is redrawn until
    the greedy continuation of a float32 copy of the model has, at every step, a gap of at least
    MIN_MARGIN between its two best log-probabilities: a random model has near-ties that bfloat16
    rounding (any two kernels) may break either way, and there "the same tokens" is not a property
    of the attention. The log-probability check still covers every step."""
    g = torch.Generator().manual_seed(seed)
    out = []
    ref = None
    if model is not None:
        ref = copy.deepcopy(model).float()
        ref.set_attn_implementation("eager")
    for n in lengths[:count]:
        for _ in range(64):
            p = torch.randint(0, vocab, (n,), generator=g).tolist()
            if ref is None or _min_margin(ref, p, new_tokens) >= MIN_MARGIN:
                break
        out.append(p)
    return out


MIN_MARGIN = 0.3


@torch.no_grad()
def _min_margin(model, prompt, new_tokens):
    ids = torch.tensor([prompt], device=model.device)
    gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0,
                           output_scores=True, return_dict_in_generate=True)
    scores = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen).scores
    return min(float(top[0] - top[1]) for top in (s[0].float().log_softmax(-1).topk(2).values for s in scores))


def peer_implementation(kind: str) -> str:
    """transformers' own paged implementation to compare with (eager where SDPA lacks sinks)."""
    eager = kind == "gpt_oss"
    if kvattn_tf.paged_name() == kvattn_tf.PAGED_NAME:  # releases with paged|<name> implementations
        return "paged|eager" if eager else "paged|sdpa"
    return "paged|eager" if eager else "sdpa"


def generate(model, impl, batch, config=None, new_tokens=NEW_TOKENS):
    model.set_attn_implementation(impl)
    gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    out = model.generate_batch(batch, generation_config=gen, continuous_batching_config=config or cb_config())
    ordered = sorted(out.values(), key=lambda o: int(o.request_id.split("_")[-1]))
    return [list(o.generated_tokens) for o in ordered], [list(o.logprobs or []) for o in ordered]


@pytest.fixture(scope="module", autouse=True)
def registered():
    return kvattn_tf.register()


@torch.no_grad()
def float32_logprobs(model, batch, tokens):
    """Log-probabilities of the generated tokens under a float32 copy of the model (eager, whole
    sequences, no cache): the anchor both bfloat16 runs are measured against on a GPU."""
    ref = copy.deepcopy(model).float()
    ref.set_attn_implementation("eager")
    out = []
    for p, t in zip(batch, tokens):
        ids = torch.tensor([p + t], device=ref.device)
        lp = ref(ids).logits[0].float().log_softmax(-1)
        out.append([float(lp[len(p) - 1 + i, tok]) for i, tok in enumerate(t)])
    return out


def max_gap(a, b):
    return max(max(abs(x - y) for x, y in zip(u, v)) for u, v in zip(a, b))


def assert_same_generation(ref, got, anchor=None):
    """Same tokens, and per-step log-probabilities that agree: directly (float32 on CPU), or with
    an ``anchor`` (bfloat16/float16 on a GPU) no further from the float32 model's than twice
    transformers' own distance, or LOGPROB_TOL."""
    ref_tokens, ref_lp = ref
    tokens, lp = got
    assert tokens == ref_tokens
    for a, b in zip(ref_lp, lp):
        assert len(a) == len(b) > 0
    if anchor is None:
        assert max_gap(ref_lp, lp) <= LOGPROB_TOL
    else:
        assert max_gap(lp, anchor) <= max(LOGPROB_TOL, 2 * max_gap(ref_lp, anchor)), (
            max_gap(lp, anchor), max_gap(ref_lp, anchor))


KINDS = ["llama", "mqa", "llama_d256", "qwen2", "gpt_oss"]
GPU_DTYPES = [torch.bfloat16, torch.float16] if ON_GPU else [DTYPE]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", GPU_DTYPES, ids=str)
def test_generate_batch_matches_transformers(kind, dtype):
    if dtype == torch.float16 and kind not in ("llama", "gpt_oss"):
        pytest.skip("float16: one GQA model and the sinks model")
    model = make_model(kind, dtype)
    batch = prompts(model=model if ON_GPU else None)
    kvattn_tf.reset_stats()
    got = generate(model, kvattn_tf.NAME, batch)
    stats = kvattn_tf.stats()
    ref = generate(model, peer_implementation(kind), batch)
    anchor = float32_logprobs(model, batch, ref[0]) if ON_GPU else None
    assert_same_generation(ref, got, anchor)
    # kvattn served every attention call: full-attention layers read the paged cache in place
    # (prefill and decode kernels), sliding-window layers the window transformers gathers.
    assert stats["pages"] > 0 and stats["decode"] > 0 and stats["prefill"] > 0
    assert stats["dense"] == 0 and stats["fallback"] == 0
    if kind in ("qwen2", "gpt_oss"):
        assert stats["gathered"] > 0


def test_chunked_prefill_and_page_boundaries():
    """A batch-token budget smaller than the prompts: prefill runs in chunks over cached tokens;
    page size 4 puts many page boundaries inside each request."""
    model = make_model("llama")
    batch = prompts(lengths=(29, 3, 17), model=model if ON_GPU else None)
    config = cb_config(page_size=4, max_batch_tokens=12, num_blocks=256)
    got = generate(model, kvattn_tf.NAME, batch, config)
    ref = generate(model, peer_implementation("llama"), batch, cb_config(page_size=4, max_batch_tokens=12,
                                                                          num_blocks=256))
    assert_same_generation(ref, got, float32_logprobs(model, batch, ref[0]) if ON_GPU else None)


def test_generate_contiguous_cache_matches_sdpa():
    """model.generate (DynamicCache): kvattn reads each layer's [B, Hkv, L, D] K/V in place."""
    model = make_model("qwen2")
    ids = torch.tensor(prompts(count=2, lengths=(9, 9), seed=3, model=model if ON_GPU else None), device=DEVICE)
    gen = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=-1, pad_token_id=0,
                           output_scores=True, return_dict_in_generate=True)
    model.set_attn_implementation("sdpa")
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen)
    model.set_attn_implementation(kvattn_tf.NAME)
    kvattn_tf.reset_stats()
    got = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen)
    stats = kvattn_tf.stats()
    assert torch.equal(got.sequences, ref.sequences)
    for a, b in zip(ref.scores, got.scores):
        lp_a, lp_b = a.float().log_softmax(-1), b.float().log_softmax(-1)
        assert float((lp_a - lp_b).abs().max()) <= 2 * LOGPROB_TOL
    assert stats["dense"] > 0 and stats["fallback"] == 0


def test_generate_padded_batch_falls_back_to_sdpa():
    """A left-padded batch needs a mask kvattn does not take: SDPA runs it, with one warning."""
    model = make_model("llama")
    ids = torch.tensor(prompts(count=2, lengths=(6, 6), seed=4), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    gen = GenerationConfig(max_new_tokens=3, do_sample=False, eos_token_id=-1, pad_token_id=0)
    model.set_attn_implementation("sdpa")
    ref = model.generate(ids, attention_mask=mask, generation_config=gen)
    model.set_attn_implementation(kvattn_tf.NAME)
    kvattn_tf.reset_stats()
    got = model.generate(ids, attention_mask=mask, generation_config=gen)
    assert torch.equal(got, ref)
    assert kvattn_tf.stats()["fallback"] > 0


def test_register_is_idempotent_and_leaves_other_implementations():
    assert kvattn_tf.register() == kvattn_tf.register() == kvattn_tf.NAME
    from transformers import AttentionInterface

    assert AttentionInterface._global_mapping[kvattn_tf.NAME] is kvattn_tf.kvattn_attention_forward
    assert AttentionInterface._global_mapping[kvattn_tf.PAGED_NAME] is kvattn_tf.kvattn_attention_forward
    assert AttentionInterface._global_mapping["sdpa"] is not kvattn_tf.kvattn_attention_forward


def test_tables_from_indices():
    # Two requests, page size 4: request 0 has 6 tokens on pages 7, 2; request 1 has 3 on page 5.
    index = torch.tensor([28, 29, 30, 31, 8, 9, 20, 21, 22])
    cu_k = torch.tensor([0, 6, 9], dtype=torch.int32)
    t = kvattn_tf.tables_from_indices(index, cu_k, max_k=6, page_size=4)
    assert t.tolist() == [[7, 2], [5, 0]]


def test_soft_cap_is_refused():
    class Layer(torch.nn.Module):
        layer_idx, scaling = 0, 0.125

    q = torch.randn(1, 2, 3, 64)
    with pytest.raises(NotImplementedError, match="soft-capping"):
        kvattn_tf.kvattn_attention_forward(Layer(), q, q, q, None, softcap=30.0)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_generate_batch_with_cuda_graphs(kind):
    """Continuous batching with CUDA graphs (padded steps, captured and replayed kvattn calls)
    gives the tokens of the run without graphs."""
    model = make_model(kind)
    batch = prompts(model=model)
    plain = generate(model, kvattn_tf.NAME, batch, cb_config(use_cuda_graph=False))
    graphs = generate(model, kvattn_tf.NAME, batch, cb_config(use_cuda_graph=True))
    assert_same_generation(plain, graphs)
