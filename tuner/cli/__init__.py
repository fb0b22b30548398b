"""The ``tuner`` command line: the study commands and the parser (``main``), the runner command
(``runner``) and the registry commands (``configs``). The top layer of tuner, beside ``api``, which it
does not import (``tuner serve`` names the app to uvicorn as an import string)."""

from tuner.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
