"""``examples/transformers_generate.py`` runs as its docstring says (a random-initialised model, no
download): both implementations generate, their tokens/s are printed, their teacher-forced logits
agree within the dtype's tolerance, and the greedy tokens of the two are compared (float16, the
default, where a random model's tokens match). A small run on the CPU tier (the reference backend)
and on a GPU (the kernels); transformers' continuous-batching warnings are not printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def test_example_generates_through_both_implementations():
    env = {k: v for k, v in os.environ.items() if k not in ("KVATTN_BACKEND",)}
    got = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "transformers_generate.py"), "--requests", "2", "--prompt-len", "16",
         "--max-new-tokens", "4"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert got.returncode == 0, got.stdout[-2000:] + got.stderr[-4000:]
    rates = re.findall(r"^(kvattn|transformers \(\w+\))\s+([\d.]+) generated tokens/s", got.stdout, re.M)
    assert [name for name, _ in rates][:1] == ["kvattn"] and len(rates) == 2, got.stdout
    assert all(float(rate) > 0 for _, rate in rates)
    logits = re.search(r"^teacher-forced logits, kvattn vs transformers \(\w+\): max relative difference per step "
                       r"([\d.e+-]+) .*, within the float16 tolerance 1e-02; same next token at (\d+) / 8 steps$",
                       got.stdout, re.M)
    assert logits and float(logits.group(1)) < 1e-2, got.stdout
    match = re.search(r"^requests whose greedy tokens match transformers \(\w+\): (\d+) / 2$", got.stdout, re.M)
    assert match, got.stdout
    assert "ContinuousBatchingLogger" not in got.stdout + got.stderr
