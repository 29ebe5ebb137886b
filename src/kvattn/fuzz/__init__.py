"""Differential fuzzing of the five public functions (``kvattn fuzz``; docs/fuzzing.md).

Random *legal* calls are drawn from a seed (:mod:`~kvattn.fuzz.draws`: one table of argument
drawers per function), built into tensors (:mod:`~kvattn.fuzz.calls`), run in one of four modes
(:mod:`~kvattn.fuzz.modes`: plain, CUDA graph, determinism, batch-invariant) and compared with the
float64 formulation :mod:`kvattn.dense` (:mod:`~kvattn.fuzz.oracle`); a failing call is shrunk and
printed as a Python snippet (:mod:`~kvattn.fuzz.shrink`) that calls :func:`replay`. On a GPU most
calls reuse a kernel class already drawn with new runtime values (:mod:`~kvattn.fuzz.corpus`), and
:mod:`~kvattn.fuzz.jobs` runs several worker processes and merges their reports (``--jobs``).

Example
-------
>>> import torch
>>> from kvattn.fuzz import fuzz
>>> report = fuzz(torch.device("cpu"), calls=5, seed=1, only=("batch_decode",), quiet=True)
>>> report.summary
'fuzz: 5 calls, 0 mismatches, 0 errors'
"""

from __future__ import annotations

import torch

from .calls import build
from .draws import FUNCTIONS, Env, draw
from .modes import MODES, run_spec
from .runner import Report, fuzz, print_report

__all__ = ["FUNCTIONS", "MODES", "Env", "Report", "build", "draw", "fuzz", "print_report", "replay", "run_spec"]


def replay(spec: dict, mode: str = "plain", device: str = "cpu", mode_seed: int = 0) -> dict:
    """Run one spec as the fuzzer did; raise AssertionError if it still fails.

    Parameters
    ----------
    spec : dict
        A call as :func:`kvattn.fuzz.draws.draw` makes it (the ``spec`` of a failure in the JSON).
    mode : {"plain", "graph", "determinism", "invariant"}
    device : str
    mode_seed : int
        The mode's random choices (the request singled out, the graph's new lengths).

    Returns
    -------
    dict
        The outcome (``result`` "ok"), when the call passes.

    Examples
    --------
    >>> import random
    >>> from kvattn.fuzz import Env, draw, replay
    >>> spec = draw("single_decode", random.Random(0), Env())
    >>> outcome = replay(spec, mode="determinism")
    single_decode (determinism): ok
    """
    outcome = run_spec(spec, mode, torch.device(device), mode_seed)
    print(f"{spec['function']} ({mode}): {outcome['result']}" + (f": {outcome['why']}" if outcome["why"] else ""))
    if outcome["result"] != "ok":
        raise AssertionError(outcome["why"])
    return outcome
