"""Generate text with a transformers model on kvattn's paged attention, and compare tokens/s.

    python examples/transformers_generate.py                 # random-initialised Llama-style model
    python examples/transformers_generate.py --model /path/to/local/model --prompt "Hello"

Without ``--model`` a small Llama-style model is built from a config with random weights (nothing
is downloaded; the "text" is then token ids). With ``--model`` a local checkpoint directory is
loaded (``local_files_only``), with its tokenizer when it has one.

The same batch of requests runs through transformers' continuous batching (``generate_batch``)
twice: with ``attn_implementation="kvattn"`` and with transformers' default paged implementation
(flash attention when installed, else paged SDPA), and the script prints the tokens/s of each
(generated tokens over the wall time of ``generate_batch``, after a warm-up batch).

Then it checks that the two compute the same attention, in two ways:

* teacher forcing: each request's prompt and kvattn's tokens go through the model once with each
  implementation (the same token history for both), and the script prints the largest relative
  difference of the logits per step (``max |a - b| / max |b|`` over the vocabulary) against the
  dtype's rounding tolerance, and at how many steps the two pick the same next token;
* greedy tokens: whether the two ``generate_batch`` runs produced the same tokens. Run in float16
  (the default) or float32 (CPU) this is meaningful; in bfloat16 a random model's near-ties break
  either way under its coarser rounding, so a mismatch there says little (the logits say more).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # an uninstalled checkout

import transformers  # noqa: E402
from transformers import GenerationConfig  # noqa: E402

from kvattn.integrations import transformers as kvattn_tf  # noqa: E402


# The relative logit difference two correct implementations stay within, per dtype: a few of its
# rounding steps, through every layer of the model.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def quiet_transformers() -> None:
    """transformers' continuous batching logs a warning each time a persistent manager is kept
    (advice for reusing it on another workload): not this example's concern."""
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)


def load(args, device, dtype):
    if args.model:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype, local_files_only=True)
        try:
            tok = transformers.AutoTokenizer.from_pretrained(args.model, local_files_only=True)
        except (OSError, ValueError):
            tok = None
        return model.to(device).eval(), tok
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=4096, num_hidden_layers=8,
                                   num_attention_heads=16, num_key_value_heads=4, head_dim=64,
                                   max_position_embeddings=4096)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(cfg)
    return model.to(dtype).eval(), None


def cb_config(page_size: int):
    import dataclasses

    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    kw = {"page_size" if "page_size" in fields else "block_size": page_size}
    if "auto_switch_to_flash" in fields:
        kw["auto_switch_to_flash"] = False
    return ContinuousBatchingConfig(**kw)


def run(model, impl, prompts, warm, new_tokens, page_size):
    model.set_attn_implementation(impl)
    gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    config = cb_config(page_size)
    model.generate_batch(warm, generation_config=gen, continuous_batching_config=config, persistent_manager=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=config,
                               persistent_manager=True)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    model.destroy_cached_continuous_batching_manager()
    ordered = sorted(out.values(), key=lambda o: int(o.request_id.split("_")[-1]))
    tokens = [list(o.generated_tokens) for o in ordered]
    return tokens, sum(map(len, tokens)) / seconds


@torch.no_grad()
def teacher_forced_logits(model, impl, prompts, generated):
    """float32 logits ``[new tokens, vocab]`` a request: the model run once over its prompt and
    ``generated`` tokens with ``impl``, the rows that predict each generated token."""
    model.set_attn_implementation(impl)
    out = []
    for prompt, new in zip(prompts, generated):
        ids = torch.tensor([prompt + new], device=model.device)
        out.append(model(ids).logits[0, len(prompt) - 1: len(prompt) + len(new) - 1].float())
    return out


def compare_logits(ours, theirs):
    """Max relative difference per step (over all requests' steps) and the steps of equal argmax."""
    rel = torch.cat([(a - b).abs().amax(-1) / b.abs().amax(-1) for a, b in zip(ours, theirs)])
    same = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(ours, theirs))
    return rel, same


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="local checkpoint directory (default: random Llama-style model)")
    p.add_argument("--prompt", action="append", default=None, help="prompt text (repeatable; needs a tokenizer)")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=128, help="random prompt length without a tokenizer")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--page-size", type=int, default=256)
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"],
                   help="model dtype (float32: CPU only, where kvattn runs its reference)")
    args = p.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, args.dtype)
    if dtype == torch.float32 and device == "cuda":
        p.error("--dtype float32: kvattn's GPU kernels take float16 or bfloat16 models")
    quiet_transformers()
    name = kvattn_tf.register()
    model, tok = load(args, device, dtype)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    if args.prompt and tok is not None:
        texts = (args.prompt * args.requests)[: args.requests]
        prompts = [tok(t)["input_ids"] for t in texts]
    else:
        prompts = [torch.randint(0, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.requests)]
    warm = [p[:32] for p in prompts[:4]]

    default = model.config._attn_implementation  # what the model was loaded with; generate_batch picks its paged form
    results = {}
    for label, impl in (("kvattn", name), (f"transformers ({default})", default)):
        tokens, tps = run(model, impl, prompts, warm, args.max_new_tokens, args.page_size)
        results[label] = tokens
        print(f"{label:<28} {tps:10.1f} generated tokens/s  ({args.requests} requests, {args.max_new_tokens} new tokens each)")

    first = results["kvattn"][0]
    text = tok.decode(first) if tok is not None else str(first[:32])
    print(f"\nrequest 0 through kvattn: {text}")

    label = next(k for k in results if k != "kvattn")
    ours = teacher_forced_logits(model, name, prompts, results["kvattn"])
    theirs = teacher_forced_logits(model, default, prompts, results["kvattn"])
    rel, same_next = compare_logits(ours, theirs)
    tol = TOLERANCE[dtype]
    verdict = "within" if float(rel.max()) <= tol else "BEYOND"
    print(f"teacher-forced logits, kvattn vs {label}: max relative difference per step {float(rel.max()):.1e} "
          f"(median {float(rel.median()):.1e}, {rel.numel()} steps), {verdict} the {args.dtype} tolerance {tol:.0e}; "
          f"same next token at {same_next} / {rel.numel()} steps")
    same = sum(a == b for a, b in zip(results["kvattn"], results[label]))
    note = (" (bfloat16 rounding breaks a random model's near-ties either way: the logits above are the "
            "comparison that counts)" if dtype == torch.bfloat16 else "")
    print(f"requests whose greedy tokens match {label}: {same} / {len(prompts)}{note}")


if __name__ == "__main__":
    main()
