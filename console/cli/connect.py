"""How the command line reaches its hosts: a host's transport (over SSH through its shared connection unless
--no-reuse), who trusts a new host key, and the fleet of the hosts a command names, each with its own settings
from config.toml."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from console.cli import config
from console.cli.config import UsageError

if TYPE_CHECKING:
    from console.fleet.hosts import Fleet
    from console.link.host_keys import TrustNewKey
    from console.link.transport import Transport

TransportFor = Callable[[argparse.Namespace], "Transport"]  # a host's transport, given its options


def make_transport(
    ns: argparse.Namespace, trust_new_key: TrustNewKey | None = None, say: Callable[[str], None] | None = None
) -> Transport:
    """`trust_new_key` decides on a host key seen for the first time; None refuses it. `say` tells the person
    what the transport put right on the host (a repaired copy of the agent); None: a line on stderr."""
    from console.link.local import LocalTransport

    if ns.host == "local":
        if ns.remote_python is not None:
            raise UsageError("--remote-python names the Python of an SSH host; 'local' runs the agent with this one")
        return LocalTransport(ns.workdir)
    from console.link.ssh import DEFAULT_PYTHON, SSHTransport  # asyncssh is needed only for another host

    try:
        transport = SSHTransport(ns.host, ns.workdir, ns.remote_python or DEFAULT_PYTHON)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    transport.trust_new_key = trust_new_key
    if say is not None:
        transport.say = say
    return transport


def transports(trust_new_key: TrustNewKey, say: Callable[[str], None]) -> TransportFor:
    """Each host's transport, direct, `trust_new_key` deciding on a host key seen for the first time and `say`
    telling what a transport put right (the console: a dialog and a notification)."""
    return lambda own: make_transport(own, trust_new_key, say)


def terminal_trust(ns: argparse.Namespace) -> TrustNewKey | None:
    """Who trusts a new host key for a command: the flag, else the person at the terminal, else nobody."""
    if ns.host == "local":
        return None
    from console.link import host_keys  # asyncssh is needed only to reach another host

    if ns.accept_new_host_key:
        return host_keys.accept_and_say
    return host_keys.ask_on_terminal if sys.stdin.isatty() and sys.stderr.isatty() else None


def command_transport(ns: argparse.Namespace) -> Transport:
    """A command's transport: over SSH through the host's shared connection (`console.link.reuse`) unless
    --no-reuse; the direct one, with its host key checks, when none serves yet."""
    if ns.host == "local" or ns.no_reuse:
        return make_transport(ns, terminal_trust(ns))
    from console.link.reuse_transport import ReusingTransport  # asyncssh only when a direct connection is needed

    return ReusingTransport(config.target_of(ns), lambda: make_transport(ns, terminal_trust(ns)))


def host_options(ns: argparse.Namespace, host: str, settings: config.Config) -> argparse.Namespace:
    """The command's options for one of its hosts: what the command line left unset, from that host's settings."""
    own = argparse.Namespace(**vars(ns))
    own.host = host
    config.apply_settings(own, settings)
    return own


def fleet_of(
    ns: argparse.Namespace,
    hosts: list[str],
    settings: config.Config,
    transport: TransportFor,
    say: Callable[[str], None],
    named: bool,
) -> Fleet:
    """The fleet of the command's hosts, each on its own connection with its own settings; `say` hears what a
    host's link has to tell (prefixed with the host)."""
    from console.fleet.hosts import Fleet, Member
    from console.link.client import AgentClient

    members = []
    for name in hosts:
        own = host_options(ns, name, settings)
        member = Member(name, AgentClient(transport(own), own.timeout_s), getattr(own, "stall_after", None), say)
        member.client.say = member.say if named else say
        members.append(member)
    return Fleet(members, named)
