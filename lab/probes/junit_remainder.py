"""The test ids a stopped GPU run never reached: ``pytest --collect-only`` of this tree (the same
marker filter) less the test cases of that run's JUnit XML (``.xml`` or ``.xml.xz``), one id a line
for ``pytest @FILE``. Used to finish a Triton 3.7.1 GPU suite that its call's time limit stopped
(``lab/results/h200/2026-11-30/n-call4-junit.xml.xz``: 350 of 3,911 ids left; ``h200_round_q1.sh``).

    python3 lab/probes/junit_remainder.py lab/results/h200/2026-11-30/n-call4-junit.xml.xz --out ids.txt
"""

from __future__ import annotations

import argparse
import lzma
import subprocess
import sys
import xml.etree.ElementTree as ET


def ran_cases(path: str) -> set:
    """``(classname, name)`` of every test case in the XML."""
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rb") as f:
        root = ET.parse(f).getroot()
    return {(c.attrib["classname"], c.attrib["name"]) for c in root.iter("testcase") if "classname" in c.attrib}


def junit_key(node_id: str) -> tuple:
    """A collected id as JUnit names it: the module path dotted (and its classes), the test's name."""
    path, rest = node_id.split("::", 1)
    parts = rest.split("::")
    return ".".join([path[:-3].replace("/", "."), *parts[:-1]]), parts[-1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit")
    ap.add_argument("--out", required=True)
    ap.add_argument("--marker", default="not codegen")
    args = ap.parse_args(argv)
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-m", args.marker, "tests"], capture_output=True, text=True)
    ids = [line.strip() for line in res.stdout.splitlines() if "::" in line]
    ran = ran_cases(args.junit)
    todo = [i for i in ids if junit_key(i) not in ran]
    with open(args.out, "w") as f:
        f.write("".join(i + "\n" for i in todo))
    print(f"{len(ids)} collected, {len(ids) - len(todo)} in {args.junit}, {len(todo)} left -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
