"""`python -m sglang.launch_server FLAGS...` for tests: the stand-in of tests/sglang_standin.py."""

import sys

from tests.sglang_standin import main

# The stand-in's scheduler child is spawned and imports this module again: only the server itself runs main().
if __name__ == "__main__":
    sys.exit(main())
