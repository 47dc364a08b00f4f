"""What a root-LM reply holds: the Python cell of its ``code`` field (:func:`cell_of`), read as tolerantly as a
small model writes it (fences, prose around them, blocks in other languages, indentation); the action of a reply
that missed the turn's fields but holds a ```python block or a code field (:func:`fenced_action`); and why a cell would not run
(:func:`syntax_error`).

May import: nothing of the package.
"""

from __future__ import annotations

import ast
import os
import re

# A fence line: ``` at the start (a tag, then maybe a note: ```python # run), or after prose that ends a sentence
# (Here is the code:```python). Not ``` inside code, such as print("```").
_FENCE = re.compile(r"^(?:[ \t]*|[^\n`]*[:.!?][ \t]*)```[ \t]*([\w+.-]*)(?:[ \t]+[^\n`]*)?[ \t]*$", re.MULTILINE)
_PYTHON_TAGS = frozenset({"", "python", "py", "python3", "py3"})
_FIELD_HEADER = re.compile(r"^[ \t]*\[\[ ## \w+ ## \]\][ \t]*$", re.MULTILINE)  # [[ ## reasoning ## ]]
_CODE_FIELD = re.compile(r"^[ \t]*\[\[ ## code ## \]\][ \t]*$", re.MULTILINE | re.IGNORECASE)


def _dedent(text: str) -> str:
    """``text`` without the indentation all its non-blank lines share; other lines (blank ones in a string) kept
    as they are, unlike ``textwrap.dedent``, which empties whitespace-only lines."""
    lines = text.split("\n")
    margins = [line[: len(line) - len(line.lstrip())] for line in lines if line.strip()]
    margin = os.path.commonprefix(margins) if margins else ""
    if not margin:
        return text
    return "\n".join(line[len(margin) :] if line.startswith(margin) else line for line in lines)


def code_of(reply: str) -> str:
    """The Python in a reply's ``code`` field (:func:`cell_of`)."""
    return cell_of(reply)[0]


def cell_of(reply: str) -> tuple[str, str]:
    """The Python in a reply's ``code`` field: its fenced blocks joined in order, as one cell, or the whole text when
    it has no fence line. A ```python block always runs; a bare ``` one runs when it parses or comes first (else it
    is taken for output the reply shows); a block tagged with another language (```text) is left out, and a reply
    whose blocks are all tagged so raises ``SyntaxError`` saying so. An unclosed last block runs to the end. When
    the joined blocks do not parse but the span from the first fence to the last does (a fence inside a string, as
    in instructions that show a ```json example), that span is the code. Fence lines wrapped around the code
    (``` then ```python) and a stray fence line (a closing fence with no opening one) are dropped. Code indented
    as a whole (as in a list item) is dedented. Second: a note for the agent when a bare block after the first was
    left out (it may be code with a syntax error, which the agent would otherwise never see), else ``""``."""
    lines = _dedent(reply).strip().splitlines()
    while (
        len(lines) >= 4
        and lines[0].strip() == lines[-1].strip() == "```"
        and lines[1].strip().startswith("```")
        and lines[-2].strip().startswith("```")
    ):
        lines = lines[1:-1]
    text = "\n".join(lines)
    fences = list(_FENCE.finditer(text))
    if not fences:
        return _dedent(text).strip(), ""
    if len(fences) == 1:  # an unclosed block, or a stray closing fence after the code
        (fence,) = fences
        _python_tag(fence)
        before, after = (_dedent(part).strip() for part in (text[: fence.start()], text[fence.end() :]))
        return after or before, ""
    blocks = [
        (opening.group(1).lower(), _dedent(text[opening.end() : closing.start() if closing else len(text)]).strip())
        for opening, closing in zip(fences[::2], [*fences[1::2], None], strict=False)  # None: unclosed
    ]
    candidates = [(tag, body) for tag, body in blocks if tag in _PYTHON_TAGS and body]
    if not candidates:
        _python_tag(fences[0])
    kept = [bool(tag) or at == 0 or parses(body) for at, (tag, body) in enumerate(candidates)]
    code = "\n\n".join(body for (_, body), keep in zip(candidates, kept, strict=True) if keep)
    if not parses(code) and fences[0].group(1).lower() in _PYTHON_TAGS:
        span = _dedent(text[fences[0].end() : fences[-1].start()]).strip()
        if parses(span):
            return span, ""
    left_out = [body for (_, body), keep in zip(candidates, kept, strict=True) if not keep]
    return code, _left_out_note(left_out)


def fenced_action(reply: str | None) -> tuple[str, str] | None:
    """A reply that did not parse into the turn's fields but holds a block tagged ```python (a model writing as in a
    chat), or a ``[[ ## code ## ]]`` field without the others: ``(reasoning, code)``, the prose before that block or
    field and the code (read by :func:`cell_of`), with any field headers it did write dropped. None when it has
    neither: a bare ``` block may be output the reply shows, and prose alone is no action."""
    text = _FIELD_HEADER.sub("", reply or "")
    first = next((fence for fence in _FENCE.finditer(text) if fence.group(1).lower() in _PYTHON_TAGS - {""}), None)
    if first is not None:
        return text[: first.start()].strip(), text[first.start() :].strip()
    field = _CODE_FIELD.search(reply or "")
    if field is None:
        return None
    after = (reply or "")[field.end() :]
    following = _FIELD_HEADER.search(after)  # ([[ ## completed ## ]] or another field after the code)
    code = (after[: following.start()] if following else after).strip()
    return (_FIELD_HEADER.sub("", (reply or "")[: field.start()]).strip(), code) if code else None


def _left_out_note(bodies: list[str]) -> str:
    if not bodies:
        return ""
    exc = syntax_error(bodies[0])
    line = getattr(exc, "lineno", None)
    detail = f" ({getattr(exc, 'msg', exc)}{f', its line {line}' if line else ''})" if exc is not None else ""
    return (
        f"[note] {len(bodies)} ``` block(s) after the first did not run: it is not valid Python{detail}. A block "
        "meant to run goes in ```python (its errors are then shown); output you expect goes in ```text."
    )


def parses(code: str) -> bool:
    return syntax_error(code) is None


def syntax_error(code: str) -> SyntaxError | ValueError | None:
    """Why ``code`` is not a cell Python can run (top-level ``await`` allowed), or None."""
    try:
        compile(code, "<cell>", "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except (SyntaxError, ValueError) as exc:
        return exc
    return None


def _python_tag(fence: re.Match) -> None:
    tag = fence.group(1).lower()
    if tag not in _PYTHON_TAGS:
        raise SyntaxError(f"the code block is tagged ```{tag}: write Python in a ```python block")


def import_note(code: str, error: str, names: frozenset[str] | set[str]) -> str:
    """What a cell that failed on an import of ``names`` (the REPL's tools) is told: they need none. "" when the
    error is not an import's or the cell imports none of them."""
    if "ModuleNotFoundError" not in error and "ImportError" not in error:
        return ""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return ""
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    asked = sorted(imported & set(names))
    if not asked:
        return ""
    shown = ", ".join(asked[:4]) + (" ..." if len(asked) > 4 else "")
    return (
        f"\n[Note] {shown}: every tool is already defined in the REPL, as a global; call it directly, with no import."
    )
