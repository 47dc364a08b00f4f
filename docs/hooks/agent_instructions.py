"""mkdocs hook: put the agent's instructions, as the library renders them, into the page that describes them.

A page with the marker ``<!-- agent-instructions -->`` gets, in its place, the text the root LM receives
(``rlmoptimizer.agent.prompts.render_instructions``) for an example budget, so the page cannot drift from the
code.
"""

from __future__ import annotations

MARKER = "<!-- agent-instructions -->"
TRAIN, VAL, MAX_ITERATIONS = 20, 10, 5  # the example the page states


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    from rlmoptimizer.agent.prompts import budget_note, render_instructions

    budget = MAX_ITERATIONS * TRAIN + VAL
    text = render_instructions(budget, budget_note(TRAIN, VAL, MAX_ITERATIONS))
    fence = "`" * max(3, _longest_backtick_run(text) + 1)
    return markdown.replace(MARKER, f"{fence}text\n{text.rstrip()}\n{fence}")


def _longest_backtick_run(text: str) -> int:
    longest = run = 0
    for char in text:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    return longest
