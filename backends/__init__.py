"""Host side of eagle3-console: everything that runs on the GPU host.

Pure Python at its core so the console can upload it to a host that lacks it;
it never imports `console`.
"""

__version__ = "0.1.0"
