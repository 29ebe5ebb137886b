"""Rewrite citations of the old notebook, ``benchmarks/NOTES.md`` (or a bare ``NOTES.md``), into a
pointer to the topic file of ``lab/notes/`` that holds the cited section, found from the section
titles (each topic file's ``#`` / ``##`` / ``###`` headings):

    benchmarks/NOTES.md "Decode: tiles, stages and warps"  ->  lab/notes/decode.md "Decode: tiles, stages and warps"
    (see benchmarks/NOTES.md, Host path)                   ->  (see lab/notes/host-path.md)

A citation whose section it cannot tell is printed and left alone. Usage (repository root)::

    python lab/relink_notes.py FILE...        # rewrite in place
    python lab/relink_notes.py --check FILE...  # list what would change, exit 1 if anything would
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

NOTES = Path(__file__).resolve().parent / "notes"
CITE = re.compile(r"(?:benchmarks/)?NOTES\.md")


def titles() -> dict[str, str]:
    """Section title -> topic file name (``decode.md``), for every heading of every topic file."""
    found: dict[str, str] = {}
    for path in sorted(NOTES.glob("*.md")):
        if path.name == "README.md":
            continue
        for line in path.read_text().splitlines():
            m = re.match(r"^#{1,4} (.+)$", line)
            if m:
                found.setdefault(m.group(1).strip(), path.name)
    return found


def _following(text: str, end: int) -> str:
    """The text after a citation as one line: comment markers and indentation of the lines it
    continues on dropped, inline-code backticks removed."""
    after = re.sub(r"\n\s*(?:#\s*)?", " ", text[end:end + 400])
    return after.replace("`", "")


def topic_of(after: str, known: dict[str, str]) -> str | None:
    """The topic file a citation's following text names: a quoted title (whole, or its start),
    else a topic or section title right after (``NOTES.md, Decode``; any case)."""
    text = after.lstrip(" ,(")
    by_length = sorted(known.items(), key=lambda kv: -len(kv[0]))
    if text.startswith('"'):
        quoted = text[1:].split('"')[0].strip().lower()
        for title, name in by_length:
            if title.lower() == quoted or (len(quoted) >= 8 and title.lower().startswith(quoted)):
                return name
    for title, name in by_length:
        if text.lower().startswith(title.lower()):
            return name
    words = re.match(r"[\w -]*", text).group(0).strip().lower()  # a title's start, up to punctuation
    for title, name in by_length:
        if len(words) >= 6 and title.lower().startswith(words):
            return name
    return None


def relink(text: str, known: dict[str, str], where: str = "") -> tuple[str, list[str]]:
    """``text`` with every resolvable citation rewritten, and the unresolved ones."""
    out, last, unresolved = [], 0, []
    for m in CITE.finditer(text):
        name = topic_of(_following(text, m.end()), known)
        out.append(text[last:m.start()])
        if name is None:
            unresolved.append(f"{where}: {text[m.start():m.end() + 80]!r}")
            out.append(m.group(0))
            last = m.end()
            continue
        out.append(f"lab/notes/{name}")
        last = m.end()
        # ", Decode)" after a pointer to decode.md says the file's own title again: dropped
        top = next((t for t, n in known.items() if n == name and ":" not in t), None)
        tail = re.match(r"(``)?, ([\w -]+)(?=[).;])", text[last:])
        if top and tail and tail.group(2).strip().lower() == top.lower():
            out.append(tail.group(1) or "")
            last += tail.end()
    out.append(text[last:])
    return "".join(out), unresolved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 where a file would change")
    args = ap.parse_args(argv)
    known = titles()
    changed = 0
    for name in args.files:
        path = Path(name)
        old = path.read_text()
        new, unresolved = relink(old, known, name)
        for u in unresolved:
            print("unresolved", u)
        if new != old:
            changed += 1
            print(("would rewrite " if args.check else "rewrote ") + name)
            if not args.check:
                path.write_text(new)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
