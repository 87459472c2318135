"""The console's settings file and the hosts it knows: `--config PATH`, else `$EAGLE3_CONSOLE_CONFIG`, else
`~/.config/eagle3-console/config.toml` (XDG_CONFIG_HOME applies); and the hosts of `~/.ssh/config`.

    [defaults]                      # every host
    stall_after = 60
    default_host = "gpu1"           # `eagle3-console status`, `eagle3-console`: HOST left out
    theme = "eagle3-day"            # the console's first theme (until one is chosen with its `t`)

    [hosts.gpu1]                    # `eagle3-console gpu1 ...`
    address = "alice@gpu1.example.com:2222"   # default: the name itself (an alias of ~/.ssh/config works)
    remote_python = "/opt/venv/bin/python"
    workdir = "/scratch/alice/eagle3"
    readonly = true
    stall_after = 30
    timeout = 60                    # seconds the host has to answer each request (--timeout)
    description = "8x H200, training"

    [groups]                        # `eagle3-console lab status`: every host of the group
    lab = ["gpu1", "alice@gpu2"]

    [keys]                          # the console's one-key actions, each on a key of your choosing
    kill = "K"

A flag on the command line wins over the host's setting, which wins over [defaults]. A key this file does not know
is an error, not ignored: a misspelt `remote_pyhton` would otherwise silently leave the default in force. The
console's own words (`theme`, the names and keys of [keys]) are the console's to judge, when it opens.
"""

from __future__ import annotations

import errno
import glob
import math
import os
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

    from console.link import reuse

# Each setting: its type, and what the message calls it when wrong.
SETTINGS: dict[str, tuple[type, str]] = {
    "remote_python": (str, "a path"),
    "workdir": (str, "a path"),
    "readonly": (bool, "true or false"),
    "stall_after": (float, "a number of seconds above 0"),
    "timeout": (float, "a number of seconds above 0"),
}
OPTION_OF = {"timeout": "timeout_s"}  # a setting whose option is named otherwise (free-gpus has a --timeout too)
HOST_ONLY: dict[str, tuple[type, str]] = {"address": (str, "[user@]host[:port]"), "description": (str, "text")}
# [defaults] alone: what the command line and the console do without being told, not a host's settings.
CONSOLE_ONLY: dict[str, tuple[type, str]] = {"default_host": (str, "a HOST"), "theme": (str, "a theme's name")}
TABLES = ("defaults", "hosts", "groups", "keys")
CONFIG_ENV = "EAGLE3_CONSOLE_CONFIG"
# Far above any real settings file, far below what takes seconds to parse before every command.
MAX_SETTINGS_BYTES = 1024 * 1024


class UsageError(Exception):
    """A command given wrongly (its words, an option that does not go with another): one line, exit 2, as a
    settings file that cannot be used (ConfigError)."""


class ConfigError(Exception):
    """The settings file cannot be used; the message names the file, the key and what to do."""


@dataclass(frozen=True)
class Host:
    """A host the console knows: from config.toml (with its settings) or from ~/.ssh/config."""

    name: str
    address: str
    source: str  # "config.toml" or "ssh config"
    settings: dict[str, Any] = field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True)
class Config:
    path: Path
    defaults: dict[str, Any] = field(default_factory=dict)
    hosts: dict[str, Host] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
    default_host: str | None = None  # HOST when a command line leaves it out
    theme: str | None = None  # the console's first theme, as written
    keys: dict[str, str] = field(default_factory=dict)  # [keys]: action -> key, as written

    def expand(self, host: str) -> list[str]:
        """The hosts HOST names: `a,b` lists them, a name of [groups] stands for its hosts; else HOST alone."""
        if host in self.groups:
            return list(self.groups[host])
        if "," not in host:
            return [host]
        names = [name.strip() for name in host.split(",")]
        if not all(names):
            raise ConfigError(f"{host!r} has an empty host name; write hosts as a,b (no spaces, no empty ones)")
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ConfigError(f"{host!r} names {repeated[0]} twice; name each host once")
        return names

    def settings_for(self, host: str) -> tuple[str, dict[str, Any]]:
        """(the address to connect to, the settings that apply) for HOST as typed: a name in [hosts], an address
        one of them has, or any other host (the defaults alone)."""
        named = self.hosts.get(host) or next((h for h in self.hosts.values() if h.address == host), None)
        if named is None:
            return host, dict(self.defaults)
        return named.address, {**self.defaults, **named.settings}


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "eagle3-console" / "config.toml"


def read_settings_file(path: Path, limit: int = MAX_SETTINGS_BYTES) -> bytes:
    """The bytes of a settings file read by every command: OSError when missing, unreadable, not a regular file
    (a FIFO would block every command; opened without blocking, then refused) or over `limit` bytes (the
    text is parsed before anything runs, `local status` included)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file but {_file_kind(mode)}")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit // 1024} KiB, more than any settings file needs")
    return data


def _file_kind(mode: int) -> str:
    kinds = {stat.S_ISFIFO: "a FIFO", stat.S_ISDIR: "a folder", stat.S_ISSOCK: "a socket"}
    return next((name for test, name in kinds.items() if test(mode)), "a device")


def named_path(flag: Path | None) -> tuple[Path, str] | None:
    """The settings file a person named, and how (`--config`, else $EAGLE3_CONSOLE_CONFIG); None: neither."""
    if flag is not None:
        return flag, "--config"
    env = os.environ.get(CONFIG_ENV)
    return (Path(env), f"${CONFIG_ENV}") if env else None


def load(flag: Path | None = None) -> Config:
    """The settings file in force (`flag`: --config's), or an empty Config when the default one is missing;
    ConfigError when it cannot be used, or when a file named by --config or $EAGLE3_CONSOLE_CONFIG is missing."""
    named = named_path(flag)
    path = named[0] if named else config_path()
    try:
        text = read_settings_file(path).decode("utf-8")
    except FileNotFoundError:
        if named is None:
            return Config(path)
        raise ConfigError(f"{path}: no such settings file (named by {named[1]}); create it, or name another") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"{path}: cannot be read ({getattr(exc, 'strerror', None) or exc}); fix or remove it"
        ) from None
    # Imported only when there is a file to read (tomllib ~3 ms): most commands run without one.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # the same parser, before it joined the standard library
        import tomli as tomllib
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}); fix or remove it") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be settings; fix or remove it") from None
    unknown = sorted(set(data) - set(TABLES))
    if unknown:
        raise ConfigError(
            f"{path}: unknown table {unknown[0]!r}; it knows [defaults], [hosts.NAME], [groups] and [keys]"
        )
    defaults = _settings(path, "defaults", data.get("defaults", {}), {**SETTINGS, **CONSOLE_ONLY})
    default_host, theme = _default_host(path, defaults.pop("default_host", None)), defaults.pop("theme", None)
    hosts_table = data.get("hosts", {})
    if not isinstance(hosts_table, dict):
        raise ConfigError(f"{path}: 'hosts' must be tables like [hosts.gpu1]")
    hosts: dict[str, Host] = {}
    for name, table in hosts_table.items():
        where = f"hosts.{name}"
        if name in ("local", "hosts") or not name or name.startswith("-"):
            raise ConfigError(f"{path}: [{where}]: {name!r} cannot name a host here; choose another name")
        settings = _settings(path, where, table, {**SETTINGS, **HOST_ONLY})
        address = settings.pop("address", name)
        description = settings.pop("description", "")
        hosts[name] = Host(name, address, "config.toml", settings, description)
    groups = _groups(path, data.get("groups", {}), hosts)
    return Config(path, defaults, hosts, groups, default_host, theme, _keys(path, data.get("keys", {})))


def _default_host(path: Path, host: str | None) -> str | None:
    """default_host, when it can stand where HOST does (an option's dash, or `hosts`, would read otherwise)."""
    if host is not None and (host.startswith("-") or host == "hosts"):
        raise ConfigError(
            f"{path}: [defaults] default_host must be a HOST (a name, an address or a group), not {host!r}"
        )
    return host


def _keys(path: Path, table: object) -> dict[str, str]:
    """[keys] as written: action -> key; which actions and keys there are is the console's to say, when it opens."""
    if not isinstance(table, dict):
        raise ConfigError(f'{path}: [keys] must be a table of actions and keys, e.g. kill = "K"')
    keys: dict[str, str] = {}
    for action, key in table.items():
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(f'{path}: [keys] {action} must be a key, e.g. {action} = "K", not {key!r}')
        keys[action] = key
    return keys


def _groups(path: Path, table: object, hosts: dict[str, Host]) -> dict[str, list[str]]:
    if not isinstance(table, dict):
        raise ConfigError(f'{path}: [groups] must be a table like: lab = ["gpu1", "gpu2"]')
    groups: dict[str, list[str]] = {}
    for name, members in table.items():
        if name in hosts or name in ("local", "hosts") or "," in name:
            raise ConfigError(f"{path}: [groups] {name!r} cannot name a group (a host, or a word of the console's)")
        fine = isinstance(members, list) and members and all(isinstance(m, str) and m.strip() for m in members)
        if not fine or len(set(members)) != len(members) or any("," in m or m in table for m in members):
            raise ConfigError(f'{path}: [groups] {name} must be a list of hosts, each once, e.g. ["gpu1", "gpu2"]')
        groups[name] = list(members)
    return groups


def _settings(path: Path, where: str, table: object, known: dict[str, tuple[type, str]]) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{where}] must be a table of settings")
    settings: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise ConfigError(f"{path}: [{where}] has an unknown setting {key!r}; known: {', '.join(known)}")
        kind, wanted = known[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        fine = isinstance(value, kind) and (not isinstance(value, float) or (math.isfinite(value) and value > 0))
        if not fine or (isinstance(value, str) and not value.strip()):
            raise ConfigError(f"{path}: [{where}] {key} must be {wanted}, not {value!r}")
        settings[key] = value
    return settings


def ssh_config_hosts(path: Path | None = None) -> list[Host]:
    """The concrete hosts of ~/.ssh/config (and the files it Includes): each `Host` name without a pattern, with
    the address its HostName, User and Port make."""
    path = path or Path(os.path.expanduser("~")) / ".ssh" / "config"
    hosts: dict[str, Host] = {}
    for names, options in _ssh_blocks(path, depth=0):
        for name in names:
            if any(c in name for c in "*?!") or name in hosts:
                continue
            address = options.get("hostname", name).replace("%h", name)
            if "user" in options:
                address = f"{options['user']}@{address}"
            if "port" in options and options["port"] != "22":
                address = f"{address}:{options['port']}"
            hosts[name] = Host(name, address, "ssh config")
    return list(hosts.values())


def _ssh_blocks(path: Path, depth: int) -> Iterator[tuple[list[str], dict[str, str]]]:
    """(Host names, their first value of each option) per `Host` block; `Include`d files in place."""
    try:
        lines = read_settings_file(path).decode("utf-8", errors="replace").splitlines()
    except OSError:
        return
    names: list[str] = []
    options: dict[str, str] = {}
    for line in lines:
        words = line.strip().replace("=", " ", 1).split()
        if not words or words[0].startswith("#"):
            continue
        keyword, values = words[0].lower(), words[1:]
        if keyword in ("host", "match"):
            if names:
                yield names, options
            names, options = (values if keyword == "host" else []), {}
        elif keyword == "include" and depth < 8:
            for pattern in values:
                full = os.path.expanduser(pattern)
                full = full if os.path.isabs(full) else str(path.parent / full)
                for included in sorted(glob.glob(full)):
                    yield from _ssh_blocks(Path(included), depth + 1)
        elif values:
            options.setdefault(keyword, values[0])
    if names:
        yield names, options


def known_hosts(config: Config) -> list[Host]:
    """Every host the console knows, config.toml's first (a name in both is config.toml's), then its groups (the
    address of one is its hosts, as HOST would list them)."""
    groups = [Host(name, ",".join(members), "group") for name, members in config.groups.items()]
    return [*config.hosts.values(), *(h for h in ssh_config_hosts() if h.name not in config.hosts), *groups]


def readonly_source(given: bool | None, host: str, settings: Config) -> str | None:
    """Where the read-only setting in force for HOST comes from: `--readonly`, or `readonly = true in PATH`
    ([hosts.NAME] or [defaults]); None when it is off. `given`: --readonly/--no-readonly, None when neither."""
    if given is not None:
        return "--readonly" if given else None
    named = settings.hosts.get(host) or next((h for h in settings.hosts.values() if h.address == host), None)
    if named is not None and "readonly" in named.settings:
        table = f"hosts.{named.name}" if named.settings["readonly"] else None
    else:
        table = "defaults" if settings.defaults.get("readonly") else None
    return None if table is None else f"readonly = true in {settings.path} [{table}]"


# The commands that change a host (their --dry-run changes nothing): read-only refuses them.
CHANGES = frozenset({"kill", "relaunch", "free-gpus", "launch", "serve", "train", "extract", "bench", "convert"})


class ReadOnly(Exception):
    """A command that changes the host, refused by the read-only setting; the message says where it is set."""


def refuse_if_readonly(ns: argparse.Namespace, hosts: list[str], settings: Config) -> None:
    """ReadOnly when the setting in force for any of the hosts is read-only, saying where it comes from."""
    for host in hosts:
        source = readonly_source(ns.readonly, host, settings)
        if source is not None:
            allow = "" if source == "--readonly" else "; --no-readonly allows it for one command"
            raise ReadOnly(f"{ns.command} refused: {host} is read-only here ({source}){allow}")


def apply_settings(ns: argparse.Namespace, settings: Config) -> None:
    """What the command line left unset, from config.toml's settings for HOST (a name there becomes its address)."""
    address, chosen = settings.settings_for(ns.host)
    if ns.host == "local":
        chosen.pop("remote_python", None)  # a default for SSH hosts; 'local' runs the agent with this Python
    else:
        ns.host = address
    for key, value in chosen.items():
        if getattr(ns, OPTION_OF.get(key, key), False) is None:
            setattr(ns, OPTION_OF.get(key, key), Path(value) if key == "workdir" else value)


def target_of(ns: argparse.Namespace) -> reuse.Target:
    """What a multiplexer of the host is keyed by (config.toml's settings applied to `ns`)."""
    from console.link import reuse  # a command on `local` needs no multiplexer

    return reuse.Target(ns.host, str(ns.workdir) if ns.workdir is not None else None, ns.remote_python)
