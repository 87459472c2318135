"""Entry point of `python -m backends.extract`."""

from __future__ import annotations

import sys

from backends.extract.cli import main

sys.exit(main())
