"""The host's memory, as the kernel reports what a new allocation can take without swapping."""

from __future__ import annotations

from pathlib import Path

MEMINFO = Path("/proc/meminfo")


def available_bytes(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable, in bytes; None where the kernel does not say (not Linux, or a kernel before 3.14)."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == "MemAvailable":
            parts = rest.split()
            if parts and parts[0].isdigit():
                return int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return None
