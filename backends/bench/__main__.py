"""Entry point of `python -m backends.bench`."""

from __future__ import annotations

import sys

from backends.bench.cli import main

sys.exit(main())
