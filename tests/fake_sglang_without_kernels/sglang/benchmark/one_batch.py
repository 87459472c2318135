"""The in-process runner's module: 0.5.23 imports its compiled kernels on the way, as this does, so a host
without them fails here with `ModuleNotFoundError: No module named 'sgl_kernel'`."""

import sgl_kernel  # type: ignore[import-not-found]  # noqa: F401
