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
