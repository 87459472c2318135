"""Entry point of `python -m backends.doctor`."""

from __future__ import annotations

import sys

from backends.doctor.cli import main

sys.exit(main())
