"""The small checks at the API boundary: one argument each (a tensor's dtype, rank, device and
strides; an int, a layout, a window, sinks, head counts and dims, output buffers, lengths, the
workspace), and the interpreter's bfloat16 refusal. They read metadata only: no host sync."""

from __future__ import annotations

import torch

from ..runtime import env as _env


HALF_DTYPES = (torch.float16, torch.bfloat16)
LAYOUTS = ("NHD", "HND")
DECODE_HEAD_DIMS = (64, 128, 256)  # head dims of the decode kernels (batch, xqa and single decode)


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
