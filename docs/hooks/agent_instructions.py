"""mkdocs hook: put the agent's instructions, as the library renders them, into the page that describes them.

A page with the marker ``<!-- agent-instructions -->`` gets, in its place, the text the root LM receives
(``rlmoptimizer.agent.prompts.render_instructions``) for an example budget, so the page cannot drift from the
code.
"""

from __future__ import annotations

import html

MARKER = "<!-- agent-instructions -->"
TRAIN, VAL, MAX_ITERATIONS = 20, 10, 5  # the example the page states


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    from rlmoptimizer.agent.prompts import budget_note, render_instructions

    budget = MAX_ITERATIONS * TRAIN + VAL
    text = render_instructions(budget, budget_note(TRAIN, VAL, MAX_ITERATIONS))
    # Raw HTML, so the long lines wrap (see stylesheets/extra.css) instead of scrolling sideways.
    return markdown.replace(MARKER, f'<pre class="agent-prompt"><code>{html.escape(text.rstrip())}</code></pre>')
