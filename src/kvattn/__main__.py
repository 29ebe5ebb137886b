"""``python -m kvattn ...`` is the ``kvattn`` command."""

import sys

from .cli import main

sys.exit(main())
