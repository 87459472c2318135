"""How a console over several hosts names a run: HOST/RUN, the host's own id after the host's name (a run id
never holds the separator). A module of its own, light enough for the renderers of the quick path."""

from __future__ import annotations

SEPARATOR = "/"


def key(host: str, run_id: str) -> str:
    return f"{host}{SEPARATOR}{run_id}"


def split(run: str) -> tuple[str, str]:
    """(host, the host's run id) of HOST/RUN; ("", RUN) of a run of a console over one host."""
    host, _, run_id = run.rpartition(SEPARATOR)
    return host, run_id


def own_id(run: str) -> str:
    """The run's id on its host: what its folder (runs/ID) and the host's own commands call it."""
    return split(run)[1]
