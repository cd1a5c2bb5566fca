"""``statehouse``: the operator's command line (installed with the client distribution; also
``python -m statehouse.client``). One module per command; docs/operations.md shows each next to
the raw HTTP calls it makes."""

from __future__ import annotations

import argparse
import sys

from statehouse.client.cli import checkpoints, rescale, restore, savepoint, serve, status
from statehouse.client.cli.common import (
    EXIT_CODES,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_LAYOUT,
    EXIT_USAGE,
    CommandError,
)
from statehouse.client.errors import LayoutError, StatehouseError, Unavailable

COMMANDS = (status, checkpoints, savepoint, restore, rescale, serve)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="statehouse",
        description="Operate a Statehouse replica set: status, savepoints, restores, rescaling, a local set.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        # One parser shape for every command: its module's docstring is its --help text.
        sub = commands.add_parser(
            command.__name__.rsplit(".", 1)[-1],
            help=command.HELP,
            description=command.__doc__,
            epilog=EXIT_CODES,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.configure(sub)
        sub.set_defaults(run=command.run)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except CommandError as exc:
        return _fail(args, str(exc), exc.code)
    except (LayoutError, Unavailable) as exc:
        return _fail(args, exc.detail, EXIT_LAYOUT)
    except StatehouseError as exc:
        return _fail(args, str(exc), EXIT_FAILED)
    except ValueError as exc:  # a malformed URL
        return _fail(args, str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return _fail(args, "interrupted", EXIT_INTERRUPTED)


def _fail(args: argparse.Namespace, message: str, code: int) -> int:
    print(f"statehouse {args.command}: {message}", file=sys.stderr)
    return code
