"""mkdocs hook: show Sphinx roles left in docstrings (``:class:`X```, ``:meth:`~a.b.c```) as plain code.

The code's docstrings name other objects the Sphinx way, which reads well in ``help()``; mkdocstrings renders
Markdown, where the role would show as text (":class:X"). This drops the role and, as Sphinx does for ``~``,
keeps the last part of a dotted name.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:py:)?(?:attr|class|data|exc|func|meth|mod|obj):<code>(~?)([^<]*)</code>")


def _plain(match: re.Match) -> str:
    tilde, name = match.groups()
    return f"<code>{name.rsplit('.', 1)[-1] if tilde else name}</code>"


def on_page_content(html: str, page, config, files) -> str:
    return _ROLE.sub(_plain, html)
