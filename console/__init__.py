"""Client side of eagle3-console: CLI, TUI and the transports to the host agent."""
