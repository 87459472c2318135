"""`python -m sglang.launch_server FLAGS...` for tests: the stand-in of tests/sglang_standin.py."""

import sys

from tests.sglang_standin import main

sys.exit(main())
