"""Host side of eagle3-console: everything that runs on the GPU host.

Pure Python at its core so the console can upload it to a host that lacks it;
it never imports `console`.
"""

import sys
from pathlib import Path

__version__ = "0.2.0"

# Checked here, in syntax any Python 3 reads, before a module that needs 3.10 is compiled:
# an old interpreter on the host then says so in one line instead of a SyntaxError.
if sys.version_info < (3, 10):  # noqa: UP036 (the point: the package itself requires 3.10)
    sys.stderr.write(
        f"eagle3-console's agent needs Python 3.10 or newer; {sys.executable} is {sys.version.split()[0]}: "
        "name another with --remote-python PATH\n"
    )
    sys.exit(3)

# The folder that holds this package: a child of ours started with `-m backends...` in another
# interpreter or folder finds it on PYTHONPATH or as its cwd.
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
