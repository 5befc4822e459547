"""The ``trainscale`` command line: predict runs, search plans, validate, calibrate, list catalogs.

Every input error is reported as one line on stderr (``trainscale: error: ...``) with exit
status 2 and nothing on stdout; input is validated completely before anything is printed.

One module per command group, each holding its commands (``cmd_*``) and their arguments (``add_parsers``), in
the order ``trainscale --help`` lists them:

* :mod:`.predict`: ``predict``
* :mod:`.search`: ``search``, ``scale``
* :mod:`.plan`: ``plan``, ``plan-cluster``
* :mod:`.measured`: ``validate``, ``calibrate``
* :mod:`.outputs`: ``verify``, ``gallery``, ``docs``, ``publish-notebook``, ``install-outputs``
* :mod:`.data`: ``fetch-trace``, ``systems``, ``models``

:mod:`.shared` holds what they share (the one-line error, tables, JSON, argument types); this module assembles
the parser and runs a command (:func:`main`: the ``trainscale`` console script, ``python -m
trainscale.interface.cli``).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from ... import __version__
from . import data, measured, outputs, plan, predict, search
from .shared import PROG, CLIError, OneLineParser, _one_line

__all__ = ["main", "build_parser"]

# the command groups, in the order `trainscale --help` lists their commands
COMMAND_GROUPS = (predict, search, plan, measured, outputs, data)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)
    for group in COMMAND_GROUPS:
        group.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ...model.specs import SpecError

    try:
        return args.func(args)
    except (SpecError, CLIError) as exc:
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for SIGINT
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `trainscale models | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
