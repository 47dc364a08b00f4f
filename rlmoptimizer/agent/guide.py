"""The default loop, one concrete line at a time, and the notice for a turn that changed nothing.

A small root LM does not compose tools from a description; it copies code it is shown. :class:`LoopGuide`
follows the agent's moves (the tools report them) and names the next line of the default loop with real
step names, candidate ids and example ids filled in, so that it runs as written:

    run GEPA (the gepa package's engine) with most of the budget -> adopt its best and check it on validation ->
    targeted work on what it still fails, with what is left: propose for a step -> compare against the current
    prompts on its check ids -> adopt the winner and check it on validation -> ... -> SUBMIT when the budget is spent

An adoption and its validation checkpoint are one line (one turn, when the check can be paid): every turn of a
small root LM costs its whole request again.

GEPA gets everything unless what is left after it can pay one targeted round (a proposal, a comparison and a
validation check): a root LM that only copies the line it is shown therefore gets GEPA's result. GEPA stops when
what is left cannot pay a child it could keep (a minibatch and the whole validation set); when that still pays one
validation check, the last line is one more proposal, adopted and checked on validation at once.

The moves never spend the units one check of the submission needs (on validation, or on train without a
validation split), so what gets adopted can still be checked (with ``max_metric_calls`` nothing unchecked is
returned). A proposal learns from failures: when the current instructions fail no train example evaluated with them, the
next line evaluates the train examples they have not seen yet, and SUBMIT once they pass every one.

The line closes the state block of every turn and every repeat notice. It is a suggestion: an agent that
does its own analysis is never held to it, and the guide picks up from whatever it did last. Some lines ask for no
decision (:meth:`LoopGuide.follow_on`: the adoption of GEPA's best, the last draw); after a cell that ran the line
as shown, the agent runs them in the same turn rather than asking the root LM for one more.

May import: ``rlmoptimizer.agent._dspy`` (the history type); it sees the moves only as the values the tools pass it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Collection, Sequence
from typing import Any

from rlmoptimizer.agent._dspy import REPLHistory

SUBMIT_LINE = "SUBMIT(optimized_dspy_program=optimization_status()['current_prompts'])"
PROPOSALS_PER_BUDGET = 3
"""A comparison takes at most this share of what the moves may spend (down to :data:`MIN_CHECK` examples), so
that a small budget still buys several proposals, as GEPA's minibatches do; a large one compares on every
check id. Validation, checked after an adoption, guards against a lucky win on few examples."""
MIN_CHECK = 3
"""The fewest examples a comparison is cut to (GEPA's default minibatch)."""
MIN_USEFUL_BUDGET = 3
"""Below this many units to spend (beyond one validation check), a new proposal and its comparison cannot both be
paid: the guide says SUBMIT."""
TARGETED_SHARE = 5
"""After GEPA, the targeted work gets a fifth of what is left, when that pays a whole round (a proposal, a
comparison on :data:`MIN_CHECK` examples against the current prompts, and a validation check); else GEPA gets all."""


def _ids_text(ids: Sequence[int]) -> str:
    return ",".join(str(i) for i in ids)


class LoopGuide:
    """The state of the default loop, told by the tools after each move that succeeded."""

    def __init__(
        self,
        step_names: Sequence[str],
        budget_left: Callable[[], int],
        val_size: int = 0,
        train_status: Callable[[], tuple[list[int], int]] | None = None,
        train_size: int = 0,
        proposals_left: Callable[[], int] | None = None,
        proposals_share_budget: bool = True,
    ) -> None:
        """``proposals_share_budget``: a proposal is paid from the same units as an evaluation (False with
        ``max_metric_calls``, where sub-LM prompts have an allowance of their own)."""
        self._steps = list(step_names)
        self._proposal_units = 1 if proposals_share_budget else 0
        self._left = budget_left
        self._val_size = val_size
        # Units the moves leave for one check of what gets submitted: on validation, else on the whole train set.
        self._reserve = val_size or train_size
        # (train ids not yet evaluated with the current instructions, how many evaluated ones fail)
        self._train_status = train_status or (lambda: ([], 1))
        # sub-LM prompts left for a proposal (with max_metric_calls they have an allowance of their own)
        self._proposals_left = proposals_left or budget_left
        self._lock = threading.Lock()
        self._proposed: dict[str, int] = dict.fromkeys(self._steps, 0)
        self._pending: dict[str, Any] | None = None  # a proposal not yet compared
        self._winner: str | None = None  # a compared candidate that beat the current prompts, not yet adopted
        self._unchecked = False  # the current prompts changed since the last validation run
        self._gepa_ran = False
        self._proposals_before_gepa_ended = 0  # proposals made when the last GEPA run ended

    # -- what the tools report ------------------------------------------------------------------------
    def proposed(
        self, step: str, candidate_ids: Sequence[str], check_ids: Sequence[int], failure_ids: Sequence[int] = ()
    ) -> None:
        """A proposal: compare it on ``check_ids``, failures and other examples taken in turn, so that a
        comparison cut short to fit the budget still checks both what it should fix and what it may break."""
        failures = [i for i in check_ids if i in set(failure_ids)]
        others = [i for i in check_ids if i not in set(failure_ids)]
        order = [i for pair in zip(failures, others, strict=False) for i in pair]
        order += failures[len(others) :] + others[len(failures) :]
        with self._lock:
            self._proposed[step] = self._proposed.get(step, 0) + 1
            self._pending = {"step": step, "ids": list(candidate_ids), "check": order}
            self._winner = None

    def compared(self, sources: Sequence[str], best: int, split: str) -> None:
        with self._lock:
            if split == "val":  # a comparison on validation checks the current prompts when it includes them
                self._unchecked = self._unchecked and "current" not in sources
                return
            self._pending = None
            source = sources[best] if 0 <= best < len(sources) else "current"
            first = sources[0] if sources else "current"
            # A winner other than what the comparison measured against, named so that adopt_candidate takes it.
            self._winner = source if source != first and source.startswith(("proposal-", "run-")) else None

    def gepa_finished(self, best_new: str | None) -> None:
        """A GEPA run ended; ``best_new`` is its best candidate when that is not where it started."""
        with self._lock:
            self._gepa_ran = True
            self._proposals_before_gepa_ended = sum(self._proposed.values())
            self._pending = None
            self._winner = best_new

    def gepa_budget(self, left: int) -> int:
        """What the default line gives GEPA of ``left`` units."""
        tail = left // TARGETED_SHARE
        return left - tail if tail >= self._reserve + 1 + 2 * MIN_CHECK else left

    def adopted(self, candidate: Any) -> None:
        """``candidate`` was adopted, whether or not that changed the instructions (a proposal may repeat them):
        neither its comparison nor its adoption is a next line any more."""
        with self._lock:
            if self._winner is not None and self._winner == candidate:
                self._winner = None
            if self._pending is not None and candidate in self._pending["ids"]:
                self._pending = None

    def changed(self) -> None:
        with self._lock:
            self._winner = None
            self._unchecked = True

    def validated(self) -> None:
        with self._lock:
            self._unchecked = False

    # -- what the agent is shown ----------------------------------------------------------------------
    def next_line(self) -> str:
        """The next line of the default loop, runnable as written."""
        return self._next()[0]

    def follow_on(self) -> str | None:
        """The next line when it asks for no decision of the agent's, else None: the adoption of the best candidate
        of the GEPA run that just ended, with its validation check (free: GEPA scored it there), or the last draw
        (the one move of the loop that what is left after GEPA pays). The agent runs it in the same turn after a
        cell that ran the loop's line as shown (a root LM that follows the loop): each turn costs a whole request."""
        line, decided = self._next()
        return line if decided else None

    def _next(self) -> tuple[str, bool]:
        """The next line, and whether it asks for no decision (see :meth:`follow_on`)."""
        left = self._left()
        with self._lock:
            gepa_best = self._winner is not None and self._winner.startswith("gepa-")
            if left <= 0 and not gepa_best:  # (GEPA's best is adopted and checked for free)
                return SUBMIT_LINE, False
            if self._winner is not None:
                adopt = f"print(adopt_candidate({self._winner!r}))"
                # the checkpoint goes with the adoption when it can be paid (GEPA's best: already scored there, free)
                if self._val_size and (gepa_best or left >= self._val_size):
                    return f"{adopt}; print(evaluate_program(split='val'))", gepa_best
                return adopt, gepa_best and not self._val_size
            if self._unchecked and self._val_size and left >= self._val_size:
                return "print(evaluate_program(split='val'))", False
            if not self._gepa_ran:
                return f"r = run_gepa(budget={self.gepa_budget(left)}); print(r['summary'])", False
            free = left - self._reserve  # what moves may spend
            pending = self._pending
            if pending is not None and free > 0:
                per_candidate = free // max(1, len(pending["ids"]))
                check = pending["check"][: min(per_candidate, max(MIN_CHECK, per_candidate // PROPOSALS_PER_BUDGET))]
                if check:
                    names = ", ".join(repr(i) for i in ["current", *pending["ids"]])
                    return f"r = compare([{names}], ids='{_ids_text(check)}'); print(r['summary'])", False
            unevaluated, failing = self._train_status()
            if free < MIN_USEFUL_BUDGET:
                line = self._last_draw(left, failing)
                return line, line != SUBMIT_LINE
            if not failing:  # nothing to reflect on: find failures first, or stop when train has none
                if not unevaluated:
                    return SUBMIT_LINE, False
                return f"print(evaluate_program(ids='{_ids_text(unevaluated[:free])}')['score'])", False
            if self._proposals_left() <= 0:  # no proposal can be paid: nothing else in the loop to do
                return SUBMIT_LINE, False
            step = self._next_step()
            return f"p = propose_instructions({step!r}); print(p['texts'])", False

    def _last_draw(self, left: int, failing: int) -> str:
        """What is left after GEPA cannot pay a comparison on train besides the submission's check, but it may pay
        one proposal checked on validation directly. Those units have no other use (``dspy.GEPA`` spends past its
        budget on such a check), and never-worse returns the better of the two checked programs. Once, after GEPA,
        when there are failures to learn from."""
        if (
            not self._gepa_ran
            or not self._val_size
            or not failing
            or sum(self._proposed.values()) != self._proposals_before_gepa_ended
            or left < self._val_size + self._proposal_units
            or self._proposals_left() <= 0
        ):
            return SUBMIT_LINE
        step = self._next_step()
        return (
            f"p = propose_instructions({step!r}); print(adopt_candidate(p['candidate_ids'][0])); "
            "print(evaluate_program(split='val'))"
        )

    def _next_step(self) -> str:
        """Round robin over the steps, as GEPA selects components: the step proposed for least often; on a
        tie the later step (the last one writes the program's output, which the metric judges)."""
        return min(reversed(self._steps), key=lambda s: self._proposed.get(s, 0))

    def describe(self) -> str:
        return f"Next line of the default loop (or your own move): {self.next_line()}"


# -- the notice for a turn that repeated an earlier one ---------------------------------------------------
NOTICE = "\n[Notice] "
_NO_OP = "running it again changes nothing"
_ERROR = "[Error]"
_REFUSED = "[Error] AgentToolError"  # a tool refused the call (bad arguments, nothing left to pay it with)
AUTOPILOT = "[Autopilot]"


def autopilot_step(history: REPLHistory, code: str, next_line: str | None) -> str | None:
    """Why the autopilot runs ``next_line`` in place of the cell ``code``, or None: running ``code`` again is
    known to change nothing (it repeats a cell that already proved so, and the notice said so once), and the next
    line is something else."""
    if next_line is None or same_code(next_line) == same_code(code):
        return None
    repeated = known_no_op(history, code)
    return f"repeated step {repeated} and changed nothing" if repeated is not None else None


def idle_follow_up(
    history: REPLHistory,
    code: str,
    next_line: str | None,
    idle_steps: Collection[int],
    driven_steps: Collection[int] = (),
) -> str | None:
    """Why the autopilot runs ``next_line`` after the cell ``code``, which has just run, called no tool and printed
    nothing, or None. It does when the turn before was such a cell too (one of ``idle_steps``, 1-based) or a turn
    the autopilot drove for a stuck agent (one of ``driven_steps``: a line in place of its cell, or after an idle
    or refused one): a small root LM writes cell after cell that cannot act (a comment, a function it never
    calls). A turn that followed the loop's line as shown is not one: a capable agent's helper cell after it is
    its own. The cell's own effects stay (a silent helper cell loses nothing), and the line is never SUBMIT:
    ending the run is left to the agent, or to the turn limit."""
    if next_line is None or next_line == SUBMIT_LINE or same_code(next_line) == same_code(code):
        return None
    if not history.entries:
        return None
    if len(history.entries) in driven_steps:
        return "called no tool and printed nothing"
    if len(history.entries) in idle_steps:
        return f"called no tool and printed nothing, as step {len(history.entries)} did"
    return None


def refused_repeat(history: REPLHistory, code: str, output: str, next_line: str | None) -> str | None:
    """Why the autopilot runs ``next_line`` after the cell ``code``, which has just run with ``output``, or None. It
    does when the cell repeated an earlier step's code and a tool refused it (its budget is spent, its candidate
    is gone), or it failed with the very error it failed with before: a small root LM copies its last cell, and
    such a copy changed nothing. The next line may be SUBMIT, as in place of a known no-op, unless the earlier run
    failed too (bad arguments, likely): that gets the notice first, and ending the run waits for another repeat."""
    if next_line is None or same_code(next_line) == same_code(code) or not output.startswith(_ERROR):
        return None
    code = same_code(code)
    runs = [i + 1 for i, entry in enumerate(history.entries) if code and same_code(entry.code) == code]
    earlier = [history.entries[i - 1].output.split(NOTICE)[0] for i in runs]
    if not runs or not (output.startswith(_REFUSED) or output in earlier):
        return None
    if next_line == SUBMIT_LINE and any(out.startswith(_ERROR) for out in earlier):
        return None
    how = "a tool refused it" if output.startswith(_REFUSED) else "it failed as it did then"
    return f"repeated step {runs[0]} and {how}"


def import_hint(code: str, output: str, tool_names: Collection[str]) -> str:
    """``output`` with a hint when the cell failed importing one of the REPL's tools (``from gepa import run_gepa``:
    small root LMs write it, and no such module is in the sandbox): they are defined already."""
    if not output.startswith(("[Error] ModuleNotFoundError", "[Error] ImportError")):
        return output
    imports = " ".join(re.findall(r"^[ \t]*(?:from[ \t]+\S+[ \t]+)?import[ \t]+([^\n#]+)", code, re.MULTILINE))
    named = sorted(name for name in tool_names if re.search(rf"\b{re.escape(name)}\b", imports))
    if not named:
        return output
    what = f"{named[0]} is a tool" if len(named) == 1 else f"{', '.join(named)} are tools"
    return f"{output}\n[Hint] {what} of this REPL, already defined: call {'it' if len(named) == 1 else 'them'} without an import."


def follows_the_loop(code: str, shown: str | None) -> bool:
    """Whether the cell ``code`` is the default loop's line ``shown`` at the start of its turn, as written."""
    return shown is not None and same_code(code) == same_code(shown)


IDLE_NOTICE = (
    "This cell called no tool and printed nothing: it changed nothing. After a next cell like it, the default "
    "loop's next line runs: "
)


def known_no_op(history: REPLHistory, code: str) -> int | None:
    """The step that first ran ``code``, when running it again is known to change nothing (an earlier repeat of it
    got the same output, or a tool refused it, and the notice said so), else None. The agent has then been told
    once, with the line to run instead, and did not act on it: the autopilot runs that line in its place."""
    code = same_code(code)
    runs = [i for i, entry in enumerate(history.entries) if code and same_code(entry.code) == code]
    return runs[0] + 1 if any(_NO_OP in history.entries[i].output for i in runs) else None


def same_code(code: str) -> str:
    """``code`` with its whitespace normalized: two cells are the same cell when these are equal."""
    return " ".join(code.split())


def note_repeat(history: REPLHistory, new: REPLHistory, next_line: str | None = None) -> REPLHistory:
    """``new`` with a notice appended to its last output when that turn ran the code of an earlier turn again.
    With the same output it changed nothing; with another (a proposal samples a new text each time) the loop
    may have moved on, and the notice names its next line unless that is the very code just run. A stuck agent
    (small root LMs copy their own last cell) is told which line moves the optimization on instead of spending
    its turns, and budget, on the same cell. The notice goes at the end, which the history's head+tail
    truncation keeps."""
    last = new.entries[-1]
    code = same_code(last.code)
    runs = [i + 1 for i, entry in enumerate(history.entries) if code and same_code(entry.code) == code]
    same_output = [i for i in runs if history.entries[i - 1].output.split(NOTICE)[0] == last.output]
    if not same_output and (not runs or next_line is None or same_code(next_line) == code):
        return new  # new code, or a cell run again on purpose (the loop's own next line): nothing to say
    earlier = same_output or runs
    where = f"step {earlier[0]}" if len(earlier) == 1 else f"steps {', '.join(map(str, earlier))}"
    if not same_output and last.output.startswith(_REFUSED):
        # run again, it was refused: as good as the same output, and the next repeat is the autopilot's
        notice = f"This code ran at {where}; run again, a tool refused it: {_NO_OP}. Run this next instead: {next_line}"
    elif not same_output:
        notice = f"The same code ran at {where}. The default loop's next line is: {next_line}"
    else:
        times = "once" if len(earlier) == 1 else f"{len(earlier)} times"
        todo = (
            f"Run this next instead: {next_line}"
            if next_line
            else "Do something different: analyse `baseline_train['examples']` or a run from `run_data(...)`, write "
            "new instructions with `update_prompt`, check them with `evaluate_program`, or SUBMIT."
        )
        notice = f"This code already ran {times} ({where}) with this same output: {_NO_OP}. {todo}"
    return history.append(reasoning=last.reasoning, code=last.code, output=f"{last.output}{NOTICE}{notice}")
