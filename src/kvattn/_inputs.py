"""Validation at the API boundary, and the normalised descriptions every backend consumes.

Every input form the public functions accept (NHD or HND pages, a ``(K, V)`` tuple or one tensor
with a size-2 / size-1 plane, xqa's flat pool of head vectors, split K/V page tables, MLA's latent
cache) becomes one :class:`PagedKV` of strided *views* (never copies): K and V as
``[num_pages, page_size, num_kv_heads, stored_dim]`` plus one page table each. Scale arguments
become :class:`Scale` (a host float times an optional one-element device tensor), so every
backend applies exactly two scales: a logit multiplier and an output multiplier.

All checks here read shapes, dtypes, strides and devices only: nothing synchronises with the
device. Checks that need device values live in :func:`debug_check_pages` (on for CPU tensors,
``KVATTN_DEBUG=1`` for CUDA tensors).
"""

from __future__ import annotations

import functools
import inspect
import math
import weakref
from dataclasses import dataclass
from typing import Callable, NamedTuple, TypeVar

import torch

from .runtime import env as _env
from ._formats_table import BY_DTYPE, DTYPES, FORMATS

T = TypeVar("T")

HALF_DTYPES = (torch.float16, torch.bfloat16)
LAYOUTS = ("NHD", "HND")
DECODE_HEAD_DIMS = (64, 128, 256)  # head dims of the decode kernels (batch, xqa and single decode)


# ---------------------------------------------------------------------------------------------
# small checks
# ---------------------------------------------------------------------------------------------
def _dtype_names(dtypes) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(x, name: str, *, dtypes=None, ndim=None, device=None, contiguous_last: bool = False) -> torch.Tensor:
    """Type, dtype, rank (an int or a tuple of ints) and device of one tensor argument, and with
    ``contiguous_last`` stride 1 in the last dim (:func:`check_last_dim_contiguous`); raises
    TypeError/ValueError."""
    # The common case, valid arguments, in one test (the checks run on every eager call).
    if type(x) is torch.Tensor and (dtypes is None or x.dtype in dtypes) and (ndim is None or x.dim() == ndim) \
            and (device is None or x.device == device) and (not contiguous_last or x.stride()[-1:] == (1,)):
        return x
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if dtypes is not None and x.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype in ({_dtype_names(dtypes)}), got {str(x.dtype).replace('torch.', '')}"
                        + (INT64_RULE if x.dtype == torch.int64 and torch.int32 in dtypes else ""))
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.dim() not in allowed:
            raise ValueError(f"{name}: expected a {' or '.join(map(str, allowed))}-D tensor, got shape {tuple(x.shape)}")
    if device is not None and x.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (the query's device), got one on {x.device}")
    if contiguous_last and x.dim():  # (a 0-d tensor is left to the caller's shape check)
        check_last_dim_contiguous(x, name)
    return x


# Index tensors (docs/semantics.md, "Index tensors"): page tables and lengths are int32 (lengths
# also uint32), as the kernels read them; an int64 one would need a converted copy each call, an
# allocation on the hot path, so it is rejected with this hint. Row offsets (cum_seq_lens_q / kv)
# and the append's token indices are read in the dtype given, int32 or int64.
INT64_RULE = (" (page tables and lengths are read as 32-bit values: convert them once where they are made, "
              "with .to(torch.int32), rather than on every call)")


def check_shape(x: torch.Tensor, name: str, expected: tuple) -> None:
    """``expected`` may hold None for a free dim."""
    shape = x.shape
    if shape == expected:  # torch.Size equals the tuple of its sizes (and never one holding None)
        return
    ok = len(shape) == len(expected) and all(e is None or e == s for e, s in zip(expected, shape))
    if not ok:
        want = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
        raise ValueError(f"{name}: expected shape {want}, got {list(x.shape)}")


def check_last_dim_contiguous(x: torch.Tensor, name: str) -> None:
    if x.stride()[-1] != 1 and x.shape[-1] > 1:
        raise ValueError(f"{name}: expected stride 1 in the last (head_dim) dim, got strides {tuple(x.stride())}")


def check_layout(kv_layout, name: str = "kv_layout") -> str:
    if kv_layout in LAYOUTS and type(kv_layout) is str:
        return kv_layout
    if not isinstance(kv_layout, str) or kv_layout.upper() not in LAYOUTS:
        raise ValueError(f"{name}: expected 'NHD' or 'HND', got {kv_layout!r}")
    return kv_layout.upper()


def check_int(value, name: str, *, minimum: int | None = None, choices=None) -> int:
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    if choices is not None and value not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {value}")
    return value


def check_window(window_left, name: str = "window_left") -> int:
    w = check_int(window_left, name)
    if w < -1:
        raise ValueError(f"{name}: expected -1 (no window) or an int >= 0, got {w}")
    return w


def check_sinks(sinks, name: str, num_heads: int, device) -> torch.Tensor | None:
    """Sinks as float32 ``[num_heads]`` (any shape with that many elements is flattened)."""
    if sinks is None:
        return None
    if isinstance(sinks, (list, tuple)):
        if len(sinks) != 1:
            raise ValueError(f"{name}: expected a tensor or a list of one tensor, got a list of {len(sinks)}")
        sinks = sinks[0]
    check_tensor(sinks, name, dtypes=(torch.float32,), device=device)
    if sinks.numel() != num_heads:
        raise ValueError(f"{name}: expected {num_heads} values (one per query head), got shape {list(sinks.shape)}")
    return sinks if sinks.dim() == 1 else sinks.reshape(num_heads)


def check_query_heads(hq: int, name: str, num_kv_heads: int, *, kv_name: str | None = None, kv_shape=None,
                      layout: str | None = None, other_heads: int | None = None) -> int:
    """``hq`` (the query's head count) divisible by ``num_kv_heads``: the group size.

    ``kv_name``/``kv_shape``: the argument ``num_kv_heads`` was read from, for the messages; with
    ``layout`` and ``other_heads`` (the head count the other layout would read from that shape) a
    count that only the other layout makes consistent is reported as a ``kv_layout`` mix-up,
    naming the cache (its layout is what the shapes suggest is wrong), not the query."""
    if num_kv_heads >= 1 and hq >= 1 and not hq % num_kv_heads:  # the common case, first
        return hq // num_kv_heads
    if num_kv_heads < 1:
        where = kv_name or "num_kv_heads"
        got = f"shape {list(kv_shape)}" if kv_shape is not None else str(num_kv_heads)
        raise ValueError(f"{where}: expected at least one KV head, got {got}" + (f" (read as {layout})" if layout else ""))
    if hq < 1:
        raise ValueError(f"{name}: expected at least one head, got {hq}")
    if layout is not None and other_heads and not hq % other_heads:
        other = "HND" if layout == "NHD" else "NHD"
        raise ValueError(
            f"{kv_name}: shape {list(kv_shape)} read as {layout} gives {num_kv_heads} KV heads, which does not divide "
            f"the query's {hq} heads; read as {other} it gives {other_heads}: is kv_layout='{other}' meant?"
        )
    source = f" ({kv_name}'s" + (f", read as {layout})" if layout else ")") if kv_name else ""
    raise ValueError(f"{name}: expected a number of heads divisible by num_kv_heads={num_kv_heads}{source}, got {hq}")


def check_half_match(query_dtype, name: str, kv_dtype, kv_name: str) -> None:
    """A 16-bit cache of the other 16-bit dtype than the query's: the query is named (its dtype is
    what the cache is checked against), with both dtypes."""
    if kv_dtype != query_dtype and kv_dtype in HALF_DTYPES and query_dtype in HALF_DTYPES:
        raise TypeError(
            f"{name}: expected the dtype of {kv_name} ({_dtype_names((kv_dtype,))}; a 16-bit cache and its query share "
            f"one dtype), got {_dtype_names((query_dtype,))}"
        )


def check_head_dim(head_dim: int, name: str, allowed=DECODE_HEAD_DIMS) -> int:
    if head_dim not in allowed:
        raise ValueError(f"{name}: expected head_dim in {allowed}, got {head_dim}")
    return head_dim


def check_out(out, name: str, shape: tuple, dtypes, device) -> torch.Tensor:
    check_tensor(out, name, dtypes=dtypes, device=device, contiguous_last=True)
    check_shape(out, name, shape)
    return out


def check_lse_out(lse, return_lse, rows: int, num_heads: int, device, name: str = "lse", shape=None):
    """``lse`` (float32 ``[rows, num_heads]``, or ``shape``, last dim contiguous) checked, or
    allocated when ``return_lse`` and None; ``return_lse`` must be a bool and ``lse`` needs it."""
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse: expected a bool, got {type(return_lse).__name__}")
    shape = shape if shape is not None else (rows, num_heads)
    if lse is None:
        return torch.empty(shape, dtype=torch.float32, device=device) if return_lse else None
    if not return_lse:
        raise ValueError(f"{name}: given without return_lse=True")
    check_tensor(lse, name, dtypes=(torch.float32,), device=device, contiguous_last=True)
    check_shape(lse, name, shape)
    return lse


_LENGTH_DTYPES = (torch.int32, torch.uint32)


def check_seq_lens(seq_lens, name: str, batch: int, device) -> torch.Tensor:
    check_tensor(seq_lens, name, dtypes=_LENGTH_DTYPES, device=device)
    if seq_lens.numel() != batch:
        raise ValueError(f"{name}: expected {batch} lengths (one per request), got shape {list(seq_lens.shape)}")
    return seq_lens if seq_lens.dim() == 1 else seq_lens.reshape(batch)


def _kernels_interpreted() -> bool:
    """Whether kernel launches run in Triton's interpreter (a test faking a GPU under
    ``TRITON_INTERPRET=1`` replaces this)."""
    return _env.triton_interpret()


def check_interpretable(*named) -> None:
    """``(name, dtype)`` pairs of the caches whose dtype the kernels compute in, checked before a
    launch: under Triton's interpreter (``TRITON_INTERPRET=1``) none may be bfloat16. The
    interpreter runs kernels with numpy, which has no bfloat16: products of bfloat16 operands come
    out off by orders of magnitude without a word. Conversions are right, so a bfloat16 query over
    an fp8 or NVFP4 cache (float16 operands) and bfloat16 outputs pass. See
    ``lab/notes/hardening.md``, "Hardening: Triton's interpreter and bfloat16"."""
    if not _kernels_interpreted():
        return
    for name, dtype in named:
        if dtype == torch.bfloat16:
            raise TypeError(
                f"{name}: expected a float16, fp8 or NVFP4 cache under Triton's interpreter (TRITON_INTERPRET=1 "
                "has no bfloat16 arithmetic: the results would be wrong), got bfloat16; convert the inputs to "
                "float16, run the reference backend (unset KVATTN_BACKEND, or KVATTN_BACKEND=reference), or use a GPU"
            )


# The fixed head of every workspace (kvattn.runtime.workspace: up to ALIGN = 16 bytes to its
# first 16-byte boundary, then COUNTER_BYTES = 16384 of merge counters); split partials and staged
# pages come after it. tests/test_workspace.py holds this to that module's constants.
MIN_WORKSPACE_BYTES = 16 + 16384


def check_workspace(workspace, name: str, device, minimum: int = MIN_WORKSPACE_BYTES) -> torch.Tensor:
    """A contiguous uint8 buffer on ``device`` of at least ``minimum`` bytes: below the workspace's
    fixed head nothing of a call fits, so a smaller buffer is a mistake (a size in elements of
    another dtype, a placeholder) on every device. Above it a workspace smaller than
    :func:`kvattn.workspace_size` gives the same results, more slowly (docs/semantics.md,
    "Workspace")."""
    check_tensor(workspace, name, dtypes=(torch.uint8,), device=device)
    if not workspace.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous buffer, got strides {tuple(workspace.stride())}")
    if workspace.numel() < minimum:
        raise ValueError(f"{name}: expected at least {minimum} bytes (the workspace's fixed head; "
                         f"kvattn.workspace_size(...) gives the bytes a call can use), got {workspace.numel()}")
    return workspace


# ---------------------------------------------------------------------------------------------
# swapped arguments
# ---------------------------------------------------------------------------------------------
def _kind(dtype: torch.dtype) -> str:
    if dtype == torch.uint8:
        return "byte"
    if dtype in (torch.uint16, torch.uint32, torch.uint64):
        return "uint"
    return "float" if dtype.is_floating_point else "int"


def looks(kinds: str, ndims: tuple, pair_ndims: tuple = ()) -> Callable[[object], bool]:
    """What an argument looks like, for :func:`hint_swaps`: a tensor of a dtype kind in ``kinds``
    (space-separated: ``"float"``, ``"int"`` signed, ``"uint"`` unsigned but uint8, ``"byte"``
    uint8) with a rank in ``ndims``, or a pair of such tensors of a rank in ``pair_ndims``."""
    allowed = kinds.split()

    def match(x) -> bool:
        if isinstance(x, (tuple, list)):
            return len(x) == 2 and all(isinstance(t, torch.Tensor) and t.dim() in pair_ndims and
                                       _kind(t.dtype) in allowed for t in x)
        return isinstance(x, torch.Tensor) and x.dim() in ndims and _kind(x.dtype) in allowed

    return match


def _swap_hint(message: str, bound: dict, shapes: dict) -> str | None:
    name = message.split(":", 1)[0]
    if name not in shapes or name not in bound:
        return None
    given, like = bound[name], shapes[name]
    if like(given):
        return None  # (what was given looks right: the error is about something else)
    others = [o for o, o_like in shapes.items()
              if o != name and o in bound and o_like(given) and like(bound[o])]
    if len(others) != 1:
        return None
    return f" ({name} got what looks like {others[0]}, and {others[0]} what looks like {name}: are they swapped?)"


def hint_swaps(**shapes: Callable[[object], bool]):
    """Decorate a function whose errors name its arguments (``"name: ..."``): an error about an
    argument that does not look as it should (``shapes[name]``, see :func:`looks`) while exactly
    one other argument looks like it, and it like that one, gets a hint that the two are swapped.
    Costs nothing until an error: the hint is worked out then."""

    def wrap(fn):
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except (TypeError, ValueError) as error:
                if len(error.args) == 1 and isinstance(error.args[0], str):
                    try:
                        hint = _swap_hint(error.args[0], signature.bind(*args, **kwargs).arguments, shapes)
                    except TypeError:  # (arguments that do not bind: the error is about that)
                        hint = None
                    if hint is not None:
                        error.args = (error.args[0] + hint,)
                raise

        return call

    return wrap


# ---------------------------------------------------------------------------------------------
# views of long-lived tensors
# ---------------------------------------------------------------------------------------------
# (id(base), tag) -> (weakref to base, base metadata, tensors). A KV cache or a workspace is one
# tensor for the life of a serving engine, and each view of it costs a microsecond or two a call.
_ALIASES: dict[tuple, tuple] = {}
_MAX_ALIASES = 64


def _drop_aliases(key: tuple, ref: weakref.ref) -> None:
    entry = _ALIASES.get(key)
    if entry is not None and entry[0] is ref:
        del _ALIASES[key]


def alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor over ``t``'s memory that is not a view: it holds the storage but not ``t``'s base
    tensor (a view keeps its base object alive, so a weak reference to the base would never die)."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), t.storage_offset(), t.shape,
                                                               t.stride())


def cached_aliases(base: torch.Tensor, tag: tuple, make: Callable[..., T], *args) -> T:
    """``make(base, *args)`` -- views of ``base`` (one tensor or a tuple), a function of ``base``'s
    metadata and ``args`` only, ``tag`` naming ``make`` -- kept for ``base`` as :func:`alias` es.

    An entry is reused while ``base`` is the same object with the same data pointer, shape,
    strides and dtype, in the same inference mode, and is dropped with ``base``. Nothing is kept
    for a tensor subclass, for a base that requires grad (aliases are not autograd views of it),
    or while ``torch.compile`` traces.
    """
    if torch.compiler.is_compiling():
        return make(base, *args)
    key = (id(base), tag, args)
    entry = _ALIASES.get(key)
    if entry is not None:  # then ``base`` was a plain tensor with a data pointer and strides
        ref, meta, kept = entry
        if ref() is base and not base.requires_grad and meta == (
            base.data_ptr(), base.shape, base.stride(), base.dtype, torch.is_inference_mode_enabled()
        ):
            return kept
    if type(base) is not torch.Tensor or base.requires_grad:
        return make(base, *args)
    try:
        meta = (base.data_ptr(), base.shape, base.stride(), base.dtype, torch.is_inference_mode_enabled())
    except RuntimeError:  # no data pointer or strides (sparse, ...): nothing to key on
        return make(base, *args)
    made = make(base, *args)
    try:
        kept = alias(made) if isinstance(made, torch.Tensor) else tuple(map(alias, made))
    except RuntimeError:  # a tensor set_ cannot alias: use the views uncached
        return made
    if len(_ALIASES) >= _MAX_ALIASES:
        _ALIASES.clear()
    _ALIASES[key] = (weakref.ref(base, functools.partial(_drop_aliases, key)), meta, kept)
    return kept


# ---------------------------------------------------------------------------------------------
# scales
# ---------------------------------------------------------------------------------------------
class Scale(NamedTuple):
    """``factor * tensor[0]`` (``tensor`` None means 1): a host float and an optional device value.

    Kernels take ``factor`` as an argument and read ``tensor`` on the device, so neither form makes
    the host wait. (A named tuple: immutable, and made in half the time of a frozen dataclass.)
    """

    factor: float = 1.0
    tensor: torch.Tensor | None = None

    def times(self, other: "Scale | float") -> "Scale":
        if not isinstance(other, Scale):
            other = float(other)
            return self if other == 1.0 else Scale(self.factor * other, self.tensor)  # x * 1.0 == x
        if self.tensor is not None and other.tensor is not None:
            # Two device factors: their product is one more tiny device op (no sync).
            return Scale(self.factor * other.factor, (self.tensor.reshape(1) * other.tensor.reshape(1)))
        return Scale(self.factor * other.factor, self.tensor if self.tensor is not None else other.tensor)

    def value(self) -> torch.Tensor | float:
        """For the reference backend: a float, or a 0-d float32 tensor."""
        if self.tensor is None:
            return self.factor
        return self.tensor.reshape(()).to(torch.float32) * self.factor


_UNIT = Scale(1.0)


def to_scale(value, name: str, device, *, allow_none_as: float | None = None) -> Scale:
    if type(value) is float and math.isfinite(value):  # the common case, first
        return _UNIT if value == 1.0 else Scale(value)
    if value is None:
        if allow_none_as is None:
            raise TypeError(f"{name}: expected a float or a one-element float32 tensor, got None")
        return Scale(float(allow_none_as))
    if isinstance(value, torch.Tensor):
        check_tensor(value, name, dtypes=(torch.float32,))
        if value.numel() != 1:
            raise ValueError(f"{name}: expected a one-element tensor, got shape {list(value.shape)}")
        if value.device != device:
            raise ValueError(f"{name}: expected a tensor on {device} (the query's device), got one on {value.device}")
        return Scale(1.0, value if value.dim() == 1 else value.reshape(1))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a float or a one-element float32 tensor, got {type(value).__name__}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name}: expected a finite value, got {value}")
    return Scale(float(value))


# ---------------------------------------------------------------------------------------------
# paged caches
# ---------------------------------------------------------------------------------------------
@dataclass(slots=True)
class PagedKV:
    """K and V pages as ``[num_pages, page_size, num_kv_heads, stored_dim]`` strided views.

    ``stored_dim`` is ``head_dim`` for fp16/bf16/fp8 caches and ``head_dim / 2`` for NVFP4 (uint8,
    two codes a byte; ``k_sf``/``v_sf`` then hold the e4m3 block scales
    ``[num_pages, page_size, num_kv_heads, head_dim / 16]``). ``k_table``/``v_table`` are int32
    ``[batch, pages_per_seq]`` (the same tensor when K and V share page ids). MLA's V is a view of
    the first ``v_dim`` columns of K.
    """

    k: torch.Tensor
    v: torch.Tensor
    k_table: torch.Tensor
    v_table: torch.Tensor
    head_dim: int
    v_dim: int
    k_sf: torch.Tensor | None = None
    v_sf: torch.Tensor | None = None

    @property
    def kv_format(self) -> str:
        """The cache format's name (``"float16"``, ``"bfloat16"``, ``"fp8"``, ``"nvfp4"``: the format
        table, :mod:`kvattn._formats_table`)."""
        return BY_DTYPE[self.k.dtype].name

    @property
    def page_size(self) -> int:
        return self.k.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.k.shape[2]

    @property
    def num_pages(self) -> int:
        return self.k.shape[0]

    @property
    def pages_per_seq(self) -> int:
        return self.k_table.shape[1]

    @property
    def capacity(self) -> int:
        """Tokens a request can hold: pages_per_seq * page_size."""
        return self.pages_per_seq * self.page_size


def _to_nhd(pages: torch.Tensor, layout: str) -> torch.Tensor:
    """``[P, page, H, D]`` view of a 4-D page tensor in ``layout``."""
    return pages if layout == "NHD" else pages.transpose(1, 2)


def _planes(kv_cache: torch.Tensor, layout: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of a ``[P, 2 or 1, ...]`` cache (as NHD when ``layout`` is given)."""
    k, v = kv_cache.unbind(1) if kv_cache.shape[1] == 2 else (kv_cache[:, 0],) * 2
    return (k, v) if layout is None else (_to_nhd(k, layout), _to_nhd(v, layout))


def _split_kv(kv_cache, name: str, layout: str | None = None):
    """``(k, v)`` 4-D page tensors from a tuple or from one 5-D tensor with a size-2/1 plane; as
    NHD views when ``layout`` is given."""
    if isinstance(kv_cache, (tuple, list)):
        if len(kv_cache) != 2:
            raise ValueError(f"{name}: expected a (k_cache, v_cache) pair, got {len(kv_cache)} tensors")
        k, v = kv_cache
        check_tensor(k, f"{name}[0]", ndim=4)
        check_tensor(v, f"{name}[1]", ndim=4)
        if layout is None or layout == "NHD":
            return k, v
        return cached_aliases(k, ("nhd",), _to_nhd, layout), cached_aliases(v, ("nhd",), _to_nhd, layout)
    check_tensor(kv_cache, name, ndim=5)
    if kv_cache.shape[1] not in (1, 2):
        raise ValueError(
            f"{name}: expected dim 1 of size 2 (K, V) or 1 (K = V) after the page dim, got shape {list(kv_cache.shape)}"
        )
    return cached_aliases(kv_cache, ("planes",), _planes, layout)


def paged_kv_from_cache(
    kv_cache,
    block_tables: torch.Tensor,
    kv_layout: str,
    head_dim: int,
    device,
    *,
    kv_sf=None,
    name: str = "kv_cache",
    table_name: str = "block_tables",
    sf_name: str = "kv_cache_sf",
    split_tables: bool = False,
    allowed_dtypes=DTYPES,
    query_dtype=None,
    query_name: str = "query",
) -> PagedKV:
    """Normalise the decode/prefill cache forms (tuple or 5-D, NHD or HND) into a :class:`PagedKV`.

    ``allowed_dtypes``: the cache dtypes accepted, the format table's by default. A dtype outside
    the table (the append's float32 caches, :mod:`kvattn.cache`) is stored as it is: last dim
    ``head_dim``, no block scales. ``query_dtype``: a 16-bit cache of the other 16-bit dtype is
    reported against ``query_name`` (:func:`check_half_match`)."""
    layout = check_layout(kv_layout)
    k, v = _split_kv(kv_cache, name, layout)  # as NHD: the checks below read no layout-dependent dim
    # Planes of one 5-D tensor share its dtype, device and last dim: checking K checks V.
    for t in (k, v) if isinstance(kv_cache, (tuple, list)) else (k,):
        if query_dtype is not None and t is k and t.dtype not in allowed_dtypes:  # (V differing from K: K vs V)
            check_half_match(query_dtype, query_name, t.dtype, name)
        check_tensor(t, name, dtypes=allowed_dtypes, device=device, contiguous_last=True)
    dtype, shape = k.dtype, k.shape
    if dtype != v.dtype:
        raise TypeError(f"{name}: expected K and V of one dtype, got {dtype} and {v.dtype}")
    if shape != v.shape:
        raise ValueError(f"{name}: expected K and V pages of one shape, got {list(shape)} and {list(v.shape)} (as NHD)")
    fmt = BY_DTYPE.get(dtype)
    stored = fmt.stored_dim(head_dim) if fmt is not None else head_dim
    if shape[3] != stored:
        per = head_dim // max(stored, 1)
        what = f"head_dim = {head_dim}" if per == 1 else (
            f"head_dim / {per} = {stored} ({fmt.name.upper()} packs {per} values a byte)")
        raise ValueError(f"{name}: expected a last dim of {what}, got {shape[3]}")

    check_tensor(block_tables, table_name, dtypes=(torch.int32,), device=device)
    if split_tables:
        if block_tables.dim() != 3 or block_tables.shape[1] != 2:
            raise ValueError(
                f"{table_name}: expected shape [batch, 2, pages_per_seq] with uses_shared_paged_kv_idx=False, "
                f"got {list(block_tables.shape)}"
            )
        k_table, v_table = block_tables[:, 0], block_tables[:, 1]
    else:
        if block_tables.dim() != 2:
            raise ValueError(f"{table_name}: expected shape [batch, pages_per_seq], got {list(block_tables.shape)}")
        k_table = v_table = block_tables

    k_sf = v_sf = None
    if fmt is not None and fmt.scale_block:
        label = f"{fmt.name.upper()}"
        if head_dim % fmt.scale_block:
            raise ValueError(f"{name}: {label} needs head_dim a multiple of {fmt.scale_block}, got {head_dim}")
        if kv_sf is None:
            raise ValueError(f"{sf_name}: expected {label} block scales with a {_dtype_names((dtype,))} ({label}) cache, "
                             f"got None")
        k_sf, v_sf = _split_kv(kv_sf, sf_name, layout)
        for t in (k_sf, v_sf):
            check_tensor(t, sf_name, dtypes=(fmt.scale_dtype,), device=device, contiguous_last=True)
        want = (*shape[:3], head_dim // fmt.scale_block)
        for t in (k_sf, v_sf):
            if tuple(t.shape) != want:
                raise ValueError(f"{sf_name}: expected block scales of shape {list(want)} (as NHD), got {list(t.shape)}")
    elif kv_sf is not None:
        scaled = ", ".join(f"{f.name.upper()} ({_dtype_names((f.dtype,))})" for f in FORMATS if f.scale_block)
        raise ValueError(f"{sf_name}: block scales are only for {scaled} caches, got a {dtype} cache")
    return PagedKV(k, v, k_table, v_table, head_dim, head_dim, k_sf, v_sf)


def check_paged_heads(hq: int, query_name: str, kv: PagedKV, kv_cache, kv_layout: str, name: str = "kv_cache") -> int:
    """:func:`check_query_heads` of a paged cache from :func:`paged_kv_from_cache`, its messages
    naming the cache's shape as given and, when only the other layout fits, ``kv_layout``."""
    hkv = kv.num_kv_heads
    if hq >= 1 and hkv >= 1 and not hq % hkv:
        return hq // hkv
    first = kv_cache[0] if isinstance(kv_cache, (tuple, list)) else kv_cache
    # The other layout swaps the NHD view's page_size and head dims.
    return check_query_heads(hq, query_name, hkv, kv_name=name, kv_shape=first.shape, layout=check_layout(kv_layout),
                             other_heads=kv.page_size)


def _lengths_as_read(seq_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(as_read, given)`` int64 CPU ``[B]``: the lengths as the kernels read them (int32; a uint32
    length of 2^31 or more is negative) and as given."""
    flat = seq_lens.reshape(-1)
    given = flat.to(torch.int64).cpu()
    as_read = (flat.view(torch.int32) if flat.dtype == torch.uint32 else flat).to(torch.int64).cpu()
    return as_read, given


def _first(bad: torch.Tensor) -> int:
    return int(bad.nonzero()[0, 0])


def _debug_check_cum(cum: torch.Tensor, name: str, want_last: int | None, what: str) -> torch.Tensor:
    """``cum`` (int64 CPU ``[B + 1]``) starts at 0, never decreases and ends at ``want_last``."""
    if cum.numel() and int(cum[0]) != 0:
        raise ValueError(f"{name}: expected a first entry of 0, got {int(cum[0])}")
    steps = cum[1:] - cum[:-1]
    if bool((steps < 0).any()):
        b = _first(steps < 0)
        raise ValueError(f"{name}: expected non-decreasing offsets, got {int(cum[b])} then {int(cum[b + 1])} "
                         f"(entries {b}, {b + 1})")
    if want_last is not None and cum.numel() and int(cum[-1]) != want_last:
        raise ValueError(f"{name}: expected a last entry of {want_last} ({what}), got {int(cum[-1])}")
    return steps


def debug_check_pages(
    kv: PagedKV,
    seq_lens: torch.Tensor,
    name: str = "block_tables",
    *,
    max_len: int | None = None,
    max_len_name: str = "max_seq_len",
    q_len: int = 1,
    cum_q: torch.Tensor | None = None,
    num_rows: int | None = None,
    max_q_len: int | None = None,
    cum_kv: torch.Tensor | None = None,
    scales=(),
    pool_name: str | None = None,
) -> None:
    """Device-value checks: by default for CPU tensors only, where reading a value costs no wait;
    ``KVATTN_DEBUG=1`` runs them for CUDA tensors too (they then synchronise), ``KVATTN_DEBUG=0``
    nowhere. Skipped while ``torch.compile`` traces, unless ``KVATTN_DEBUG=1`` asks for them
    (data-dependent checks break the graph).

    Lengths: none below 0 (as the kernels read them: int32), none past the table's capacity or the
    host bound ``max_len`` (named ``max_len_name``), none shorter than the request's query rows
    (``q_len`` rows each, or prefill's ``cum_q``, whose offsets must start at 0, never decrease and
    end at ``num_rows``; their longest run at most ``max_q_len``); ``cum_kv``: the prefix sums of
    the lengths. Every page a request uses must be a valid page id (``pool_name``: the argument
    whose size bounds them, for the message). ``scales``: ``(name, tensor or None)`` pairs, finite.
    """
    forced = _env.debug_checks()
    if not forced and (forced is False or seq_lens.device.type != "cpu" or torch.compiler.is_compiling()):
        return
    lens, given = _lengths_as_read(seq_lens)
    if bool((lens < 0).any()):
        b = _first(lens < 0)
        read = "" if int(given[b]) == int(lens[b]) else f" (uint32 {int(given[b])}, read as int32)"
        raise ValueError(f"seq_lens: expected lengths >= 0, got {int(lens[b])}{read} for request {b}")
    cap = kv.capacity
    if bool((lens > cap).any()):
        raise ValueError(f"seq_lens: a length exceeds the page table's capacity {cap} (max given {int(lens.max())})")
    if max_len is not None and bool((lens > max_len).any()):
        b = int(lens.argmax())
        raise ValueError(f"{max_len_name}: expected at least the longest of seq_lens, {int(lens[b])} (request {b}), "
                         f"got {max_len}")
    if cum_q is not None:
        rows = _debug_check_cum(cum_q.to(torch.int64).cpu().reshape(-1), "cum_seq_lens_q", num_rows,
                                "the query's rows")
        if max_q_len is not None and bool((rows > max_q_len).any()):
            b = int(rows.argmax())
            raise ValueError(f"max_q_len: expected at least the longest run of cum_seq_lens_q, {int(rows[b])} "
                             f"(request {b}), got {max_q_len}")
        short = lens < rows
        if bool(short.any()):
            b = _first(short)
            raise ValueError(f"seq_lens: request {b} has length {int(lens[b])}, fewer than its {int(rows[b])} query "
                             f"rows (a length counts the request's new tokens)")
    elif q_len > 1:
        short = (lens > 0) & (lens < q_len)
        if bool(short.any()):
            b = _first(short)
            raise ValueError(f"seq_lens: request {b} has length {int(lens[b])}, fewer than its q_len_per_req={q_len} "
                             f"query tokens (a length counts them; 0 marks an empty request)")
    if cum_kv is not None:
        ckv = cum_kv.to(torch.int64).cpu().reshape(-1)
        _debug_check_cum(ckv, "cum_seq_lens_kv", None, "")
        want = torch.cat((lens.new_zeros(1), lens.cumsum(0)))
        if ckv.shape != want.shape or bool((ckv != want).any()):
            b = _first(ckv != want)
            raise ValueError(f"cum_seq_lens_kv: expected the prefix sums of seq_lens, {want.tolist()}, got "
                             f"{ckv.tolist()} (first difference at entry {b})")
    pages_needed = (lens + kv.page_size - 1) // kv.page_size
    cols = torch.arange(kv.pages_per_seq)
    pool = f" ({pool_name} holds {kv.num_pages} pages)" if pool_name else ""
    for table in {id(kv.k_table): kv.k_table, id(kv.v_table): kv.v_table}.values():
        t = table.to(torch.int64).cpu()
        used = cols.unsqueeze(0) < pages_needed.unsqueeze(1)
        bad = used & ((t < 0) | (t >= kv.num_pages))
        if bool(bad.any()):
            b, p = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"{name}: request {b} page slot {p} holds page id {int(t[b, p])}, outside [0, {kv.num_pages}){pool}"
            )
    for scale_name, tensor in scales:
        if tensor is not None and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{scale_name}: expected a finite value, got {tensor.reshape(-1).tolist()}")


def check_max_seq_len(max_seq_len, name: str, kv: PagedKV) -> int:
    m = check_int(max_seq_len, name, minimum=0)
    if m > kv.capacity:
        raise ValueError(
            f"{name}: expected at most block_tables.shape[1] * page_size = {kv.capacity}, got {m}"
        )
    return m
