"""What a fuzz call is: one table of argument drawers per public function.

A *spec* is a plain dict (JSON-serialisable) that fixes one legal call: the function, a seed for
the tensor values, the shapes and every option. :mod:`kvattn.fuzz.calls` turns a spec into tensors
and a call; the shrinker edits specs. ``ARGS[function]`` lists ``(key, drawer)`` pairs in order; a
drawer ``draw(rng, spec, env)`` sees the keys drawn before it, so a later argument can depend on an
earlier one (an fp8 output only over an fp8 cache, lengths no shorter than the drafts). A new
argument of a public function is registered here: one drawer in its function's table, its "off"
value in ``OPTIONS`` (so the shrinker can drop it), and its use in the function's builder in
its family's ``build_*.py`` (docs/fuzzing.md, "Adding an argument").
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

FUNCTIONS = ("batch_decode", "xqa", "single_decode", "mla", "prefill")
MODES = ("plain", "graph", "determinism", "invariant")  # how a call is run: kvattn.fuzz.modes


@dataclass
class Env:
    """Where the calls run: sizes follow it (the interpreter gets tiny shapes, a GPU long ones)."""

    device: str = "cpu"  # "cpu" or "cuda"
    interpreter: bool = False  # CPU tensors through Triton's interpreter (no bfloat16 arithmetic)
    sm_count: int = 0  # SMs of the GPU (0 on a CPU): batches sometimes exceed it
    tiles: dict = field(default_factory=dict)  # family -> BLOCK_N values of its config tables

    @property
    def tiny(self) -> bool:
        return self.device == "cpu"

    @property
    def max_len(self) -> int:
        """Longest ordinary request; one long request may be several times this."""
        if self.interpreter:
            return 80
        return 160 if self.device == "cpu" else 2048


def tile_sizes() -> dict:
    """BLOCK_N of every entry of each family's config tables: request lengths land on their edges."""
    from ..ops.decode import configs as decode_configs
    from ..ops.mla import configs as mla_configs
    from ..ops.prefill import configs as prefill_configs

    def first(entry):
        return entry.block_n if hasattr(entry, "block_n") else entry[0]

    tiles = {}
    for family, module in (("decode", decode_configs), ("mla", mla_configs), ("prefill", prefill_configs)):
        sizes = {first(e) for table in module.TABLES.values() for e in table.values()}
        tiles[family] = sorted(sizes)
    return tiles


# ---------------------------------------------------------------------------------------------
# Shared drawers
# ---------------------------------------------------------------------------------------------
def _half(rng, spec, env):
    # The interpreter has no bfloat16 arithmetic: a 16-bit cache there is float16.
    return "float16" if env.interpreter else rng.choice(["bfloat16", "float16"])


def _head_dim(rng, spec, env):
    return rng.choice([64, 64, 128] if env.interpreter else [64, 128, 128, 256])


def _kv_heads(rng, spec, env):
    return rng.choice([1, 2] if env.tiny else [1, 2, 4, 8])


def _group(rng, spec, env):
    """Query heads per KV head: large groups now and then."""
    choices = [1, 2, 3, 4, 8] if env.tiny else [1, 2, 4, 5, 7, 8, 16, 32]
    return rng.choice(choices)


def _page(rng, spec, env):
    return rng.choice([1, 4, 8, 16, 16, 32] if env.tiny else [1, 8, 16, 16, 32, 64, 64, 128])


def edge_length(rng, page: int, tiles, env: Env) -> int:
    """A length on an edge: 0, 1, a page or a tile +- 1, or uniform up to the environment's size."""
    tile = rng.choice(list(tiles) or [16])
    edges = [0, 1, 2, page - 1, page, page + 1, tile - 1, tile, tile + 1, 2 * tile + 1, 3 * page - 1]
    if rng.random() < 0.5:
        return max(0, rng.choice(edges))
    # Log-uniform up to the environment's length: short requests are common (and cheap for the
    # oracle), long ones still come up.
    return int(math.exp(rng.uniform(0.0, math.log(env.max_len + 1)))) - 1 + rng.randint(0, 1)


def lengths(rng, n: int, page: int, tiles, env: Env, minimum: int = 0) -> list:
    """``n`` lengths on edges; sometimes one request far longer than the rest."""
    # 0 always stays legal: an empty request (a padding slot), whatever its query rows.
    out = [n and max(minimum, n) for n in (edge_length(rng, page, tiles, env) for _ in range(n))]
    if n and rng.random() < 0.2:
        out[rng.randrange(n)] = rng.randint(env.max_len, 4 * env.max_len)
    return out


def _batch(rng, spec, env):
    if env.sm_count and rng.random() < 0.1:
        return env.sm_count + rng.randint(1, env.sm_count)  # more requests than SMs
    if env.interpreter:
        return rng.choice([0, 1, 1, 2, 3])
    return rng.choice([0, 1, 2, 3, 5, 8] if env.tiny else [0, 1, 2, 3, 4, 7, 16, 33])


def _scale(base):
    """A float or a one-element device tensor (read by the kernel, never by the host)."""

    def draw(rng, spec, env):
        value = base(spec) * rng.choice([1.0, 0.5, 2.0, rng.uniform(0.2, 3.0)])
        return {"value": value, "tensor": rng.random() < 0.4}

    return draw


def _chance(p, value=True, off=False):
    return lambda rng, spec, env: value if rng.random() < p else off


def _choice(*values):
    return lambda rng, spec, env: rng.choice(values)


def _view(rng, spec, env):
    """``"contiguous"`` or ``"strided"``: the cache a slice of a wider buffer (only its last dim
    contiguous, which every function allows)."""
    return "strided" if rng.random() < 0.3 else "contiguous"


# "arg_views": the other tensors as views too, where legal: the query, out and lse with only their
# last dim contiguous, the page tables and lengths with a stride of 2 in their last dim.


def _window(key="lens"):
    def draw(rng, spec, env):
        if rng.random() < 0.7:
            return -1
        value = spec[key]
        longest = max(value + [1]) if isinstance(value, list) else max(value, 1)
        return rng.choice([0, 1, rng.randint(0, longest)])

    return draw


# The float64 oracle pads every request to the longest one and spreads V over the query heads:
# its largest tensor, ``B * max(L) * Hq * D`` (or the logits), stays under this many elements
# (32 MB of float64; 8 MB where the calls themselves run on the CPU), so the oracle keeps up with
# the GPU: a batch of more requests than SMs gets short requests, a long request a small batch.
ORACLE_ELEMENTS = 1 << 22
ORACLE_ELEMENTS_CPU = 1 << 20


def oracle_elements(env: Env) -> int:
    return ORACLE_ELEMENTS_CPU if env.tiny else ORACLE_ELEMENTS


def fit(lens: list, width: int, minimum: int = 0, budget: int = ORACLE_ELEMENTS) -> list:
    """``lens`` cut so that ``len(lens) * max(lens) * width`` stays under ``budget``."""
    if not lens:
        return lens
    cap = max(budget // (len(lens) * max(width, 1)), minimum, 1)
    return [min(n, cap) for n in lens]


def _oracle_width(spec) -> int:
    """Elements a padded token costs the oracle: its values spread over the query heads, or its
    logits, whichever is larger."""
    if spec["function"] == "mla":
        return max(576, spec["heads"] * 512)
    heads = spec["kv_heads"] * spec["group"]
    return heads * max(spec["head_dim"], spec.get("q_len", 1))


def _lens_for(family, minimum=lambda spec: 0):
    def draw(rng, spec, env):
        if spec.get("max_len") is not None:  # a mutation: the class's bound is pinned
            return lengths_under(rng, spec, env.tiles.get(family, [16]), env)
        lens = lengths(rng, spec["batch"], spec["page"], env.tiles.get(family, [16]), env, minimum(spec))
        return fit(lens, _oracle_width(spec), minimum(spec), oracle_elements(env))

    return draw


def lengths_under(rng, spec, tiles, env: Env) -> list:
    """A mutation's lengths: ``spec["batch"]`` lengths on the edges (0, 1, a page or a tile +- 1)
    at most the class's ``max_len``, each at least its request's query rows (ragged drafts, prefill
    ``q_lens``: pinned by the class, as they are the query's shape); half the time one request
    exactly at the bound among the others."""
    cap = spec["max_len"]
    floors = spec.get("q_lens") or spec.get("drafts") or [0] * spec["batch"]
    out = []
    for floor in floors:
        n = edge_length(rng, spec["page"], tiles, env)
        out.append(max(n if n <= cap else rng.randint(0, cap), floor))
    if out and rng.random() < 0.5:
        out[rng.randrange(len(out))] = cap
    return out


def _max_len(rng, spec, env):
    """The longest length a class allows: the table's width, the pool's pages and the host
    bound (``max_seq_len`` / ``max_kv_len``) follow from it, so its mutations launch the kernels
    it launched (docs/fuzzing.md, "Classes and mutation"). Draws no random number."""
    return max(spec["lens"] + [0])


def _q_lens(rng, spec, env):
    """Prefill query rows a request: none, one, all its tokens, or some; the padded logits
    ``B * Hq * max(q) * max(L)`` kept under the oracle's budget."""
    q = [rng.choice([0, 1, n, rng.randint(0, n)]) if n else 0 for n in spec["lens"]]
    if q and spec["lens"]:
        heads = spec["kv_heads"] * spec["group"]
        cap = max(oracle_elements(env) // (len(q) * heads * max(max(spec["lens"]), 1)), 1)
        q = [min(n, cap) for n in q]
    return q


def _extra_pages(rng, spec, env):
    """Table columns past the longest request (never read) and host bounds above the lengths."""
    return rng.choice([0, 0, 1, 3])


# ---------------------------------------------------------------------------------------------
# Per-function tables
# ---------------------------------------------------------------------------------------------
def _decode_out(rng, spec, env):
    kinds = ["none", "query", "query", "float32"] + (["fp8"] if spec["kv_format"] == "fp8" else [])
    return rng.choice(kinds)


def _decode_kv_format(rng, spec, env):
    return rng.choice(["half", "half", "fp8", "nvfp4"])


def _q_len(rng, spec, env):
    return 1 if rng.random() < 0.6 else rng.choice([2, 3, 4, 5])


def _ragged(rng, spec, env):
    """Ragged drafts (``q_cu_seq_lens``): each request its own draft count, 0 to ``q_len``."""
    return rng.random() < 0.3


def _drafts(rng, spec, env):
    """Draft rows a request under ``q_cu_seq_lens``: 0 to ``q_len``, never more than its length
    (the CPU checks refuse that); the longest request sometimes at the maximum."""
    if not spec["ragged"]:
        return None
    return [rng.randint(0, min(spec["q_len"], n)) for n in spec["lens"]]


def _mask(rng, spec, env):
    """A draft mask: with ``Q > 1`` only (ragged too, where a request of one draft still reads its
    row's bits). docs/semantics.md states the mask for ``Q > 1``; with ``Q = 1`` the kernels ignore
    it and the reference applies it, so it is not drawn there (docs/fuzzing.md)."""
    return spec["q_len"] > 1 and rng.random() < 0.5


def _xqa_q_len(rng, spec, env):
    """xqa's ``q_seq_len``: speculative decoding with 2-5 drafts now and then (ragged draws need
    one: their ``Q`` is the maximum)."""
    return 1 if rng.random() < 0.5 else rng.choice([2, 3, 4, 5])


def _form(rng, spec, env):
    return rng.choice(["stacked", "stacked", "tuple", "shared"])


ARGS = {
    "batch_decode": (
        ("dtype", _half),
        ("kv_format", _decode_kv_format),
        ("head_dim", _head_dim),
        ("kv_heads", _kv_heads),
        ("group", _group),
        ("page", _page),
        ("batch", _batch),
        ("q_len", _q_len),
        ("ragged", _ragged),
        ("lens", _lens_for("decode", lambda spec: spec["q_len"])),
        ("max_len", _max_len),
        ("drafts", _drafts),
        ("cu_dtype", _choice("int32", "int32", "uint32")),  # of q_cu_seq_lens
        ("extra_pages", _extra_pages),
        ("layout", _choice("NHD", "HND")),
        ("form", _form),
        ("view", _view),
        ("arg_views", _chance(0.25)),
        ("seq_lens_dtype", _choice("int32", "int32", "uint32")),
        ("bmm1_scale", _scale(lambda spec: spec["head_dim"] ** -0.5)),
        ("bmm2_scale", _scale(lambda spec: 1.0)),
        ("o_scale", _choice(1.0, 1.0, 0.5, 2.0)),
        ("window_left", _window()),
        ("sinks", _chance(0.3)),
        ("mask", _mask),
        ("out", _decode_out),
        ("return_lse", _chance(0.4)),
        ("lse_given", lambda rng, spec, env: spec["return_lse"] and rng.random() < 0.5),
        ("enable_pdl", _choice(None, None, True, False)),
    ),
    "xqa": (
        ("dtype", _half),
        ("kv_format", _choice("half", "half", "fp8", "nvfp4")),
        ("head_dim", _head_dim),
        ("kv_heads", _kv_heads),
        ("group", _group),
        ("page", lambda rng, spec, env: rng.choice([16, 16, 32] if env.tiny else [16, 32, 64, 128])),
        ("batch", _batch),
        ("q_len", _xqa_q_len),
        ("ragged", _ragged),
        ("lens", _lens_for("decode", lambda spec: spec["q_len"])),
        ("max_len", _max_len),
        ("drafts", _drafts),
        ("cu_dtype", _choice("int32", "int32", "uint32")),  # of q_cu_seq_lens
        ("extra_pages", _extra_pages),
        ("pool", _choice("flat", "flat", "NHD", "HND")),
        ("view", _view),
        ("arg_views", _chance(0.25)),
        ("seq_lens_dtype", _choice("uint32", "uint32", "int32")),
        ("q_scale", _scale(lambda spec: 1.0)),
        ("kv_scale", lambda rng, spec, env: spec["kv_format"] != "half" and rng.random() < 0.7),
        ("sliding_win_size", lambda rng, spec, env: 0 if rng.random() < 0.7 else rng.randint(1, max(spec["lens"] + [1]) + 1)),
        ("sinks", _chance(0.3)),
        ("sm_count", lambda rng, spec, env: None if rng.random() < 0.7 else rng.choice([1, 2, 7])),
        ("enable_pdl", _choice(None, None, True, False)),
        ("mask", _mask),
        ("out", lambda rng, spec, env: rng.choice(["query"] + (["fp8"] if spec["kv_format"] != "half" else []))),
        # Scales an fp8 output only; drawn for every output (the others must ignore it).
        ("rcp_out_scale", _choice(1.0, 1.0, 0.5, 2.0)),
        ("return_lse", _chance(0.4)),
        ("lse_given", lambda rng, spec, env: spec["return_lse"] and rng.random() < 0.5),
    ),
    "single_decode": (
        ("dtype", _half),
        ("kv_format", _choice("half", "half", "fp8")),
        ("head_dim", _head_dim),
        ("kv_heads", _kv_heads),
        ("group", _group),
        ("length", lambda rng, spec, env: lengths(rng, 1, 16, env.tiles.get("decode", [16]), env)[0]),
        ("layout", _choice("NHD", "HND")),
        ("view", _view),
        ("arg_views", _chance(0.25)),
        ("pos_encoding_mode", _choice("NONE", "NONE", "ROPE_LLAMA", "ALIBI")),
        ("use_tensor_cores", _chance(0.5)),
        ("q_scale", _choice(None, None, 0.5, 1.5)),
        ("k_scale", _choice(None, None, 0.5, 1.5)),
        ("v_scale", _choice(None, None, 0.5, 2.0)),
        ("window_left", _window("length")),
        ("logits_soft_cap", _choice(None, None, None, 0.0, 5.0, 30.0)),
        ("sm_scale", lambda rng, spec, env: None if rng.random() < 0.6 else spec["head_dim"] ** -0.5 * rng.uniform(0.5, 2)),
        ("rope_scale", lambda rng, spec, env: None if rng.random() < 0.7 else rng.choice([0.5, 2.0, 8.0])),
        ("rope_theta", lambda rng, spec, env: None if rng.random() < 0.7 else rng.choice([500.0, 1e4, 5e5])),
        ("out", _choice("none", "none", "query", "float32")),
        ("return_lse", _chance(0.4)),
        ("lse_given", lambda rng, spec, env: spec["return_lse"] and rng.random() < 0.5),
    ),
    "mla": (
        ("dtype", lambda rng, spec, env: rng.choice(["bfloat16", "bfloat16", "fp8"])),
        # An fp8 query reads an fp8 cache; the interpreter has no bfloat16 cache arithmetic.
        ("kv_dtype", lambda rng, spec, env: "fp8" if spec["dtype"] == "fp8" or env.interpreter
         else rng.choice(["bfloat16", "bfloat16", "fp8"])),
        ("heads", lambda rng, spec, env: rng.choice([1, 2, 8, 16] if env.tiny else [1, 8, 16, 17, 24, 32, 64, 128])),
        ("page", lambda rng, spec, env: rng.choice([16, 32] if env.tiny else [16, 32, 64, 64, 128])),
        ("batch", _batch),
        # Multi-token prediction: a 4-D query [B, Q, H, 576] with Q 1 to 4.
        ("q_len", lambda rng, spec, env: 1 if rng.random() < 0.5 else rng.choice([2, 3, 4])),
        ("lens", _lens_for("mla", lambda spec: spec["q_len"])),
        ("max_len", _max_len),
        ("extra_pages", _extra_pages),
        ("cache_dims", _choice(3, 4)),
        ("view", _view),
        ("arg_views", _chance(0.25)),
        ("seq_lens_dtype", _choice("int32", "int32", "uint32")),
        ("bmm1_scale", _scale(lambda spec: 192 ** -0.5)),
        ("bmm2_scale", _scale(lambda spec: 1.0)),
        ("out", _choice("none", "query")),
        ("return_lse", _chance(0.4)),
        ("lse_given", lambda rng, spec, env: spec["return_lse"] and rng.random() < 0.5),
        ("enable_pdl", _choice(None, None, True, False)),
    ),
    "prefill": (
        ("dtype", _half),
        ("kv_format", _decode_kv_format),
        ("fp8_query", lambda rng, spec, env: spec["kv_format"] in ("fp8", "nvfp4") and rng.random() < 0.3),
        ("head_dim", _head_dim),
        ("kv_heads", _kv_heads),
        ("group", _group),
        ("page", _page),
        ("batch", _batch),
        ("lens", _lens_for("prefill")),
        ("max_len", _max_len),
        ("q_lens", _q_lens),
        ("extra_pages", _extra_pages),
        ("layout", _choice("HND", "HND", "NHD")),
        ("form", _form),
        ("split_tables", _chance(0.25)),
        ("view", _view),
        ("arg_views", _chance(0.25)),
        ("seq_lens_dtype", _choice("int32", "int32", "uint32")),
        ("bmm1_scale", _scale(lambda spec: spec["head_dim"] ** -0.5)),
        ("bmm2_scale", _scale(lambda spec: 1.0)),
        ("causal", _chance(0.7, True, False)),
        # causal=False takes no window (docs/semantics.md, section 5).
        ("window_left", lambda rng, spec, env: _window()(rng, spec, env) if spec["causal"] else -1),
        ("sinks", _choice(None, None, "tensor", "list")),
        ("out_dtype", lambda rng, spec, env: rng.choice(["none", "none", "query", "fp8", "nvfp4"])),
        ("out", _chance(0.5)),
        ("o_sf_scale", lambda rng, spec, env: None if spec["out_dtype"] != "nvfp4" or rng.random() < 0.5 else rng.choice([0.5, 4.0])),
        ("o_sf_vec_size", _choice(None, 16)),
        # Skip-softmax tiles are aligned at a request's first row; the oracle of causal=False runs
        # each row as its own request, so the two are not drawn together.
        ("skip_softmax", lambda rng, spec, env: rng.choice([None, None, None, 0.0, 0.01, 1.0]) if spec["causal"] else None),
        ("return_lse", _chance(0.4)),
        ("lse_given", lambda rng, spec, env: spec["return_lse"] and rng.random() < 0.5),
        ("enable_pdl", _choice(None, None, True, False)),
        # The block scales under the release's name (position 20) or the seed's (keyword).
        ("sf_name", _choice("kv_cache_sf", "kv_block_scales")),
        # trtllm-gen variant selectors: accepted, no effect on the result (docs/semantics.md).
        ("counter_buffer", _chance(0.3)),
        ("use_fp16_softmax", _choice(None, None, True, False)),
        ("uses_spcompress", _choice(None, None, True, False)),
        ("backend", _choice("trtllm-gen", "trtllm-gen", "cake")),
    ),
}

# The value of each option that means "off" (as if the caller left it out): the shrinker tries
# each of them in turn. Shapes (batch, lengths, heads) are shrunk separately.
OPTIONS = {
    "batch_decode": {"kv_format": "half", "layout": "NHD", "form": "stacked", "view": "contiguous", "arg_views": False,
                     "seq_lens_dtype": "int32", "extra_pages": 0, "q_len": 1, "ragged": False, "drafts": None,
                     "cu_dtype": "int32", "o_scale": 1.0, "max_len": None,
                     "bmm1_scale": "plain", "bmm2_scale": "plain", "window_left": -1, "sinks": False,
                     "mask": False, "out": "none", "return_lse": False, "lse_given": False, "enable_pdl": None,
                     "head_dim": 64, "page": 16},
    "xqa": {"kv_format": "half", "pool": "flat", "view": "contiguous", "arg_views": False, "seq_lens_dtype": "uint32",
            "extra_pages": 0, "q_scale": "plain", "kv_scale": False, "sliding_win_size": 0, "sinks": False,
            "sm_count": None, "out": "query", "return_lse": False, "lse_given": False, "head_dim": 64,
            "page": 16, "q_len": 1, "ragged": False, "drafts": None, "cu_dtype": "int32", "mask": False, "enable_pdl": None,
            "rcp_out_scale": 1.0, "max_len": None},
    "single_decode": {"kv_format": "half", "layout": "NHD", "view": "contiguous", "arg_views": False, "pos_encoding_mode": "NONE",
                      "use_tensor_cores": False, "q_scale": None, "k_scale": None, "v_scale": None,
                      "window_left": -1, "logits_soft_cap": None, "sm_scale": None, "rope_scale": None,
                      "rope_theta": None, "out": "none", "return_lse": False, "lse_given": False, "head_dim": 64},
    "mla": {"cache_dims": 3, "view": "contiguous", "arg_views": False, "seq_lens_dtype": "int32", "extra_pages": 0,
            "bmm1_scale": "plain", "bmm2_scale": "plain", "out": "none", "return_lse": False,
            "lse_given": False, "enable_pdl": None, "page": 32, "q_len": 1, "max_len": None},
    "prefill": {"kv_format": "half", "fp8_query": False, "layout": "HND", "form": "stacked",
                "split_tables": False, "view": "contiguous", "arg_views": False, "seq_lens_dtype": "int32", "extra_pages": 0,
                "bmm1_scale": "plain", "bmm2_scale": "plain", "window_left": -1, "sinks": None,
                "out_dtype": "none", "out": False, "o_sf_scale": None, "o_sf_vec_size": None, "skip_softmax": None,
                "return_lse": False, "lse_given": False, "enable_pdl": None, "head_dim": 64, "page": 16,
                "causal": True, "sf_name": "kv_cache_sf", "counter_buffer": False, "use_fp16_softmax": None,
                "uses_spcompress": None, "backend": "trtllm-gen", "max_len": None},
}

# Options that only make sense together: when the first is dropped, the others go with it.
DEPENDENT = {"return_lse": ("lse_given",), "q_len": ("mask",), "kv_format": ("out", "kv_scale", "fp8_query"),
             "ragged": ("drafts", "cu_dtype"),
             "out_dtype": ("o_sf_scale",)}


def draw(function: str, rng: random.Random, env: Env) -> dict:
    """One legal call of ``function`` as a spec."""
    spec = {"function": function, "seed": rng.randrange(2**31)}
    for key, drawer in ARGS[function]:
        spec[key] = drawer(rng, spec, env)
    return normalise(spec)


def normalise(spec: dict) -> dict:
    """Restore the rules between keys after the shrinker edited one (lengths >= drafts, an fp8
    output only over an fp8 cache, a window inside the lengths, ...)."""
    s = dict(spec)
    fn = s["function"]
    if "lens" in s:
        s["batch"] = len(s["lens"])
    if fn in ("batch_decode", "xqa", "mla") and s.get("q_len", 1) > 1:
        s["lens"] = [n and max(n, s["q_len"]) for n in s["lens"]]
    if fn in ("batch_decode", "xqa"):
        if s.get("ragged"):
            # One draft count a request, 0 to q_len and never past the request's length.
            drafts = list(s.get("drafts") or [])
            drafts += [s["q_len"]] * (len(s["lens"]) - len(drafts))
            s["drafts"] = [min(q, s["q_len"], n) for q, n in zip(drafts, s["lens"])]
        else:
            s["drafts"] = None
        if s["q_len"] == 1:
            s["mask"] = False
    if fn == "batch_decode" and s["out"] == "fp8" and s["kv_format"] != "fp8":
        s["out"] = "query"
    if fn == "xqa":
        if s["kv_format"] == "half":
            s["kv_scale"] = False
            if s["out"] == "fp8":
                s["out"] = "query"
    if fn == "mla" and s["dtype"] == "fp8":
        s["kv_dtype"] = "fp8"
    if fn == "prefill":
        s["q_lens"] = [min(q, n) for q, n in zip(s["q_lens"], s["lens"])]
        if s["kv_format"] not in ("fp8", "nvfp4"):
            s["fp8_query"] = False
        if s["out_dtype"] != "nvfp4":
            s["o_sf_scale"] = None
        if not s.get("causal", True):
            s["window_left"], s["skip_softmax"] = -1, None
    if not s.get("return_lse", False):
        s["lse_given"] = False
    if s.get("max_len") is not None:  # (None: the bound follows the lengths, as in specs before it)
        s["max_len"] = max([s["max_len"]] + s["lens"])
    return s
