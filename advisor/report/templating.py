"""The Jinja2 environment behind every rendered file (train.py, report.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

__all__ = ["docstring_safe", "template_environment"]


def template_environment(*, autoescape: bool = False, **filters: Callable[..., Any]) -> Environment:
    """Templates shipped in advisor/report/templates; a missing variable is an error, not blank.

    HTML is autoescaped. Python and Markdown are not: each of those templates passes user
    strings through a filter made for its language (given here).
    """
    environment = Environment(
        loader=PackageLoader("advisor.report", "templates"),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=autoescape,
    )
    environment.filters.update(filters)
    return environment


def docstring_safe(text: str) -> str:
    """Text on one line that cannot end a triple-quoted docstring or start a new line of code
    (or of YAML)."""
    one_line = " ".join(str(text).split())
    return one_line.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
