"""A bounded root-LM context: what of the REPL history each agent turn sends, so any run length fits the window.

``dspy.RLM`` sends the whole REPL history on every turn: turn k re-sends turns 1..k-1, the total grows with the
square of the run's length and a long run outgrows any context window. :class:`BoundedContext` turns the history
into a *view* that fits a character limit derived from the root LM's context window:

- the most recent turns are shown verbatim (as dspy shows them);
- older turns are *compacted*: their reasoning and code are clipped short, their output cut to its head and tail;
- the oldest are folded into one line each at the top of the history, and beyond that to a count;
- a *state block* (:mod:`rlmoptimizer.agent.state`: the runs so far with their scores, the current instructions,
  the budget, the agent's notes) is sent on every turn at the end of the request, so nothing the agent needs is
  lost with the old turns.

The limit starts from an estimate of 3 characters per token and then follows the root LM's tokenizer: the
characters sent and the input tokens the LM reported for them give the real ratio (4 for English prose on most
tokenizers, which the estimate would waste a quarter of the window on; 2 for code-heavy or CJK text, which it
would overflow).

Prefix caches: compaction happens rarely and in blocks. Between two compactions the view only grows by appending
the newest turn, so each request starts with the whole previous request's history (a provider's or a local
server's prompt cache reuses it), and what changes every turn (the state block, the iteration) comes last. When
the view would pass the limit, enough old turns are compacted at once to bring it down to about half the limit,
so the next compaction is many turns away. Once the window has filled, each turn's input stays about constant and
the run's total input grows linearly with its length.

A root LM that still refuses a request as too long (:func:`is_context_refusal`) makes the next view compact
harder (:meth:`BoundedContext.refused`); a resumed run starts with an empty plan and compacts its restored history
on the first turn. The full history is never changed: it stays in the trajectory and on disk.

May import what :mod:`rlmoptimizer.agent` may.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import dspy

from rlmoptimizer.agent._dspy import ChatAdapter, REPLEntry, REPLHistory
from rlmoptimizer.agent.texts import without_media
from rlmoptimizer.errors import ConfigurationError, exception_chain
from rlmoptimizer.usage import import_litellm

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "BoundedContext",
    "CompactedHistory",
    "ContextBudget",
    "context_window_of",
    "clip",
    "is_context_refusal",
    "smallest_window",
    "turn_inputs",
]

DEFAULT_CONTEXT_WINDOW = 32_000
"""Tokens assumed for a root LM whose window litellm does not know and no argument gives (a small local model's
window: safe for larger ones, which then compact earlier than they need to)."""

CHARS_PER_TOKEN = 3.0
"""Characters per token used to turn a token window into a character limit: English prose runs about 4, code
and JSON less; 3 keeps a margin."""
LEARNED_SHARE = 0.95
"""The share of the characters per token measured from the root LM's reported usage that the limit counts on."""

_REFUSAL_PATTERNS = re.compile(
    r"context[ _-]?(window|length)|maximum context|too many tokens|prompt is too long|input is too long|"
    r"reduce the length|exceeds? the (model'?s )?(max(imum)?|context)|token limit|context_length_exceeded",
    re.IGNORECASE,
)


def context_window_of(lm: Any, explicit: int | None = None) -> tuple[int, str]:
    """The root LM's input window in tokens and where the figure comes from: ``explicit`` (the
    ``root_context_window`` argument), else litellm's model information for the LM's model name, else
    :data:`DEFAULT_CONTEXT_WINDOW`."""
    if explicit is not None:
        return int(explicit), "root_context_window"
    model = getattr(lm, "model", None)
    if isinstance(model, str) and model:
        try:
            litellm = import_litellm()
            names = [model] + ([model.split("/", 1)[1]] if "/" in model else [])
            for name in names:
                entry = litellm.model_cost.get(name)
                if isinstance(entry, dict):
                    window = entry.get("max_input_tokens") or entry.get("max_tokens")
                    if isinstance(window, int) and window > 0:
                        return window, f"litellm ({name})"
        except Exception:  # pragma: no cover - litellm's table is advisory
            pass
    return DEFAULT_CONTEXT_WINDOW, "default"


def is_context_refusal(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is an LM refusing a request as too long for its
    context window: dspy's or litellm's ``ContextWindowExceededError``, or a 400-type provider error that says
    so in words."""
    for error in exception_chain(exc):
        if type(error).__name__ == "ContextWindowExceededError":
            return True
        code = str(getattr(error, "code", None) or getattr(error, "provider_code", None) or "")
        if "context_length" in code or "context_window" in code:
            return True
        status = getattr(error, "status", None) or getattr(error, "status_code", None)
        if status in (None, 400, 413, 422) and _REFUSAL_PATTERNS.search(str(error) or ""):
            return True
    return False


@dataclass(frozen=True)
class ContextBudget:
    """The character limit of one root-LM request.

    ``window_tokens`` is the root LM's input window, ``output_tokens`` what is kept free for its reply (the LM's
    ``max_tokens`` where set), ``fill`` the share of the rest a request may use (a margin for the token estimate).
    """

    window_tokens: int
    output_tokens: int = 4_000
    chars_per_token: float = CHARS_PER_TOKEN
    fill: float = 0.85

    @classmethod
    def for_lm(cls, lm: Any, explicit_window: int | None = None) -> ContextBudget:
        window, source = context_window_of(lm, explicit_window)
        budget = cls.for_window(lm, window)
        logger.debug(
            "Root LM context window: %d tokens (%s); %d kept for the reply", window, source, budget.output_tokens
        )
        return budget

    @classmethod
    def for_window(cls, lm: Any, window: int, chars_per_token: float = CHARS_PER_TOKEN) -> ContextBudget:
        """The budget of a ``window``-token window for ``lm``: its reply keeps the LM's ``max_tokens`` where set
        (4,000 otherwise), and never most of the window."""
        kwargs = getattr(lm, "kwargs", None) or {}
        max_tokens = kwargs.get("max_tokens") or kwargs.get("max_completion_tokens") or kwargs.get("max_output_tokens")
        output = int(max_tokens) if isinstance(max_tokens, int) and max_tokens > 0 else 4_000
        return cls(window_tokens=window, output_tokens=min(output, window // 4), chars_per_token=chars_per_token)

    @property
    def request_chars(self) -> int:
        return int((self.window_tokens - self.output_tokens) * self.chars_per_token * self.fill)


def smallest_window(lm: Any, request_chars: int, chars_per_token: float = CHARS_PER_TOKEN) -> int:
    """The fewest tokens of window in which :class:`ContextBudget` lets a request to ``lm`` take ``request_chars``
    characters at ``chars_per_token``."""
    low, high = 1, 1
    while ContextBudget.for_window(lm, high, chars_per_token).request_chars < request_chars:
        low, high = high, high * 2
    while low < high:  # the room a window leaves grows with the window
        middle = (low + high) // 2
        if ContextBudget.for_window(lm, middle, chars_per_token).request_chars >= request_chars:
            high = middle
        else:
            low = middle + 1
    return high


class CompactedHistory(REPLHistory):
    """A view of a REPL history: a header for the folded steps, then entries numbered from ``first_step``
    (compacted entries first, then verbatim ones). Rendered like dspy's history; used only to be shown."""

    folded: str = ""
    first_step: int = 1

    def format(self) -> str:
        if not self.entries and not self.folded:
            return "You have not interacted with the REPL environment yet."
        parts = [self.folded] if self.folded else []
        parts += [
            entry.format(index=self.first_step - 1 + i, max_output_chars=self.max_output_chars)
            for i, entry in enumerate(self.entries)
        ]
        return "\n".join(parts)


def clip(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[:limit].rstrip() + f" ... [{len(text) - limit:,} more chars]"


def _head_tail(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n... [{len(text) - limit:,} chars compacted] ...\n{text[-tail:]}"


def _first_line(text: str, limit: int) -> str:
    line = next((ln.strip() for ln in text.strip().splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclass(frozen=True)
class Compaction:
    """What a compacted turn keeps: characters of its reasoning, code and output; and a folded turn's one line."""

    reasoning: int = 300
    code: int = 500
    output: int = 600
    folded_line: int = 160


class BoundedContext:
    """Plans, turn by turn, the view of the REPL history that fits :class:`ContextBudget` (see the module
    docstring). One instance per agent run; not thread-safe (the agent takes one turn at a time).

    ``keep_recent``: the last turns always shown verbatim when they fit. ``low_water``: the share of the limit a
    compaction brings the history down to. ``compaction``: what a compacted turn keeps of its reasoning, code
    and output.
    """

    def __init__(
        self,
        budget: ContextBudget,
        *,
        max_output_chars: int = 10_000,
        keep_recent: int = 2,
        low_water: float = 0.5,
        compaction: Compaction = Compaction(),
        input_tokens: Callable[[], int] | None = None,
    ) -> None:
        self.budget = budget
        # The root LM's reported input tokens so far: the characters per token of its tokenizer are learned from
        # them (:meth:`_calibrate`), so the limit is neither a guess that overflows nor one that wastes the window.
        self._input_tokens = input_tokens
        self._tokens_before: int | None = None
        self._sent_chars = 0
        self.max_output_chars = max_output_chars
        self.keep_recent = keep_recent
        self.low_water = low_water
        self.compaction = compaction
        self.scale = 1.0  # lowered by refused()
        self.compactions = 0
        self._folded_upto = 0  # steps [0, folded_upto) are one line each in the header
        self._verbatim_from = 0  # steps [folded_upto, verbatim_from) compacted, the rest verbatim
        self._sizes: list[tuple[REPLEntry, int, int, REPLEntry, str]] = []
        self._last_shown = self._last_fixed = 0

    # -- the plan ----------------------------------------------------------------------------------------
    def limit(self, fixed_chars: int) -> int:
        """Characters the history may take in a request whose other parts (system prompt, task, state block)
        take ``fixed_chars``."""
        return max(0, int(self.budget.request_chars * self.scale) - fixed_chars)

    def view(self, history: REPLHistory, *, fixed_chars: int = 0) -> CompactedHistory:
        """The history to send this turn, within :meth:`limit`. Between compactions, the previous view plus the
        newest turn."""
        self._calibrate()
        entries = list(history)
        self._measure(entries)
        n = len(entries)
        self._folded_upto = min(self._folded_upto, n)
        self._verbatim_from = min(max(self._verbatim_from, self._folded_upto), n)
        limit = self.limit(fixed_chars)
        if self._size(n, self._folded_upto, self._verbatim_from) > limit:
            self._compact(n, limit)
        view = self._render(n)
        self._last_shown, self._last_fixed = self._size(n, self._folded_upto, self._verbatim_from), fixed_chars
        self._sent_chars += self._last_shown + fixed_chars
        return view

    def _calibrate(self) -> None:
        """Set the characters per token from the requests sent so far and the input tokens the root LM reported
        for them (a retried request or the final extraction adds tokens without characters: the estimate errs
        safe). Until the first report, :data:`CHARS_PER_TOKEN`."""
        if self._input_tokens is None:
            return
        tokens = self._input_tokens()
        if self._tokens_before is None:
            self._tokens_before = tokens  # what earlier sessions (a resumed run) used
            return
        reported = tokens - self._tokens_before
        if reported > 0 and self._sent_chars >= 1_000:
            ratio = min(8.0, max(1.0, LEARNED_SHARE * self._sent_chars / reported))
            if abs(ratio - self.budget.chars_per_token) > 0.05:
                logger.debug("Root LM: %.2f characters per token measured over %d requests' tokens", ratio, reported)
                self.budget = replace(self.budget, chars_per_token=ratio)

    @property
    def last_request(self) -> tuple[int, int]:
        """The characters of the last request built: ``(all of it, its fixed part)`` (what no compaction shortens:
        the instructions and tools, the task brief, the optimizer state)."""
        return self._last_shown + self._last_fixed, self._last_fixed

    def refused(self) -> None:
        """The root LM refused the last request as too long: the next view compacts to a smaller limit."""
        last_request = self._last_shown + self._last_fixed
        self.scale = min(self.scale * 0.6, 0.7 * last_request / max(1, self.budget.request_chars))
        logger.warning(
            "The root LM refused a request as longer than its context window; the history is "
            "compacted harder (to %.0f%% of the estimated limit) and the turn is asked again.",
            self.scale * 100,
        )

    def _compact(self, n: int, limit: int) -> None:
        target = int(limit * self.low_water)
        folded, verbatim = self._folded_upto, self._verbatim_from
        keep = max(0, n - self.keep_recent)
        # 1. turn verbatim steps into compacted ones, oldest first, down to the target (keeping the last ones).
        while verbatim < keep and self._size(n, folded, verbatim) > target:
            verbatim += 1
        # 2. fold compacted steps into one line each.
        while folded < verbatim and self._size(n, folded, verbatim) > target:
            folded += 1
        # 3. still too big for the hard limit: the recent turns are compacted too, then folded.
        while verbatim < n and self._size(n, folded, verbatim) > limit:
            verbatim += 1
        while folded < n and self._size(n, folded, verbatim) > limit:
            folded += 1
            verbatim = max(verbatim, folded)
        if (folded, verbatim) != (self._folded_upto, self._verbatim_from):
            self.compactions += 1
            logger.info(
                "Agent context compacted: steps 1-%d folded, %d-%d compacted, %d-%d verbatim (limit %d chars).",
                folded,
                folded + 1,
                verbatim,
                verbatim + 1,
                n,
                limit,
            )
        self._folded_upto, self._verbatim_from = folded, verbatim

    # -- sizes and rendering -------------------------------------------------------------------------------
    def _measure(self, entries: list[REPLEntry]) -> None:
        if len(self._sizes) > len(entries) or any(self._sizes[i][0] is not entries[i] for i in range(len(self._sizes))):
            self._sizes = []  # another history (a new run through the same agent): start over
        for i in range(len(self._sizes), len(entries)):
            entry = entries[i]
            compact = REPLEntry(
                reasoning=clip(entry.reasoning, self.compaction.reasoning),
                code=clip(entry.code, self.compaction.code),
                output=_head_tail(
                    REPLEntry.format_output(entry.output, self.max_output_chars).split("\n", 1)[-1],
                    self.compaction.output,
                ),
            )
            line = (
                f"step {i + 1}: {_first_line(entry.reasoning, self.compaction.folded_line // 2)} -> "
                f"{_first_line(entry.output, self.compaction.folded_line // 2) or '(no output)'}"
            )
            self._sizes.append(
                (
                    entry,
                    len(entry.format(index=i, max_output_chars=self.max_output_chars)) + 1,
                    len(compact.format(index=i, max_output_chars=self.max_output_chars)) + 1,
                    compact,
                    line,
                )
            )

    def _folded_lines(self, folded: int) -> list[str]:
        """One line per folded step; when they pass :meth:`folded_cap`, the oldest are dropped in blocks of half
        the cap (so the header changes rarely), leaving a count."""
        lines = [self._sizes[i][4] for i in range(folded)]
        cap = self.folded_cap()
        size = sum(len(line) + 1 for line in lines)
        omitted = 0
        while size > cap and omitted < folded:
            freed = 0
            while freed < cap // 2 and omitted < folded:
                freed += len(lines[omitted]) + 1
                omitted += 1
            size -= freed
        head = [f"steps 1-{omitted}: omitted here (see your notes and the state block)"] if omitted else []
        return head + lines[omitted:]

    def folded_cap(self) -> int:
        """Characters the one-line summaries of folded steps may take."""
        return max(400, int(self.budget.request_chars * self.scale * 0.05))

    def _folded_header(self, folded: int) -> str:
        if folded == 0:
            return ""
        return "=== Earlier steps (compacted to one line each; the full record is kept on disk) ===\n" + "\n".join(
            self._folded_lines(folded)
        )

    def _size(self, n: int, folded: int, verbatim: int) -> int:
        header = self._folded_header(folded)
        return (
            len(header)
            + (1 if header else 0)
            + sum(self._sizes[i][2] for i in range(folded, verbatim))
            + sum(self._sizes[i][1] for i in range(verbatim, n))
        )

    def _render(self, n: int) -> CompactedHistory:
        folded, verbatim = self._folded_upto, self._verbatim_from
        entries = [self._sizes[i][3] for i in range(folded, verbatim)] + [self._sizes[i][0] for i in range(verbatim, n)]
        return CompactedHistory(
            entries=entries,
            max_output_chars=self.max_output_chars,
            folded=self._folded_header(folded),
            first_step=folded + 1,
        )

    def least_history_chars(self) -> int:
        """The history a request needs room for at the least: the newest turn compacted (a turn that printed all
        it may), so the agent still reads what its last cell did."""
        entry = REPLEntry(
            reasoning="r" * self.compaction.reasoning * 2,
            code="c" * self.compaction.code * 2,
            output="o" * self.max_output_chars,
        )
        probe = BoundedContext(
            self.budget,
            max_output_chars=self.max_output_chars,
            compaction=self.compaction,
        )
        probe._measure([entry])
        return probe._sizes[0][2]

    @property
    def plan(self) -> dict[str, int]:
        """Where the view stands: steps folded, steps compacted, compactions so far."""
        return {"folded": self._folded_upto, "compacted_until": self._verbatim_from, "compactions": self.compactions}


def turn_inputs(
    context: BoundedContext | None,
    state_block: Any,
    signature: Any,
    variables_info: Any,
    history: REPLHistory,
    step: str,
) -> tuple[REPLHistory, str]:
    """The history to show and the iteration field of one agent turn. With a bounded context: the view that fits
    the window, and the state block after the iteration (the end of the request, where what changes every turn
    belongs: the history before it is a prefix of the next turn's request)."""
    if state_block is not None:
        step = f"{step}\n\n{without_media(state_block())}"  # (notes the agent wrote may quote data)
    if context is None:
        return history, step
    adapter = dspy.settings.adapter or ChatAdapter()
    empty = {"variables_info": variables_info, "repl_history": REPLHistory(), "iteration": step}
    fixed = sum(len(str(m.get("content", ""))) for m in adapter.format(signature, demos=[], inputs=empty))
    return context.view(history, fixed_chars=fixed), step


def window_too_small(size: int, fixed: int) -> ConfigurationError:
    """The root LM refused a request as too long, and a compacted history did not shorten it: what it needs is
    larger than the model's window, whatever the history."""
    return ConfigurationError(
        f"The root LM refused the agent's request ({size:,} characters) as longer than its context window, and "
        f"compacting the agent's history did not shorten it: its fixed part alone (the agent's instructions and "
        f"tools, the task brief and the optimizer state) takes {fixed:,} characters, the history at its shortest "
        f"{size - fixed:,} more. Use a root LM with a larger "
        "window, or rlm_autopilot='loop' (the default loop in Python: no root LM); root_context_window= is the "
        "window the agent plans for, so set it no larger than the model's."
    )
