"""What a serve command launches, however it is spelled: the one reader of a command line for everything SGLang-facing.

The shapes people launch SGLang with:

- `python[3[.x]] [OPTIONS] -m sglang.launch_server FLAGS` and SGLang's own CLI, `sglang serve [MODEL] FLAGS` (0.5.23:
  `sglang/cli/main.py` hands everything after `serve` to `cli/serve.py`, which takes out `--model-type`, turns a
  leading positional MODEL into `--model-path MODEL`, and gives the rest to `prepare_server_args`, the parser that
  `launch_server` uses too, `prog="sglang serve"`); a console script's interpreter is its `#!` line's;
- either behind prefixes that run a command: `env [-i] [-u NAME] NAME=VALUE...`, `numactl`, `taskset`, `nice`,
  `ionice`, `nohup`, `stdbuf`, `timeout`;
- inside a shell string, `bash|sh -c 'cd /x && exec python -m sglang.launch_server --port $PORT "$@"' _ ARGS` (the
  last command of the string that starts a server; variables the launch's environment sets are expanded, `"$@"`
  is the arguments after the string);
- a wrapper given where the interpreter goes (`WRAPPER -m sglang.launch_server FLAGS`: the flags are visible, the
  interpreter the wrapper execs is not), or as the whole command (neither is): `--sglang-python PATH` names it;
- `docker|podman run [OPTIONS] IMAGE CMD...`: the inner command is read as above, its interpreter is inside the
  image, its port reached through `-p HOST:CONTAINER` (or `--network host`), its paths through `-v HOST:CONTAINER`.

`read` never raises: whatever it does not recognise is not a server command (None).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from backends import shellwords
from backends.argv_edit import ArgvEditError, edit_argv, flag_value
from backends.sglang import facts

MODULE = "python -m sglang.launch_server"
CLI = "sglang serve"
WRAPPER = "wrapper script"
IMAGE = "the image's own command"

CLI_PROGRAM = "sglang"
CLI_SUBCOMMAND = "serve"
MODEL_TYPE_FLAG = "--model-type"  # `sglang serve`'s own flag, taken out before SGLang's parser sees the rest
SGLANG_PYTHON_FLAG = "--sglang-python"
HEALTH_URL_FLAG = "--health-url"
METRICS_URL_FLAG = "--metrics-url"
EVERYWHERE = ("0.0.0.0", "::", "[::]")
LOOPBACK = "127.0.0.1"

_PYTHON_NAME = re.compile(r"python[0-9.]*")
_PYTHON_VALUE_OPTIONS = frozenset({"-W", "-X"})  # python's options that take the next word as their value
CONTAINER_RUNTIMES = frozenset({"docker", "podman"})
# Prefixes that run the command after their own options, and those options of theirs that take a value.
PREFIXES: Mapping[str, frozenset[str]] = {
    "numactl": frozenset({"-C", "-m", "-N", "-i", "-p", "-P", "-w", "-S", "-f", "-L", "-o", "-M", "-I"}),
    "nice": frozenset({"-n"}),
    "ionice": frozenset({"-c", "-n", "-p", "-P", "-u"}),
    "nohup": frozenset(),
    "stdbuf": frozenset({"-i", "-o", "-e"}),
    "timeout": frozenset({"-s", "-k"}),
    "taskset": frozenset(),
}
# Environment managers whose `run` starts the command in an environment of theirs, with its own Python (which the
# host cannot name without --sglang-python), and those options of theirs that take a value.
ENV_MANAGERS: Mapping[str, frozenset[str]] = {
    "uv": frozenset({
        "--with", "--with-editable", "--with-requirements", "--python", "-p", "--project", "--directory",
        "--package", "--extra", "--group", "--only-group", "--env-file", "--index", "--default-index",
        "--index-url", "--extra-index-url", "--find-links", "-f", "--config-file", "--cache-dir", "--color",
    }),
    "conda": frozenset({"-n", "--name", "-p", "--prefix", "--cwd"}),
    "mamba": frozenset({"-n", "--name", "-p", "--prefix", "--cwd"}),
    "micromamba": frozenset({"-n", "--name", "-p", "--prefix", "--cwd", "-a", "--attach", "-r", "--root-prefix"}),
    "pixi": frozenset({"-e", "--environment", "--manifest-path", "--color"}),
    "poetry": frozenset({"-C", "--directory", "-P", "--project"}),
    "pipenv": frozenset(),
}  # fmt: skip
_SHELL_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
# docker/podman run's options that take no value (every other option takes one).
_CONTAINER_SWITCHES = frozenset({
    "-d", "--detach", "-i", "--interactive", "-t", "--tty", "--rm", "--privileged", "--init", "-P", "--publish-all",
    "--read-only", "--no-healthcheck", "--oom-kill-disable", "--sig-proxy", "--disable-content-trust", "-q",
    "--quiet", "--help", "--replace", "--rmi", "--env-host", "--read-only-tmpfs", "--http-proxy", "--no-hosts",
    "--tls-verify",
})  # fmt: skip
_CONTAINER_SHORT_SWITCHES = frozenset("ditPq")


@dataclass(frozen=True)
class Container:
    """A server inside `docker run`/`podman run`: how its port and paths are reached from the host."""

    runtime: str
    image: str
    host_network: bool = False
    ports: Mapping[int, tuple[str | None, int | None]] = field(default_factory=dict)  # in -> (host address, port)
    volumes: tuple[tuple[str, str], ...] = ()  # (host path, container path)

    def host_port(self, port: int) -> tuple[str | None, int | None] | None:
        """Where the container's `port` is reached from the host: (address or None, port or None when the
        runtime picks one); None when it is not published."""
        if self.host_network:
            return None, port
        return self.ports.get(port)

    def host_path(self, path: str) -> str | None:
        """The host path of a path inside the container, through its bind mounts (None: not mounted)."""
        inside = PurePosixPath(path)
        for host, mounted in sorted(self.volumes, key=lambda v: -len(v[1])):
            try:
                rest = inside.relative_to(mounted)
            except ValueError:
                continue
            return str(PurePosixPath(host) / rest) if str(rest) != "." else host
        return None


@dataclass(frozen=True)
class ServerLaunch:
    """What a command line launches: its shape, the prefixes around it, SGLang's flags, its interpreter."""

    shape: str  # MODULE, CLI, WRAPPER or IMAGE
    via: tuple[str, ...]  # the prefixes it runs behind, outermost first: "env", "bash -c", "docker run"...
    flags: tuple[str, ...] | None  # what SGLang's parser gets (None: not visible from the command line)
    python: str | None  # the host interpreter that runs SGLang (None: not known here)
    python_from: str | None  # where it was read: "the command", "#! of PATH", "--sglang-python"
    env: Mapping[str, str]  # what the prefixes set for the server (`env A=B`, `docker -e A=B`)
    container: Container | None = None
    unexpanded: tuple[str, ...] = ()  # shell words of the flags that could not be expanded here
    raw_flags: tuple[str, ...] = ()  # the flags as written (before a shell expands them): what an edit changes
    # The command line with other flags: the edit is made where the flags are written (in a shell string too).
    rebuild: Callable[[list[str]], list[str]] | None = field(default=None, compare=False, repr=False)

    @property
    def program(self) -> str:
        """The program's name as SGLang's process sees it (sys.argv[0]): argparse's default name in its errors
        where a release sets none (0.5.23's prepare_server_args says `sglang serve` for both shapes)."""
        return CLI_PROGRAM if self.shape == CLI else "launch_server.py"

    def describe(self) -> str:
        """`sglang serve in docker run (lmsysorg/sglang) via env`, for messages."""
        where = f"{self.shape} in {self.container.runtime} run ({self.container.image})" if self.container else ""
        outside = [v for v in self.via if v.split()[0] not in CONTAINER_RUNTIMES]
        return (where or self.shape) + (f" via {', '.join(outside)}" if outside else "")

    def flag(self, *names: str) -> str | None:
        """The value SGLang takes for one of `names` (aliases), as argparse would; None when absent or unseen."""
        return flag_value(["", *self.flags], names) if self.flags is not None else None

    def path(self, value: str) -> str | None:
        """A path the server reads, as the host sees it (through the container's mounts); None when the host
        cannot see it."""
        if self.container is None:
            return value
        return self.container.host_path(value) if value.startswith("/") else None

    def edited(self, sets: list[str], unsets: list[str]) -> list[str] | None:
        """The whole command line with SGLang's flags set or removed where they are written; None when the flags
        are not visible, or are the command line's own words after a shell string (ArgvEditError when a flag is
        not one)."""
        if self.flags is None or self.rebuild is None or {"$@", "$*"} & set(self.raw_flags):
            return None  # flags passed through a shell's "$@" are the command line's own words: edited there
        written = [word.raw for word in self.raw_flags if isinstance(word, shellwords.ShellWord) and word.expands]
        for flag in unsets:
            if _given(self.flags, flag) and not _given(self.raw_flags, flag):
                raise ArgvEditError(
                    f"{flag} is given by {', '.join(written)} in the command line, which cannot be edited here; "
                    "remove it there, or launch the server anew"
                )
        return self.rebuild(edit_argv(["", *self.raw_flags], sets, unsets)[1:])


def _given(flags: Sequence[str], flag: str) -> bool:
    return any(word == flag or word.startswith(flag + "=") for word in flags)


def read(
    argv: Sequence[str], env: Mapping[str, str] | None = None, sglang_python: str | None = None
) -> ServerLaunch | None:
    """The SGLang server `argv` launches, or None when it is not one of the shapes above. `env` is the launch's
    environment (a shell's variables, PATH for a bare program); `sglang_python` the user's word on the
    interpreter, which wins."""
    try:
        found = _read(list(argv), _Reading((), dict(env or {}), {}, None, lambda words: words))
    except (ValueError, IndexError):  # an unclosed quote in a shell string, a prefix with nothing after it
        found = None
    if found is None or sglang_python is None:
        return found
    return replace(found, python=sglang_python, python_from=SGLANG_PYTHON_FLAG)


def wrapper(argv: Sequence[str], sglang_python: str | None) -> ServerLaunch:
    """A serve run's command that is none of the shapes: a wrapper script whose flags are its own business."""
    python_from = SGLANG_PYTHON_FLAG if sglang_python else None
    return ServerLaunch(WRAPPER, (), None, sglang_python, python_from, {}, rebuild=None)


Rebuild = Callable[[list[str]], list[str]]


@dataclass(frozen=True)
class _Reading:
    """Where the reader stands inside a command line: the prefixes passed, outermost first; the environment the
    server will see and the part of it the prefixes set; the container around it; and how the whole command line
    is written again around new words for the part being read."""

    via: tuple[str, ...]
    env: dict[str, str]
    own: dict[str, str]
    container: Container | None
    rebuild: Rebuild

    def inside(
        self, prefix: str, head: list[str], env: dict[str, str] | None = None, own: dict[str, str] | None = None
    ) -> _Reading:
        """The reading of the words after `head`, behind `prefix`, with the environment it sets."""
        rebuild = self.rebuild
        return _Reading(
            (*self.via, prefix),
            self.env if env is None else env,
            self.own if own is None else own,
            self.container,
            lambda words: rebuild([*head, *words]),
        )


def _read(argv: list[str], at: _Reading) -> ServerLaunch | None:
    if not argv:
        return None
    name = Path(argv[0]).name
    if name == "env":
        return _read_env(argv, at)
    if name in shellwords.SHELLS:
        return _read_shell(argv, at)
    if name in PREFIXES:
        start = _after_prefix(name, argv)
        return _read(argv[start:], at.inside(name, argv[:start]))
    if name in ENV_MANAGERS and argv[1:2] == ["run"]:
        start = _after_options(argv, 2, ENV_MANAGERS[name])
        return _read(argv[start:], at.inside(f"{name} run", argv[:start]))
    if name in CONTAINER_RUNTIMES and len(argv) > 1 and argv[1] == "run" and at.container is None:
        return _read_container(argv, at)
    return _read_server(argv, at)


def _read_server(argv: list[str], at: _Reading) -> ServerLaunch | None:
    program, name = argv[0], Path(argv[0]).name
    unknown = at.container is not None or manager(at.via) is not None  # their Python is theirs to choose
    if name == CLI_PROGRAM and argv[1:2] == [CLI_SUBCOMMAND]:
        python, source = (None, None) if unknown else _script_python(program, at.env)
        return _server(CLI, argv, 2, at, python, source)
    index, module = _python_target(argv)
    if index is None:
        return None
    python, source = (None, None) if unknown else _interpreter(program, at.env)
    if module is not None:
        if module not in facts.SERVER_MODULES:
            return None
        return _server(MODULE, argv, index + 1, at, python, source)
    # `python .../bin/sglang serve FLAGS`: the console script run by a named interpreter.
    if Path(argv[index]).name == CLI_PROGRAM and argv[index + 1 : index + 2] == [CLI_SUBCOMMAND]:
        return _server(CLI, argv, index + 2, at, python, source)
    return None


def _server(
    shape: str, argv: list[str], start: int, at: _Reading, python: str | None, source: str | None
) -> ServerLaunch:
    raw = argv[start:]
    flags, unexpanded = _expanded(raw, at.env) if any(v.endswith(" -c") for v in at.via) else (raw, [])
    if shape == CLI:
        flags = cli_flags(flags)
    rebuild, head = at.rebuild, argv[:start]
    return ServerLaunch(
        shape=shape,
        via=at.via,
        flags=tuple(flags),
        python=python,
        python_from=source,
        env=dict(at.own),
        container=at.container,
        unexpanded=tuple(unexpanded),
        rebuild=lambda words: rebuild([*head, *words]),
        raw_flags=tuple(raw),
    )


def cli_flags(words: list[str]) -> list[str]:
    """What `sglang serve WORDS` gives SGLang's parser (0.5.23's cli/serve.py): --model-type taken out, a leading
    positional model path made --model-path."""
    kept: list[str] = []
    skip = False
    for index, word in enumerate(words):
        if skip:
            skip = False
            continue
        if word == MODEL_TYPE_FLAG:
            skip = index + 1 < len(words)
            continue
        if word.startswith(MODEL_TYPE_FLAG + "="):
            continue
        kept.append(word)
    if kept and not kept[0].startswith("-"):
        kept = ["--model-path", *kept]
    return kept


def _python_target(argv: list[str]) -> tuple[int | None, str | None]:
    """(index of the module's name, module) for `PROGRAM [OPTIONS] -m MODULE`, (index of the script, None) for
    `python [OPTIONS] SCRIPT`; (None, None) otherwise."""
    index = 1
    while index < len(argv):
        word = argv[index]
        if word == "-m":
            return (index + 1, argv[index + 1]) if index + 1 < len(argv) else (None, None)
        if word.startswith("-m") and len(word) > 2:
            return index, word[2:]
        if not word.startswith("-") or word == "-":
            is_python = _PYTHON_NAME.fullmatch(Path(argv[0]).name) is not None
            return (index, None) if is_python else (None, None)
        if word == "-c":
            return None, None
        index += 2 if word in _PYTHON_VALUE_OPTIONS else 1
    return None, None


def _interpreter(program: str, env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The program itself when it is a Python (by its name, `python*`, or the file it links to); else a wrapper's:
    unknown."""
    if Path(program).name.startswith("python"):
        return program, "the command"
    found = _which(program, env)
    if found is not None and _PYTHON_NAME.fullmatch(Path(os.path.realpath(found)).name):
        return program, "the command"
    return None, None


def _which(program: str, env: Mapping[str, str]) -> str | None:
    if os.sep in program:
        return program if os.path.isfile(program) else None
    return shutil.which(program, path=env.get("PATH", os.environ.get("PATH")))


def _script_python(program: str, env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The interpreter on a console script's `#!` line (pip writes `#!/bin/sh` and an `'''exec' PYTHON` line for
    a path too long for the kernel); (None, None) when the script cannot be read."""
    found = _which(program, env)
    if found is None:
        return None, None
    try:
        with open(found, "rb") as script:
            head = script.read(4096).decode(errors="replace").splitlines()
    except OSError:
        return None, None
    if not head or not head[0].startswith("#!"):
        return None, None
    words = head[0][2:].split()
    if words and Path(words[0]).name == "sh" and len(head) > 1 and head[1].startswith("'''exec' "):
        words = shlex.split(head[1].removeprefix("'''exec' "))[:1]
    elif words and Path(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w][:1]
    if not words or not _PYTHON_NAME.fullmatch(Path(words[0]).name):
        return None, None
    return words[0], f"the #! line of {found}"


def _read_env(argv: list[str], at: _Reading) -> ServerLaunch | None:
    index = 1
    env, own = dict(at.env), dict(at.own)
    while index < len(argv):
        word = argv[index]
        if word in ("-i", "--ignore-environment", "-"):
            env = {key: value for key, value in env.items() if key == "PATH"}
        elif word in ("-u", "--unset", "-C", "--chdir"):
            env.pop(argv[index + 1] if word in ("-u", "--unset") else "", None)
            index += 1
        elif word == "--":
            index += 1
            break
        elif word.startswith("-"):
            pass  # -0, -v, --unset=NAME, --chdir=DIR: nothing SGLang reads
        elif "=" in word:
            key, _, value = word.partition("=")
            env[key], own[key] = value, value
        else:
            break
        index += 1
    while index < len(argv) and "=" in argv[index] and not argv[index].startswith("-"):
        key, _, value = argv[index].partition("=")
        env[key], own[key] = value, value
        index += 1
    return _read(argv[index:], at.inside("env", argv[:index], env=env, own=own))


def manager(via: Sequence[str]) -> str | None:
    """The environment manager a launch runs behind (`uv run`), if any."""
    return next((v for v in via if v.split()[0] in ENV_MANAGERS), None)


def _after_options(argv: list[str], index: int, takes_value: frozenset[str]) -> int:
    """Where the command starts after a prefix's options from `index` (`--` ends them)."""
    while index < len(argv) and argv[index].startswith("-") and argv[index] != "--":
        index += 2 if argv[index] in takes_value else 1
    return index + 1 if index < len(argv) and argv[index] == "--" else index


def _after_prefix(name: str, argv: list[str]) -> int:
    """Where the command run by a prefix (`numactl --physcpubind=0-7 CMD`, `nice -10 CMD`) starts."""
    index = _after_options(argv, 1, PREFIXES[name])
    if name in ("taskset", "timeout"):
        index += 1  # the CPU mask or list, the duration
    return index


def _read_shell(argv: list[str], at: _Reading) -> ServerLaunch | None:
    at_string = shellwords.command_string(argv)
    if at_string is None:
        return None  # `bash script.sh`: a wrapper script
    text, positional = argv[at_string], argv[at_string + 2 :]
    shell = f"{Path(argv[0]).name} -c"
    words = shellwords.split(text)
    segments = shellwords.simple_commands(words)
    for start, end in reversed(segments):
        env_here, own_here = dict(at.env), dict(at.own)
        begin = start
        while begin < end and (words[begin] in ("exec", "command") or _assignment(words[begin])):
            if _assignment(words[begin]):
                key, _, value = words[begin].partition("=")
                expanded = _expand_one(value, env_here)[0] if words[begin].expands else [value]
                env_here[key] = own_here[key] = " ".join(expanded)
            begin += 1
        command, written = shellwords.command_at(words, begin, end)
        env_here["@"] = "\0".join(positional)

        def rebuilt(new: list[str], written: Callable[[Sequence[str]], str] = written) -> list[str]:
            return at.rebuild([*argv[:at_string], written(new), *argv[at_string + 1 :]])

        found = _read(list(command), replace(at, via=(*at.via, shell), env=env_here, own=own_here, rebuild=rebuilt))
        if found is not None:
            return found
    return None


def _assignment(word: str) -> bool:
    key, sep, _ = word.partition("=")
    return bool(sep) and key.isidentifier()


def _expand_one(word: str, env: Mapping[str, str]) -> tuple[list[str], bool]:
    """A shell word with the variables `env` knows expanded ("$@" into its words, an unquoted `$FLAGS` split at its
    blanks as the shell splits it); whether any part was left unexpanded (a command's output is never known)."""
    if isinstance(word, shellwords.ShellWord) and not word.expands:
        return [word], False  # single-quoted or escaped: its `$` is a character
    if word in ("$@", "$*"):
        joined = env.get("@", "")
        return (joined.split("\0") if joined else []), False
    left = "$(" in word or "`" in word

    def value(match: re.Match[str]) -> str:
        nonlocal left
        key = match.group(1) or match.group(2)
        if key in env:
            return env[key]
        if key in os.environ:
            return os.environ[key]
        left = True
        return match.group(0)

    expanded = _SHELL_VARIABLE.sub(value, word)
    if isinstance(word, shellwords.ShellWord) and word.splits and not left:
        return expanded.split(), False
    return [expanded], left


def _expanded(words: list[str], env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    out: list[str] = []
    left: list[str] = []
    for word in words:
        expanded, unknown = _expand_one(word, env)
        out += expanded
        if unknown:
            left.append(word)
    return out, left


def _read_container(argv: list[str], at: _Reading) -> ServerLaunch | None:
    runtime = Path(argv[0]).name
    index = 2
    inner_env: dict[str, str] = {}
    ports: dict[int, tuple[str | None, int | None]] = {}
    volumes: list[tuple[str, str]] = []
    host_network = False
    entrypoint: list[str] = []
    while index < len(argv) and argv[index].startswith("-") and argv[index] != "--":
        option, value, index = _container_option(argv, index)
        if option in ("-e", "--env") and value is not None and "=" in value:
            key, _, text = value.partition("=")
            inner_env[key] = text
        elif option in ("-p", "--publish") and value is not None:
            ports.update(_published(value))
        elif option in ("--network", "--net") and value == "host":
            host_network = True
        elif option in ("-v", "--volume") and value is not None and value.count(":") >= 1:
            host, mounted = value.split(":")[:2]
            if host.startswith("/"):
                volumes.append((host, mounted))
        elif option == "--mount" and value is not None:
            parts = dict(p.partition("=")[::2] for p in value.split(","))
            source, target = parts.get("source") or parts.get("src"), parts.get("target") or parts.get("dst")
            if source and target and source.startswith("/"):
                volumes.append((source, target))
        elif option == "--entrypoint" and value:
            entrypoint = [value]
    if index < len(argv) and argv[index] == "--":
        index += 1
    if index >= len(argv):
        return None
    image = argv[index]
    box = Container(runtime, image, host_network, ports, tuple(volumes))
    inner = [*entrypoint, *argv[index + 1 :]]
    where = (*at.via, f"{runtime} run")
    if not inner:
        return ServerLaunch(IMAGE, where, None, None, None, inner_env, box) if "sglang" in image else None
    head = argv[: index + 1]

    def rebuilt(words: list[str]) -> list[str]:
        return at.rebuild([*head, *words[len(entrypoint) :]])

    return _read(inner, _Reading(where, {**at.env, **inner_env}, inner_env, box, rebuilt))


def _container_option(argv: list[str], index: int) -> tuple[str, str | None, int]:
    """(option, its value or None, index after it) of docker/podman run's option at `index`."""
    word = argv[index]
    if word.startswith("--"):
        option, sep, value = word.partition("=")
        if sep:
            return option, value, index + 1
        if word in _CONTAINER_SWITCHES:
            return word, None, index + 1
        return word, argv[index + 1] if index + 1 < len(argv) else None, index + 2
    for at, letter in enumerate(word[1:], 1):  # a cluster of short options: -it, -dp8000:8000
        if letter not in _CONTAINER_SHORT_SWITCHES:
            rest = word[at + 1 :]
            if rest:
                return f"-{letter}", rest.removeprefix("="), index + 1
            return f"-{letter}", argv[index + 1] if index + 1 < len(argv) else None, index + 2
    return word, None, index + 1


def _published(value: str) -> dict[int, tuple[str | None, int | None]]:
    """`-p [ADDRESS:][HOST[-HOST]:]CONTAINER[-CONTAINER][/PROTO]`: container port -> (address, host port)."""
    spec = value.split("/")[0]
    address: str | None = None
    if spec.startswith("["):  # [::1]:8000:8000
        address, _, spec = spec[1:].partition("]:")
    parts = spec.split(":")
    if len(parts) == 3:
        address, host, inside = parts
    elif len(parts) == 2:
        host, inside = parts
    else:
        host, inside = "", parts[0]
    inner = _port_range(inside)
    outer = _port_range(host) if host else None
    if inner is None:
        return {}
    if outer is None or len(outer) != len(inner):
        return {port: (address or None, None) for port in inner}
    return {port: (address or None, out) for port, out in zip(inner, outer, strict=True)}


def _port_range(text: str) -> list[int] | None:
    first, _, last = text.partition("-")
    if not first.isdigit() or (last and not last.isdigit()):
        return None
    return list(range(int(first), int(last or first) + 1))


def health_url(found: ServerLaunch) -> str | None:
    """SGLang's /health as the host reaches it: its --host and --port (through the container's published port);
    None when the flags are not visible, for a node of rank 1 and up (node 0 alone serves HTTP), or a container
    port that is not published."""
    if found.flags is None or (found.flag(facts.NODE_RANK_FLAG) or "0") != "0":
        return None
    host = found.flag(facts.HOST_FLAG) or LOOPBACK
    port_text = found.flag(facts.PORT_FLAG) or str(facts.DEFAULT_PORT)
    if not port_text.isdigit():
        return None
    port: int | None = int(port_text)
    if host in EVERYWHERE:
        host = LOOPBACK  # listening everywhere: ask on loopback
    if found.container is not None:
        assert port is not None
        published = found.container.host_port(port)
        if published is None or published[1] is None:
            return None
        address, port = published
        host = address if address and address not in EVERYWHERE else LOOPBACK
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/health"
