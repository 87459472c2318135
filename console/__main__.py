"""`eagle3-console` (and `python -m console`): the entry, the one module that knows both the command line and the
terminal console. `--version` and `--help` alone are answered first, importing next to nothing
(`console.cli.instant`); a short command goes through a running multiplexer when it can (`console.cli.quick`: no
event loop to import); else the command line runs it, the table here tying each command of `console.cli.grammar` to what
does it over the fleet of the hosts it names (`console.cli.fleet_commands.handler_for`: a command of one host runs
on its fleet's one host); without a COMMAND, the terminal console (`console.tui`) opens on those hosts. Exit codes
and messages: `console.cli.output`.
"""

from __future__ import annotations

import os
import sys

from console.cli import instant

# typing.TYPE_CHECKING without importing typing (~3 ms of the 40 that --version has): type checkers take any
# TYPE_CHECKING as true. Everything else is imported where it is used, after `instant` had its say.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from console.cli import config, grammar
    from console.cli.fleet_commands import FleetHandler


def main() -> int:
    words = sys.argv[1:]
    code = instant.answer(words)
    if code is not None:
        return code
    from console.cli import grammar, integrity, quick

    if integrity.checks(words, grammar.command_of(words)):
        integrity.warn()
    code = quick.answer(words)
    if code is not None:
        quick.leave(code)
    return command_line(words)


class Command:
    """A command's words and what does it over the fleet of its hosts. A plain class: a dataclass here would
    import dataclasses (and inspect) before `instant` answers."""

    __slots__ = ("grammar", "run")

    def __init__(self, grammar: grammar.Grammar, run: FleetHandler) -> None:
        self.grammar = grammar
        self.run = run


def commands() -> dict[str, Command]:
    """What each command does; `--help` lists them in `console.cli.grammar.GRAMMARS`' order. Built when the
    command line runs: the quick way imports none of it."""
    from console.cli import fleet_commands, grammar

    return {g.name: Command(g, fleet_commands.handler_for(g.name)) for g in grammar.GRAMMARS}


def command_line(words: list[str]) -> int:
    import asyncio

    from console.cli import config, connect, fleet_commands, grammar
    from console.cli.config import UsageError
    from console.cli.output import EXIT_FAILED, EXIT_OK, EXIT_USAGE, note

    if "_ARGCOMPLETE" in os.environ:
        complete_and_exit()
    try:
        settings = config.load(grammar.config_flag(words))
        options, tail = grammar.split(grammar.with_host(words, settings.default_host, settings.path), grammar.GRAMMARS)
        rest = options[grammar.first_word(options) :]
        if rest[:1] == [grammar.listing.name]:
            grammar.listing.check_tail(tail)
            return fleet_commands.list_hosts(settings, grammar.listing_parser().parse_args(rest[1:]).json)
        ns = grammar.build_parser(grammar.GRAMMARS).parse_args(options)
        hosts = settings.expand(ns.host)
        named = hosts != [ns.host]  # a list or a group, even of one: the answer has the same shape for any size
        if ns.command is None:
            return open_console(ns, hosts, settings, named)
        command = commands()[ns.command]
        command.grammar.check_tail(tail)
        if command.grammar.tail == "rest":
            stage, tail = grammar.stage_options(ns.command, tail)
            vars(ns).update(vars(stage))
        if ns.command in config.CHANGES and not getattr(ns, "dry_run", False):
            config.refuse_if_readonly(ns, hosts, settings)
        nodes = getattr(ns, "nodes", None)  # a stage's or serve's: a job over the hosts
        if nodes is not None and (nodes > 1 or named) and nodes != len(hosts):
            raise UsageError(
                f"--nodes {nodes} runs one node per host: give {nodes} hosts (a,b or a group), not {len(hosts)}"
            )
        if named and nodes is None:
            fleet_commands.check(ns, tail)
        if not named:
            ns = connect.host_options(ns, hosts[0], settings)
        fleet = connect.fleet_of(ns, hosts, settings, connect.command_transport, note, named)
        return asyncio.run(fleet_commands.run_on(fleet, command.run, ns, tail))
    except (UsageError, config.ConfigError) as exc:
        note(str(exc))
        return EXIT_USAGE
    except config.ReadOnly as exc:
        note(str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_OK
    except BrokenPipeError:
        # stdout closed early (e.g. `| head`): not an error of ours.
        sys.stderr.close()
        return EXIT_OK


def complete_and_exit() -> None:
    """The shell asks for completions (argcomplete's hook set _ARGCOMPLETE): answer from the grammar (RUN from the
    host), and exit."""
    from console.cli import completion

    completion.complete()


def open_console(ns: argparse.Namespace, hosts: list[str], settings: config.Config, named: bool) -> int:
    """The terminal console (Textual) on HOST, or on several hosts at once (a HOST column, each link its own), with
    config.toml's keys and theme (the theme last chosen with `t` comes first: `console.tui.app.state_path`)."""
    from console.cli import config, connect
    from console.cli.config import UsageError
    from console.cli.output import EXIT_FAILED, EXIT_OK
    from console.tui.app import ConsoleApp
    from console.tui.keys import KeysError, keymap
    from console.tui.preferences import Preferences, state_path

    try:
        keys = keymap(settings.keys)
    except KeysError as exc:
        raise config.ConfigError(f"{settings.path}: [keys] {exc}") from None
    if not sys.stdout.isatty():
        raise UsageError("the console needs a terminal; give a COMMAND (e.g. 'status') for scripts")

    # A new host key is for the console to decide: it asks in a dialog (the app exists by then); what a link has
    # to tell (an agent repaired, a launch asked again) is a notification.
    def tell(text: str) -> None:
        app.notify(text, severity="warning", timeout=30, markup=False)

    transports = connect.transports(lambda offered: app.trust_new_key(offered), tell)
    fleet = connect.fleet_of(ns, hosts, settings, transports, tell, named)
    # One read-only host makes the whole console so.
    readonly = any(connect.host_options(ns, host, settings).readonly for host in hosts)
    preferences = Preferences(
        theme=settings.theme, keymap=keys, settings_file=str(settings.path), state_file=state_path()
    )
    app = ConsoleApp(fleet, readonly=readonly, accept_new_host_key=ns.accept_new_host_key, preferences=preferences)
    app.run()
    return EXIT_FAILED if app.return_code else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
