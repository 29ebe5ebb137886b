"""One declaration per torch op: its flat argument list, written once.

A kernel family's op (``torch.ops.kvattn.<name>``) takes a flat list of tensors, ints, floats,
bools and strings. :func:`declare_op` builds, from one ordered tuple of :class:`Arg` (name,
annotation, default, written or not) and the family's plan launcher:

- the ``torch.library.custom_op``: its schema inferred from a signature made of the declaration,
  its ``mutates_args`` the arguments marked ``mutated``, its kernel the launcher;
- its fake implementation (None for an op that only writes into its arguments);
- :attr:`DeclaredOp.entry`, the function the public module calls: the registered op while
  ``torch.compile`` traces (which needs it), else the launcher itself.

An argument may name its ``source``, an attribute of one of the entry's parameters
(``Arg("k", Tensor, source="kv.k")``: the entry takes ``kv``, a ``PagedKV``, and hands ``kv.k`` to
the op and the launcher). The entry's parameters are then the declared arguments without a source
and the sources' roots, in the order of their first declaration, so the public module passes its
normalised values (``PagedKV``, ``Scale``) as they are and the unpacking costs no call of its own:
from the public function the launch is three calls away (docs/extending.md, "Layers").

The declared names are the launcher's keywords, checked at import (a name the launcher lacks, a
parameter it requires that is not declared, or a default other than the launcher's raises a
TypeError naming it), so an argument added to a family is one line of its declaration; the entry
calls the launcher with them. ``docs/extending.md`` lists the places an argument touches.

Eager calls skip the dispatcher: a mutating custom op costs tens of microseconds of Python per
call (argument defaults, autograd and in-place bookkeeping), more than a whole decode kernel at
small batch. The entry is generated at import as a plain function of the declared parameters (in
the declaration's order, defaults last), so a call binds its arguments as a hand-written function
would: nothing is looked up, bound or copied per call beyond that. Binding many keywords costs
microseconds of host time in CPython, so the public modules pass them positionally, in the entry's
order, and the entry passes the launcher's leading parameters positionally too
(``tests/runtime/test_opdecl.py`` checks every family's routing by name from its entry,
``tests/test_entry_routing.py`` from the public functions).

The schema has no defaults: the traced entry passes every argument, a declared default filling one
the caller left out. (torch 2.11's in-place bookkeeping looks a mutated argument up by its position
among the boxed arguments, from which trailing arguments equal to their default are dropped; with
no defaults nothing is dropped. ``tests/runtime/test_op_schemas.py``.)
"""

from __future__ import annotations

import inspect
import linecache
from typing import Any, Callable, NamedTuple, Optional

import torch

REQUIRED = inspect.Parameter.empty  # an Arg's default when the caller must give it

Tensor = torch.Tensor
OptTensor = Optional[torch.Tensor]


class Arg(NamedTuple):
    """One argument of an op: ``name`` (the launcher's keyword), ``annotation`` (what the schema
    reads: ``Tensor``, ``OptTensor``, ``int``, ``Optional[int]``, ``float``, ``bool``, ``str``),
    ``default`` (the entry's, :data:`REQUIRED` for none), whether the op writes into it, and its
    ``source`` (``"parameter.attribute"``: the entry takes ``parameter`` and reads the value from
    it; None: the entry takes the value itself)."""

    name: str
    annotation: Any
    default: Any = REQUIRED
    mutated: bool = False
    source: Optional[str] = None


# The six launcher arguments a ``PagedKV`` parameter ``kv`` (:class:`kvattn._inputs.PagedKV`) gives
# an op that reads K and V through their own tables (decode, prefill); declared here once.
PAGED_KV_ARGS = (
    Arg("k", Tensor, source="kv.k"),  # [P, page, Hkv, Ds] NHD view of the K pages
    Arg("v", Tensor, source="kv.v"),
    Arg("k_table", Tensor, source="kv.k_table"),  # [B, pages_per_seq] int32
    Arg("v_table", Tensor, source="kv.v_table"),
    Arg("k_sf", OptTensor, source="kv.k_sf"),  # NVFP4 block scales [P, page, Hkv, D/16], or None
    Arg("v_sf", OptTensor, source="kv.v_sf"),
)


def _no_outputs(*args, **kwargs) -> None:
    return None


class DeclaredOp(NamedTuple):
    """What :func:`declare_op` builds: the registered ``op`` (``torch.library.custom_op``), the
    ``entry`` the family calls (the op's arguments by position or name), and the declaration
    ``args``."""

    op: Any
    entry: Callable[..., Any]
    args: tuple


def _check_launcher(qualname: str, launch: Callable, args: tuple, fixed: dict) -> None:
    """Every declared (and fixed) name a keyword of ``launch``, with the same default where it has
    one (the eager entry hands the launcher every argument, the declared default filling one the
    caller left out; a launcher called elsewhere keeps its own: they must agree), and every
    parameter ``launch`` requires declared."""
    params = inspect.signature(launch).parameters
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    declared = {a.name: a.default for a in args}
    declared.update(fixed)
    for name, default in declared.items():
        p = params.get(name)
        if p is None:
            if open_ended:
                continue
            raise TypeError(f"{qualname}: argument {name!r} is not a keyword of the launcher "
                            f"{getattr(launch, '__name__', launch)!r}; expected one of {sorted(params)}")
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL):
            raise TypeError(f"{qualname}: the launcher takes {name!r} positionally only; the entry passes keywords")
        if name not in fixed and default is not REQUIRED and p.default is not default and p.default != default:
            raise TypeError(f"{qualname}: argument {name!r} declared with default {default!r}, "
                            f"the launcher's default is {p.default!r}")
    for p in params.values():
        if p.default is p.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in declared:
            raise TypeError(f"{qualname}: the launcher's required parameter {p.name!r} is not declared")


_PREFIX = "_opdecl_"  # the generated entry's own names (no argument may start with it)


def _entry_parameters(args: tuple) -> list:
    """The entry's parameter names, in order: each argument without a source, and each source's
    root where it is first named."""
    params: list = []
    for a in args:
        name = a.name if a.source is None else a.source.split(".")[0]
        if name not in params:
            params.append(name)
    return params


def _generate(qualname: str, launch: Callable, args: tuple, fixed: dict) -> tuple[Callable, Callable, dict]:
    """``(kernel, entry, namespace)``, generated from the declaration as plain functions of the declared
    parameters, so that a call binds its arguments as a hand-written function would (a ``**``
    dict on either side of a call costs microseconds; none is built): ``kernel`` calls the
    launcher (the op's implementation, which the dispatcher calls with every argument), ``entry``
    (the parameters of :func:`_entry_parameters`, each argument read from its source) calls the op
    while ``torch.compile`` traces (every argument, positionally), else the launcher as ``kernel``
    does. The op, made from ``kernel``, goes into ``namespace`` after."""
    namespace = {f"{_PREFIX}op": None, f"{_PREFIX}launch": launch,
                 f"{_PREFIX}is_compiling": torch.compiler.is_compiling}
    params = []
    for name in _entry_parameters(args):
        default = next((a.default for a in args if a.name == name and a.source is None), REQUIRED)
        if default is REQUIRED:
            params.append(name)
        else:
            namespace[f"{_PREFIX}default_{name}"] = default
            params.append(f"{name}={_PREFIX}default_{name}")

    def launcher_call(values: dict) -> str:
        # the launcher's leading parameters positionally, in its order, as far as each is declared
        # or fixed (binding a keyword costs a search of the parameter names); the rest by keyword
        values = dict(values)
        for name, value in fixed.items():
            namespace[f"{_PREFIX}fixed_{name}"] = value
            values[name] = f"{_PREFIX}fixed_{name}"
        launch_args = []
        for p in inspect.signature(launch).parameters.values():
            if p.kind is not p.POSITIONAL_OR_KEYWORD or p.name not in values:
                break
            launch_args.append(values.pop(p.name))
        launch_args += [f"{name}={value}" for name, value in values.items()]
        return f"{_PREFIX}launch({', '.join(launch_args)})"

    sourced = {a.name: a.source or a.name for a in args}
    name = qualname.split("::")[1]
    source = (
        f"def {name}_kernel({', '.join(a.name for a in args)}):\n"
        f"    return {launcher_call({a.name: a.name for a in args})}\n"
        f"def {name}({', '.join(params)}):\n"
        f"    if {_PREFIX}is_compiling():\n"
        f"        return {_PREFIX}op({', '.join(sourced.values())})\n"
        f"    return {launcher_call(sourced)}\n"
    )
    filename = f"<kvattn op {qualname}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # (tracebacks show it)
    exec(compile(source, filename, "exec"), namespace)
    kernel, entry = namespace[f"{name}_kernel"], namespace[name]
    for f in (kernel, entry):
        f.__qualname__ = f.__name__
        f.__module__ = __name__
    entry.__doc__ = f"``torch.ops.{qualname.replace('::', '.')}`` while torch.compile traces, else the launcher."
    return kernel, entry, namespace


def declare_op(qualname: str, launch: Callable, *args: Arg, fixed: Optional[dict] = None, returns: Any = None,
               fake: Optional[Callable] = None) -> DeclaredOp:
    """Register ``qualname`` (``"kvattn::<name>"``) with the arguments ``args`` and return its
    :class:`DeclaredOp`.

    ``launch(**arguments, **fixed)`` runs the op: the family's plan launcher (``fixed``: keywords
    the op implies, e.g. ``paged=True``) or a small adapter; ``returns`` is the annotation of what
    it returns (None: the op only writes into its ``mutated`` arguments); ``fake(**arguments)``
    makes the outputs for ``torch.compile`` (needed only when ``returns`` is not None).
    """
    fixed = dict(fixed or {})
    for a in args:
        if not isinstance(a, Arg):
            raise TypeError(f"{qualname}: expected Arg declarations, got {a!r}")
    names = tuple(a.name for a in args)
    for a in args:
        if not a.name.isidentifier() or a.name.startswith(_PREFIX):
            raise TypeError(f"{qualname}: argument name {a.name!r} is not a plain identifier")
    if len(set(names) | set(fixed)) != len(names) + len(fixed):
        raise TypeError(f"{qualname}: an argument is declared twice: {names}, fixed {sorted(fixed)}")
    roots = set()
    for a in args:
        if a.source is None:
            continue
        parts = a.source.split(".")
        if len(parts) != 2 or not all(p.isidentifier() for p in parts) or parts[0].startswith(_PREFIX):
            raise TypeError(f"{qualname}: argument {a.name!r}: expected a source 'parameter.attribute', "
                            f"got {a.source!r}")
        if a.default is not REQUIRED:
            raise TypeError(f"{qualname}: argument {a.name!r} has a source ({a.source!r}) and a default; "
                            "expected one of the two")
        roots.add(parts[0])
    clash = roots & {a.name for a in args if a.source is None}
    if clash:
        raise TypeError(f"{qualname}: {sorted(clash)[0]!r} is both a source's parameter and an argument")
    given = [a.default is not REQUIRED for a in args]
    if given != sorted(given):
        raise TypeError(f"{qualname}: an argument without a default follows one with a default: {names}")
    if returns is not None and fake is None:
        raise TypeError(f"{qualname}: an op that returns {returns!r} needs a fake to make its outputs")
    _check_launcher(qualname, launch, args, fixed)

    signature = inspect.Signature(
        [inspect.Parameter(a.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=a.annotation) for a in args],
        return_annotation=returns,
    )

    def fake_kernel(*values, **keywords):
        return fake(**dict(zip(names, values)), **keywords)

    kernel, entry, namespace = _generate(qualname, launch, args, fixed)
    kernel.__signature__ = signature  # (what the schema is inferred from)
    op = torch.library.custom_op(qualname, kernel, mutates_args=tuple(a.name for a in args if a.mutated))
    op.register_fake(fake_kernel if fake is not None else _no_outputs)
    namespace[f"{_PREFIX}op"] = op
    return DeclaredOp(op, entry, args)
