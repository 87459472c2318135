"""The Textual console: `eagle3-console HOST` with no command (see `app.py`)."""
