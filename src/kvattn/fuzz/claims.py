"""Which worker compiles a kernel class first (``kvattn fuzz --jobs N --shared-classes``).

With shared classes every worker draws the same fresh classes at about the same time, and Triton
has no lock between processes: N workers would compile the same kernels N times over, each
compile seconds of a CPU core. Here the first worker to reach a class (in a mode family: the
batch-invariant mode's kernels are others) *claims* it with a file created exclusively in a
directory the workers share; it runs the call, compiling, and marks the class done. A worker that
finds the class claimed but not done runs a call of a class it has already warmed instead, and
comes back to the new class later, when Triton's disk cache holds its kernels (a load, not a
compile). docs/fuzzing.md, "Parallel workers".
"""

from __future__ import annotations

import hashlib
import os
import time

STALE_SECONDS = 120.0  # a claim this old whose worker never marked it done (a crash): the class is free


def family(mode: str) -> str:
    """Modes that launch the same kernels of a class: all but the batch-invariant one."""
    return "invariant" if mode == "invariant" else "plain"


class Claims:
    """One worker's view of the shared claims directory, and the class keys it has warmed."""

    def __init__(self, directory: str):
        self.directory = directory
        self.warm: set = set()  # (class key, family) this process has run
        self.mine: set = set()  # of those, the ones it claimed (its done mark still to write)

    def _path(self, key: tuple, suffix: str) -> str:
        digest = hashlib.sha1(repr(key).encode()).hexdigest()
        return os.path.join(self.directory, digest + suffix)

    def ready(self, key: tuple) -> bool:
        """Whether this worker may run ``key`` now: warmed here, done by another worker, claimed
        now by this one, or claimed so long ago that its worker is taken to be gone."""
        if key in self.warm:
            return True
        claim = self._path(key, ".claim")
        if os.path.exists(self._path(key, ".done")):
            return True
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            try:
                return time.time() - os.path.getmtime(claim) > STALE_SECONDS
            except OSError:  # removed meanwhile: done, or the directory is gone
                return True
        except OSError:  # the directory is gone (the run is ending): nothing to coordinate
            return True
        self.mine.add(key)
        return True

    def ran(self, key: tuple) -> None:
        """``key``'s call has run here: its kernels are compiled (and on Triton's disk cache)."""
        self.warm.add(key)
        if key in self.mine:
            self.mine.discard(key)
            try:
                os.close(os.open(self._path(key, ".done"), os.O_CREAT | os.O_WRONLY))
            except OSError:
                pass
