"""A griffe extension for the API reference: renders jobfence's reST-flavoured docstrings as
Markdown.

The docstrings are written with Sphinx roles (``:func:`retry_unit```, ``:class:`Locks```) and
reST literal blocks introduced by ``::``; mkdocstrings renders docstrings as Markdown, where
both would show as raw text. On loading each object, this extension turns a role into a code
span (``retry_unit``) and a trailing ``::`` into ``:`` (the indented block that follows is a
Markdown code block already). ``mkdocs.yml`` loads it for the python handler.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

#: ``:func:`name```, ``:meth:`~pkg.Class.name```, ``:py:class:`X``` ...
ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj|const|ref):`~?([^`]+)`")
#: a paragraph line that ends with ``::`` (a literal block follows)
LITERAL = re.compile(r"(?m)(\S)::$")
#: a line that is only ``::``
BARE_LITERAL = re.compile(r"(?m)^(\s*)::$")


def to_markdown(text: str) -> str:
    """The docstring ``text`` with its reST roles and ``::`` markers made Markdown."""
    text = ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    text = BARE_LITERAL.sub(r"\1", text)
    return LITERAL.sub(r"\1:", text)


class RstToMarkdown(griffe.Extension):
    """Rewrites every loaded docstring with :func:`to_markdown`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
