"""Console themes (filled by the TUI issue)."""
