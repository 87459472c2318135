"""`python -m console` is the `eagle3-console` command."""

import sys

from console.main import main

sys.exit(main())
