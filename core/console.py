"""How every ``pdserve`` command reports a failure: one red ``error:`` line on stderr, no
traceback, and a non-zero exit (2 by default). The serving commands, ``pdserve bench`` and
``pdserve size`` all print through here, so the line reads the same whichever failed."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape


def print_error(message: str) -> None:
    """``error: <message>`` in red on stderr (the message is printed as is, never as markup)."""
    Console(stderr=True, soft_wrap=True).print(
        f"[bold red]error:[/] {escape(message)}", highlight=False
    )


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``message`` as an error and end the command with exit status ``code``."""
    print_error(message)
    raise typer.Exit(code)
