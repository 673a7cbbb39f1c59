"""MkDocs hook: tidy the reST idioms of te_cudnn's docstrings in the rendered API reference.

The docstrings are written for reading in the source: Sphinx roles (``:func:`explain```,
``:class:`~te_cudnn.BatchLengths```) and literal-block markers (``Equivalent PyTorch::``).
Markdown renders the backquoted part as code and leaves the role name and the ``::`` as text;
this hook drops the role name (keeping only the last dotted part after ``~``, as Sphinx does)
and turns a paragraph-final ``::`` into ``:``. It touches rendered HTML only, never the code.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const|term):<code>(~)?([^<]*)</code>")


def _role(match: re.Match) -> str:
    text = match.group(2)
    if match.group(1):
        text = text.rsplit(".", 1)[-1]
    return f"<code>{text}</code>"


def on_page_content(html: str, **kwargs) -> str:
    html = _ROLE.sub(_role, html)
    return html.replace("::</p>", ":</p>")
