"""mkdocs hook: put the agent's instructions, as the library renders them, into the page that describes them.

A page with the marker ``<!-- agent-instructions -->`` gets, in its place, the instructions the root LM receives
on every turn (``rlmoptimizer.agent.prompts.action_signature``: the task, how a turn works, the sandbox's rules and
the tool list) for an example budget, so the page cannot drift from the code.
"""

from __future__ import annotations

import html

MARKER = "<!-- agent-instructions -->"
TRAIN, VAL, MAX_ITERATIONS = 20, 10, 5  # the example the page states


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    from rlmoptimizer.agent.prompts import action_signature, budget_note, render_instructions
    from rlmoptimizer.agent.window import unbound_tools
    from rlmoptimizer.sandbox.limits import INSTRUCTIONS

    budget = MAX_ITERATIONS * TRAIN + VAL
    task = render_instructions(budget, budget_note(TRAIN, VAL, MAX_ITERATIONS))
    text = action_signature(task, unbound_tools(), INSTRUCTIONS).instructions
    # Raw HTML, so the long lines wrap (see stylesheets/extra.css) instead of scrolling sideways.
    return markdown.replace(MARKER, f'<pre class="agent-prompt"><code>{html.escape(text.rstrip())}</code></pre>')
