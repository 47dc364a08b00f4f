"""The moves: the steps fixed-algorithm optimizers make, each one call away, as a library the agent's tools
and the default loop without an agent (the pilot, through the same tools) both call.

GEPA's reflective proposal from traces and metric feedback (:meth:`Moves.propose_instructions`, built on
dspy's own ``dspy.teleprompt.gepa.InstructionProposer``), its paired comparison of candidates on the same
examples (:meth:`Moves.compare`) and its Pareto set of candidates (:meth:`Moves.candidates`); the failure
replay set (:meth:`Moves.hard_examples`), repeated rollouts for noisy scores (:meth:`Moves.evaluate_rollouts`)
and the contrast of two runs' traces for credit assignment (:meth:`Moves.diff_runs`); the analysis of a whole
run's failures, grouped by what code sees and by the causes the sub-LM names (:meth:`Moves.analyze_failures`),
whose groups a proposal can be written for (``propose_instructions(..., group=...)``).

The moves work over stored :class:`~rlmoptimizer.records.EvalRun` records and three small interfaces, so
they do not depend on the agent, nor on where its tools live:

* ``runs``: the run service (``get(run_id)``, ``runs()``, ``splits``, ``stored(instructions, split, ids,
  rollout)``);
* ``evaluate(instructions, split, ids, *, rollout, label, reservation)``: evaluate a full ``{step: text}``
  map on a copy of the program (the current prompts never change), store and return the run;
* ``ledger``: the :class:`~rlmoptimizer.budget.BudgetLedger`.

Budget, as everywhere: 1 unit per newly evaluated example per rollout, 1 unit per proposal LM call that
answered, 1 per analysis prompt that answered (at most ``MAX_PROMPTS`` an analysis); stored records and answers
are reused free. A move that evaluates or analyses first works out what it will cost and refuses, spending
nothing, when the budget cannot cover all of it (a paired comparison on half its examples would compare nothing). Refusals raise :class:`~rlmoptimizer.errors.AgentToolError` saying what was wrong
-> what to do.

Rooms:
    context.py   what the moves share: the interfaces and the checks
    proposal.py  ``propose_instructions`` and the reflective dataset it is built from
    failures.py  what a failure analysis is made of and what code sees of a failure (no LM): ``FailureAnalysis``
    analysis.py  ``analyze_failures``: the sub-LM's causes merged into groups, budgeted, kept; a group for a proposal
    paired.py    ``compare`` and ``evaluate_rollouts``
    history.py   ``candidates`` (the Pareto front), ``hard_examples``, ``diff_runs``
    gepa.py      ``run_gepa``: the gepa package's engine over these evaluations, exact on budget
    demos.py     ``propose_demos``: demos from the program's own successes on train
    gepa_adapter.py  what that engine sees: the adapter over our evaluations, the budget slice, the reflection LM
    _dspy.py     every dspy name the moves use beyond ``import dspy``, checked at import

May import: dspy (its names beyond the top level only through ``_dspy``), gepa, pydantic, ``rlmoptimizer.storage``,
``rlmoptimizer.evaluation``, ``.budget``, ``.errors``, ``.events``, ``.fingerprint``, ``.records``, ``.selection``.
Nothing above it: not the agent (its tools reach the moves, never the other way), the estimate or the optimizer.
"""

from __future__ import annotations

from rlmoptimizer.moves.analysis import MAX_PROMPTS, AnalysisMoves
from rlmoptimizer.moves.context import (
    MAX_PROPOSALS,
    MAX_REFLECTION_EXAMPLES,
    MAX_ROLLOUTS,
    EvaluateFn,
    RunAccess,
)
from rlmoptimizer.moves.demos import DemoMoves
from rlmoptimizer.moves.failures import FailureAnalysis, FailureGroup
from rlmoptimizer.moves.gepa import GepaMoves
from rlmoptimizer.moves.history import HistoryMoves
from rlmoptimizer.moves.paired import PairedMoves
from rlmoptimizer.moves.proposal import ProposalMoves, reflective_example

__all__ = [
    "MAX_PROMPTS",
    "MAX_PROPOSALS",
    "MAX_REFLECTION_EXAMPLES",
    "MAX_ROLLOUTS",
    "EvaluateFn",
    "FailureAnalysis",
    "FailureGroup",
    "Moves",
    "RunAccess",
    "reflective_example",
]


class Moves(ProposalMoves, PairedMoves, HistoryMoves, GepaMoves, DemoMoves, AnalysisMoves):
    """The moves of one optimization, over its runs, its ledger and an evaluate function."""
