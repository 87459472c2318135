"""`eagle3-console` (and `python -m console`): a one-shot command through a running multiplexer when it can be
(`console.cli.quick`: no event loop to import), else the whole command line (`console.cli.commands`), or, without
a COMMAND, the terminal console (`console.tui`) on the hosts named."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from console.cli import quick

if TYPE_CHECKING:
    from console.cli import config
    from console.link.transport import Transport


def main() -> int:
    words = sys.argv[1:]
    code = quick.answer(words)
    if code is None:
        from console.cli import commands

        code = commands.main(words, open_console)
    return code


def open_console(ns: argparse.Namespace, hosts: list[str], settings: config.Config, named: bool) -> int:
    """The terminal console (Textual) on HOST, or on several hosts at once (a HOST column, each link its own)."""
    from console.cli import connect
    from console.cli.grammar import UsageError
    from console.cli.output import EXIT_FAILED, EXIT_OK
    from console.tui.app import ConsoleApp

    if not sys.stdout.isatty():
        raise UsageError("the console needs a terminal; give a COMMAND (e.g. 'status') for scripts")

    # A new host key is for the console to decide: it asks in a dialog (the app exists by then); what a link has
    # to tell (an agent repaired, a launch asked again) is a notification.
    def tell(text: str) -> None:
        app.notify(text, severity="warning", timeout=30, markup=False)

    def transport_of(own: argparse.Namespace) -> Transport:
        return connect.make_transport(own, lambda offered: app.trust_new_key(offered), tell)

    fleet = connect.fleet_of(ns, hosts, settings, transport_of, tell, named)
    # One read-only host makes the whole console so.
    readonly = any(connect.host_options(ns, host, settings).readonly for host in hosts)
    app = ConsoleApp(fleet, readonly=readonly, accept_new_host_key=ns.accept_new_host_key)
    app.run()
    return EXIT_FAILED if app.return_code else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
