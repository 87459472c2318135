"""Facts about this host: its processes, GPUs and disks."""
