"""Tokens/s of transformers' continuous-batching generation with kvattn against transformers' own
paged implementations, same model, same GPU, same run.

A random-initialised Llama-style model (default ~1.1B parameters: hidden 2048, 16 layers, 32 query
/ 8 KV heads of 64, MLP 8192, vocabulary 32000) in bfloat16 generates ``--new-tokens`` greedy
tokens for each of ``--requests`` random prompts of ``--prompt-len`` tokens through
``model.generate_batch``, once per attention implementation:

* ``kvattn``: ``attn_implementation="kvattn"`` (kvattn.integrations.transformers);
* ``default``: what ``generate_batch`` picks for a model loaded with transformers' default
  implementation (flash attention when installed, else paged SDPA) -- recorded as ``resolved``;
* ``sdpa``: transformers' paged SDPA (``paged|sdpa``; ``sdpa`` on releases without ``paged|`` names);
* ``eager``: ``paged|eager`` (opt-in: it materialises the scores of whole batches).

Each implementation first runs a small warm-up batch on the same persistent manager (kernel
compilation, allocator warm-up), then the timed batch: tokens/s = requests * new tokens / wall
time of ``generate_batch``, which includes the prefill of all prompts (a serving workload). All
implementations share one continuous-batching config (page size, batch-token budget, cache size),
with or without CUDA graphs (``--cuda-graphs``). The device's ceilings (copy bandwidth, bf16
matmul rate) are measured in the same run. Results go to ``--out`` as JSON and a table.

Run: ``python benchmarks/generate_bench.py --out results.json`` (about 2-4 minutes on an H100;
``--layers``/``--requests``/``--new-tokens`` shrink it).
"""

from __future__ import annotations

if __package__ in (None, ""):  # run as a script: make benchmarks.* and src/ importable
    import _paths  # noqa: F401

import argparse
import dataclasses
import datetime
import json
import platform
import sys
import time

import torch


def build_model(args, device):
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim, max_position_embeddings=max(4096, args.prompt_len + args.new_tokens),
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(cfg)
    return model.to(args.dtype).eval()


def cb_config(args, use_cuda_graph):
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
    pages_per_request = -(-(args.prompt_len + args.new_tokens) // args.page_size)
    kw = dict(num_blocks=args.requests * pages_per_request + 16, max_batch_tokens=args.max_batch_tokens,
              max_requests_per_batch=args.requests, use_cuda_graph=use_cuda_graph, allow_block_sharing=False)
    kw["page_size" if "page_size" in fields else "block_size"] = args.page_size
    if "auto_switch_to_flash" in fields:
        kw["auto_switch_to_flash"] = False
    return ContinuousBatchingConfig(**{k: v for k, v in kw.items() if k in fields})


def implementation_name(which: str) -> str:
    from kvattn.integrations import transformers as kvattn_tf

    prefixed = kvattn_tf.paged_name() == kvattn_tf.PAGED_NAME
    return {
        "kvattn": kvattn_tf.NAME,
        "default": "sdpa",  # the model's default; generate_batch switches it to its paged choice
        "sdpa": "paged|sdpa" if prefixed else "sdpa",
        "eager": "paged|eager",
    }[which]


def run_one(model, which, args, prompts, warm_prompts, use_cuda_graph):
    from transformers import GenerationConfig

    name = implementation_name(which)
    model.set_attn_implementation(name)
    seen = {}

    def record(module, inputs):  # the implementation the forward passes run under (None: inputs unchanged)
        seen.setdefault("impl", module.config._attn_implementation)

    hook = model.register_forward_pre_hook(record)
    gen = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    warm_gen = GenerationConfig(max_new_tokens=args.warmup_new_tokens, do_sample=False, eos_token_id=-1,
                                pad_token_id=0)
    config = cb_config(args, use_cuda_graph)
    try:
        t0 = time.perf_counter()
        model.generate_batch(warm_prompts, generation_config=warm_gen, continuous_batching_config=config,
                             persistent_manager=True)
        warm_s = time.perf_counter() - t0
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        t0 = time.perf_counter()
        out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=config,
                                   persistent_manager=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    finally:
        hook.remove()
        model.destroy_cached_continuous_batching_manager()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    ordered = sorted(out.values(), key=lambda o: int(o.request_id.split("_")[-1]))
    tokens = [list(o.generated_tokens) for o in ordered]
    generated = sum(len(t) for t in tokens)
    if len(ordered) != len(prompts) or generated != len(prompts) * args.new_tokens:
        raise RuntimeError(f"{which}: {len(ordered)} of {len(prompts)} requests returned {generated} tokens, "
                           f"expected {len(prompts) * args.new_tokens}")
    return {
        "implementation": which, "attn_implementation": name, "resolved": seen.get("impl"),
        "cuda_graphs": bool(use_cuda_graph), "seconds": seconds, "warmup_seconds": warm_s,
        "generated_tokens": generated, "tokens_per_s": generated / seconds,
        "total_tokens_per_s": (generated + sum(len(p) for p in prompts)) / seconds,
    }, tokens


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--page-size", type=int, default=256)
    p.add_argument("--max-batch-tokens", type=int, default=8192)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--impls", default="kvattn,default,sdpa", help="comma list of kvattn, default, sdpa, eager")
    p.add_argument("--cuda-graphs", default="off", choices=["off", "on", "both"],
                   help="run the implementations without CUDA graphs, with them, or both")
    p.add_argument("--graph-impls", default="kvattn", help="with --cuda-graphs both: the implementations run with graphs")
    p.add_argument("--warmup-requests", type=int, default=8)
    p.add_argument("--warmup-new-tokens", type=int, default=8)
    p.add_argument("--no-ceilings", action="store_true")
    p.add_argument("--out", default=None, help="JSON file")
    args = p.parse_args(argv)
    args.dtype = getattr(torch, args.dtype)

    import transformers
    import triton

    from kvattn.integrations import transformers as kvattn_tf

    kvattn_tf.register()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(args, device)
    params = sum(t.numel() for t in model.parameters())
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, args.vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.requests)]
    warm = [torch.randint(0, args.vocab, (min(64, args.prompt_len),), generator=g).tolist()
            for _ in range(args.warmup_requests)]
    graphs = {"off": [False], "on": [True], "both": [False, True]}[args.cuda_graphs]

    ceilings = None
    if not args.no_ceilings and device.type == "cuda":
        from benchmarks import ceilings as ceil_mod
        from kvattn.benchmarking.timing import Timer

        ceilings = ceil_mod.measure(device, Timer(device))

    rows, outputs = [], {}
    impls = [w.strip() for w in args.impls.split(",") if w.strip()]
    graph_impls = [w.strip() for w in args.graph_impls.split(",") if w.strip()]
    for use_graph in graphs:
        for which in impls:
            if use_graph and args.cuda_graphs == "both" and which not in graph_impls:
                continue
            same_as = next((r for r in rows if which == "sdpa" and r.get("implementation") == "default"
                            and r.get("cuda_graphs") == use_graph
                            and r.get("resolved") in ("sdpa", "paged|sdpa")), None)
            if same_as is not None:  # the default already was paged SDPA: one measurement, two names
                rows.append({**same_as, "implementation": "sdpa", "same_run_as": "default"})
                print(json.dumps(rows[-1]), flush=True)
                continue
            try:
                row, tokens = run_one(model, which, args, prompts, warm, use_graph)
                outputs[(which, use_graph)] = tokens
            except Exception as exc:  # noqa: BLE001 - a failed implementation is recorded, not fatal
                row = {"implementation": which, "cuda_graphs": use_graph, "error": f"{type(exc).__name__}: {exc}"[:800]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    # Agreement of the greedy tokens with kvattn's (informational: a random model has near-ties
    # that bf16 rounding in two different kernels may break differently, after which runs diverge).
    for (which, use_graph), tokens in outputs.items():
        base = outputs.get(("kvattn", use_graph))
        if base is not None and which != "kvattn":
            same_prefix = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(base, tokens)]
            for row in rows:
                if row.get("implementation") == which and row.get("cuda_graphs") == use_graph:
                    row["tokens_equal_to_kvattn"] = sum(a == b for a, b in zip(base, tokens)) / len(tokens)
                    row["mean_common_prefix"] = sum(same_prefix) / len(same_prefix)

    result = {
        "benchmark": "generate_bench",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "transformers": transformers.__version__,
                     "python": sys.version.split()[0]},
        "model": {"params": params, "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
                  "kv_heads": args.kv_heads, "head_dim": args.head_dim, "intermediate": args.intermediate,
                  "vocab": args.vocab, "dtype": str(args.dtype).replace("torch.", "")},
        "workload": {"requests": args.requests, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                     "page_size": args.page_size, "max_batch_tokens": args.max_batch_tokens},
        "ceilings": ceilings,
        "results": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(f"\n{result['device']}  transformers {transformers.__version__}  torch {torch.__version__}  "
          f"params {params / 1e9:.2f}B  {args.requests} x ({args.prompt_len} + {args.new_tokens})")
    print(f"{'implementation':<10} {'resolved':<14} {'graphs':<6} {'seconds':>8} {'tok/s':>9} {'same':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['implementation']:<10} ERROR {r['error'][:100]}")
            continue
        same = r.get("tokens_equal_to_kvattn")
        print(f"{r['implementation']:<10} {str(r['resolved']):<14} {str(r['cuda_graphs']):<6} {r['seconds']:8.2f} "
              f"{r['tokens_per_s']:9.1f} {'' if same is None else f'{same:.2f}':>6}")
    return result


if __name__ == "__main__":
    main()
