"""`eagle3-console --version` and `--help` given alone, answered before the command line is imported: issue 28
wants both within 40 ms, and the grammar with argparse, the settings and what they import took ~100 ms.

`--version` is the install-integrity check (`console.cli.integrity`) and one line. `--help` is argparse's own text
for the whole grammar (`console.cli.grammar.build_parser`), made once and kept in the user's cache with the key of
what it is made of: this Python (argparse's version), the source files its words come from (each one's path, size
and mtime), the width argparse wraps it to and the language gettext would translate argparse's words to. A key
that changed makes the text afresh with argparse, and keeps it. Each install keeps its own (a file named for the
folder it runs from), so that an editable install and a wheel's beside it do not make each other's afresh.
"""

from __future__ import annotations

import binascii
import os
import sys

from console.cli.width import columns

HERE = os.path.dirname(os.path.abspath(__file__))
ALONE = (["--version"], ["--help"], ["-h"])
HELP_SOURCES = ("grammar.py", "config.py")  # the modules that hold the words of the command line's --help
LANGUAGE_ENV = ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")  # what gettext reads for argparse's "usage:", "options:"


def answer(words: list[str]) -> int | None:
    """The exit code of `--version` or `--help` given alone; None for any other command line, which goes the
    command line's own way (it answers them among other words too)."""
    if words not in ALONE or "_ARGCOMPLETE" in os.environ:
        return None
    if words == ["--version"]:
        from console.cli import integrity  # --version's alone

        integrity.warn()
        print(f"eagle3-console {version()}")
        return 0
    # As argparse writes its help: a stdout that cannot take it is no error (contextlib.suppress: an import more).
    try:  # noqa: SIM105
        sys.stdout.write(help_text())
    except (AttributeError, OSError):
        pass
    return 0


def version() -> str:
    """`backends.__version__`. A wheel's .dist-info folder is named with it (pyproject takes the version from
    there), so an install of the wheel reads it from that name and spares `import backends` (pathlib, ~5 ms); a
    source tree or an editable install, whose folder may be older than the tree, imports it."""
    from console.cli import integrity

    install = integrity.wheel_install()
    if install is None:
        import backends

        return backends.__version__
    name = os.path.basename(install[0])
    return name[len(integrity.DIST_INFO_PREFIX) : -len(".dist-info")]


def help_text() -> str:
    """argparse's --help for the whole command line: the kept text when its key is this one, else made now."""
    key = help_key()
    path = os.path.join(cache_folder(), f"help-{binascii.crc32(HERE.encode()):08x}.txt")
    if key is not None:
        try:
            with open(path, encoding="utf-8") as file:
                if os.fstat(file.fileno()).st_uid == os.getuid():  # a file of ours, not one planted for our terminal
                    kept_key, _, text = file.read().partition("\n")
                    if kept_key == key:
                        return text
        except (OSError, UnicodeDecodeError):
            pass
    from console.cli import grammar

    text = grammar.build_parser(grammar.GRAMMARS).format_help()
    if key is not None:
        keep(path, f"{key}\n{text}")
    return text


def help_key() -> str | None:
    """What the help text is made of, in one line; None when a source file cannot be looked at (then it is made
    each time)."""
    stamps = [
        f"{sys.hexversion:x}",
        f"columns={columns()}",
        *(f"{name}={os.environ.get(name, '')}" for name in LANGUAGE_ENV),
    ]
    for name in HELP_SOURCES:
        path = os.path.join(HERE, name)
        try:
            st = os.stat(path)
        except OSError:
            return None
        stamps.append(f"{path}:{st.st_size}:{st.st_mtime_ns}")
    key = " ".join(stamps)
    return None if "\n" in key else key


def cache_folder() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "eagle3-console")


def keep(path: str, content: str) -> None:
    """Written whole or not at all (a file of this process renamed over it); a cache that cannot be written is
    only slower."""
    temp = f"{path}.{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(temp, "w", encoding="utf-8") as file:
            file.write(content)
        os.replace(temp, path)
    except OSError:
        import contextlib

        with contextlib.suppress(OSError):
            os.unlink(temp)
