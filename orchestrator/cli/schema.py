"""`orchestrator schema`: the JSON Schema of the job spec, for editors."""

from __future__ import annotations

import argparse

from orchestrator.cli.common import EXIT_OK


def add(commands) -> None:
    schema = commands.add_parser("schema", help="print the JSON Schema of the job spec (for editors: "
                                       "# yaml-language-server: $schema=spec.schema.json)")
    schema.set_defaults(handle=handle)


def handle(args: argparse.Namespace) -> int:
    from orchestrator.spec.schema import schema_text

    print(schema_text(), end="")
    return EXIT_OK
