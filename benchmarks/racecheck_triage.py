"""Sort the hazards of a racecheck log (``sanitize.sh``'s ``racecheck.log``) by where they are.

compute-sanitizer's racecheck reports each hazard as a block: ``Race reported between <access> at
<kernel>+<offset> in <file>:<line>`` and one or more ``and <access> at ...`` lines. Three kinds:

* **Triton's partition prologue**: every access of the block is on a kernel's ``def`` line or on its
  ``gl.warp_specialize(`` call (or on the ``if`` / ``else`` line that opens the call's branch, where
  Triton puts the call's location when the branch's condition is a constexpr function's value). Those lines hold no kvattn memory access: they are the code Triton
  generates to start and stop the partitions (worker warps wait on a CTA barrier, read their
  partition's state byte from shared memory and loop; the default partition writes the states).
  The calibration kernels, which hold nothing but one exchange, get them too
  (lab/notes/robustness.md "compute-sanitizer over every kernel family").
* **calibration**: any access in ``sanitize_calibration.py``: the tool's own behaviour measured on
  exchanges ordered by construction (``exchange_rows`` is flagged on purpose).
* **kvattn**: everything else: a race in kvattn's kernels until shown otherwise.

The exit status is 1 when a kvattn hazard is found (or the log holds no racecheck summary), so
``sanitize.sh`` fails on them and only on them; the counts of the other two kinds are printed
beside racecheck's own total.

Usage: ``python benchmarks/racecheck_triage.py out/racecheck.log [SOURCE_ROOT ...]``
(default roots: ``src`` and ``benchmarks``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_BLOCK_START = re.compile(r"Race reported between .* at (\w+)\+0x[0-9a-f?]+ in ([\w.]+):(\d+)")
_AND = re.compile(r"^=+\s+and .* at (\w+)\+0x[0-9a-f?]+ in ([\w.]+):(\d+)")
_SUMMARY = re.compile(r"RACECHECK SUMMARY")
CALIBRATION = "sanitize_calibration.py"


def blocks(text: str) -> list[list[tuple[str, str, int]]]:
    """Each hazard block's accesses as ``(kernel, file name, line)``."""
    out: list[list[tuple[str, str, int]]] = []
    for line in text.splitlines():
        m = _BLOCK_START.search(line)
        if m:
            out.append([(m.group(1), m.group(2), int(m.group(3)))])
            continue
        m = _AND.search(line)
        if m and out:
            out[-1].append((m.group(1), m.group(2), int(m.group(3))))
    return out


class Sources:
    """Source lines by (file name, kernel): the file of that name that defines the kernel."""

    def __init__(self, roots: list[Path]):
        self.files: dict[str, list[Path]] = {}
        for root in roots:
            for path in root.rglob("*.py"):
                self.files.setdefault(path.name, []).append(path)
        self._lines: dict[Path, list[str]] = {}

    def lines(self, path: Path) -> list[str]:
        if path not in self._lines:
            self._lines[path] = path.read_text().splitlines()
        return self._lines[path]

    def is_prologue(self, kernel: str, name: str, line: int) -> bool:
        """Whether ``name:line`` is ``kernel``'s ``def`` line or a ``warp_specialize(`` call in the
        file defining ``kernel``."""
        for path in self.files.get(name, []):
            lines = self.lines(path)
            if not any(re.match(rf"\s*def {re.escape(kernel)}\(", s) for s in lines):
                continue
            if 1 <= line <= len(lines):
                text = lines[line - 1]
                if re.match(rf"\s*def {re.escape(kernel)}\(", text) or "warp_specialize(" in text:
                    return True
                if re.match(r"\s*(if\b.*|else\s*):\s*(#.*)?$", text):  # the branch opening the call
                    following = next((s for s in lines[line:] if s.strip() and not s.strip().startswith("#")), "")
                    return "warp_specialize(" in following
        return False


def triage(text: str, sources: Sources) -> dict[str, list]:
    kinds: dict[str, list] = {"kvattn": [], "prologue": [], "calibration": []}
    for block in blocks(text):
        if any(name == CALIBRATION for _, name, _ in block):
            kinds["calibration"].append(block)
        elif all(sources.is_prologue(*access) for access in block):
            kinds["prologue"].append(block)
        else:
            kinds["kvattn"].append(block)
    return kinds


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-2])
        return 2
    log = Path(argv[0])
    roots = [Path(r) for r in argv[1:]] or [Path("src"), Path("benchmarks")]
    text = log.read_text(errors="replace")
    kinds = triage(text, Sources(roots))
    print(f"racecheck triage: kvattn {len(kinds['kvattn'])} | Triton partition prologue "
          f"{len(kinds['prologue'])} | calibration {len(kinds['calibration'])} (hazard reports)")
    for block in kinds["kvattn"]:
        print("  kvattn: " + " / ".join(f"{k} {n}:{ln}" for k, n, ln in block))
    if not _SUMMARY.search(text):
        print("  no RACECHECK SUMMARY in the log: the run did not finish")
        return 1
    return 1 if kinds["kvattn"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
