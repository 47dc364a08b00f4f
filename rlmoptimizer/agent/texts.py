"""What the agent keeps of a turn's texts, and what it lets reach the root LM: valid Unicode
(:func:`valid_text`), a cell's output as its head and tail (:func:`kept_output`), and no media marker of dspy's
(:func:`without_media`).

dspy's adapters turn text between its custom-type markers into media parts of a request: an example's
``dspy.Image`` input is recorded as such a marker, so printing it in a cell put a real image into the next
root-LM request (refused by a text-only model, and paid for by any other). The root LM reads about the data; the
data's media stays in the REPL, where the agent's code can still reach it.

May import: ``rlmoptimizer.agent._dspy``.
"""

from __future__ import annotations

import re
from typing import Any

from rlmoptimizer.agent._dspy import CUSTOM_TYPE_END_IDENTIFIER, CUSTOM_TYPE_START_IDENTIFIER

_MEDIA = re.compile(
    rf"{re.escape(CUSTOM_TYPE_START_IDENTIFIER)}(.*?){re.escape(CUSTOM_TYPE_END_IDENTIFIER)}", re.DOTALL
)
_PART_TYPE = re.compile(r"""["']type["']\s*:\s*["']([\w-]+)["']""")


def without_media(text: Any) -> Any:
    """``text`` with each of dspy's custom-type blocks (an image, an audio clip, a file: parts of a request, as an
    adapter renders them) replaced by a line that says what it held, and every marker left alone (half a block, as a
    cut print leaves it) made plain text, so that no later text closes it. Not a string: as it is."""
    if not isinstance(text, str) or (
        CUSTOM_TYPE_START_IDENTIFIER not in text and CUSTOM_TYPE_END_IDENTIFIER not in text
    ):
        return text

    def described(match: re.Match) -> str:
        kinds = sorted(set(_PART_TYPE.findall(match.group(1)))) or ["media"]
        return f"[{', '.join(kinds)} of {len(match.group(1)):,} characters: not shown]"

    text = _MEDIA.sub(described, text)
    return text.replace(CUSTOM_TYPE_START_IDENTIFIER, "<<custom-type-start>>").replace(
        CUSTOM_TYPE_END_IDENTIFIER, "<<custom-type-end>>"
    )


def kept_output(output: Any, max_output_chars: int) -> Any:
    """A cell's output as the history, the trajectory and the run directory keep it: its head and its tail, ten
    times what the root LM is shown of it (which is a head and a tail too), at least 100,000 characters in all,
    after a line with its true length (which the root LM sees first). A cell may print tens of MB: kept whole, every
    turn of them stayed in the host's memory and on disk. A kept output is within the bound, so keeping it again
    (a resumed run's turns) leaves it as it is."""
    keep = max(100_000, 10 * max_output_chars)
    if not isinstance(output, str) or len(output) <= keep:
        return output
    separator = "\n\n...\n\n"
    room = keep - len(separator) - 100  # the note's line is shorter than 100 characters
    note = f"[this output had {len(output):,} characters: its middle {len(output) - room:,} were not kept]"
    head = room // 2
    return f"{note}\n{output[:head]}{separator}{output[-(room - head) :]}"


def valid_text(text: Any) -> Any:
    """``text`` as valid Unicode: a lone surrogate (half of a character, which a sliced string or an LM's escape may
    hold) shown escaped, as no provider accepts it in a request."""
    if not isinstance(text, str):
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
