"""What every command shares: exit codes and a parser whose mistakes are user errors."""

from __future__ import annotations

import argparse
import sys

from orchestrator.errors import UserError

EXIT_OK, EXIT_FAILED, EXIT_USER_ERROR = 0, 1, 2


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own mistakes are user errors too: exit 2, no traceback
        self.print_usage(sys.stderr)
        raise UserError(f"{message}. Fix: see `{self.prog} --help`.")


def add_mode_options(command: argparse.ArgumentParser) -> None:
    """--local / --ray: where a run goes (driver/local.py); by default, local mode for one node with
    no cluster named (--address, RAY_ADDRESS) or up (`orchestrator up`), else Ray."""
    modes = command.add_mutually_exclusive_group()
    modes.add_argument("--local", dest="mode", action="store_const", const="local",
                       help="run on this machine without Ray: the agent in this process (one node, a fixed size)")
    modes.add_argument("--ray", dest="mode", action="store_const", const="ray",
                       help="run on Ray: the cluster at --address or RAY_ADDRESS, the warm one, or an embedded one")
    command.set_defaults(mode="auto")
