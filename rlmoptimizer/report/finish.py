"""What compile() adds to the program it returns, beyond its result attributes: the trajectory as a list that
renders turn by turn, the detailed results (and MIPROv2's ``score`` / ``candidate_programs``), the cost estimate made
before the run with what the run spent beside it, the picture of the run in the run directory, and the end of the
MLflow run."""

from __future__ import annotations

import logging
from typing import Any

import dspy

from rlmoptimizer.fingerprint import RESULTS_MARK, copy_program
from rlmoptimizer.report.compile_state import CompileState
from rlmoptimizer.report.plot import picture_unavailable, write_run_picture
from rlmoptimizer.report.results import DetailedResults, percent
from rlmoptimizer.report.trajectory import Trajectory

logger = logging.getLogger(__name__)


_MARK = RESULTS_MARK
_TELEPROMPTER_NAMES = frozenset({"score", "candidate_programs", "trial_logs", "detailed_results"})
"""What dspy's own teleprompters (MIPROv2, SIMBA, GEPA, ...) set on the programs they return: a later compile of
such a program sets them anew."""


def without_results(program: Any) -> Any:
    """A copy of ``program`` (one ``compile()`` returned) without the result attributes compile() set on it
    (``detailed_results``, ``agent_trajectory``, ``selection``, ...): the program alone, its instructions and demos
    kept. ``save(path, save_program=True)`` pickles every attribute, and loading those needs rlmoptimizer installed;
    save this copy where the program is served without it (``save(path)``, the JSON state, never holds them)."""
    return copy_program(program)


def attach_results(program: Any, values: dict[str, Any], directory: str) -> dict[str, Any]:
    """Set each of ``values`` on ``program``, except a name the program holds for itself: a step or sub-module of
    that name, a class attribute (a method, a property, a default), or an attribute it set (not one compile() or a
    dspy teleprompter set on it earlier). Those are left as they are, with a warning naming them and where their
    values are (``directory``): the returned program stays the user's program. Returns what was set."""
    ours = set(getattr(program, _MARK, ()))
    kept = []
    for name in values:
        own = program.__dict__.get(name, None)
        if (
            hasattr(type(program), name)
            or isinstance(own, dspy.Module)
            or (name in program.__dict__ and name not in ours and name not in _TELEPROMPTER_NAMES)
        ):
            kept.append(name)
    attached = {name: value for name, value in values.items() if name not in kept}
    for name, value in attached.items():
        setattr(program, name, value)
    program.__dict__[_MARK] = frozenset(ours | set(attached))
    if kept:
        logger.warning(
            "compile() left %s of the returned program as they were: the program has its own attribute(s) of that "
            "name (a step, a method or a value of yours), so the result's %s not set there. They are in the "
            "run directory %s: result.json, and DetailedResults.from_run_directory(%r).",
            ", ".join(kept),
            "value is" if len(kept) == 1 else "values are",
            directory,
            directory,
        )
    return attached


def present_result(program: Any, values: dict[str, Any], state: CompileState, best_outputs: bool = False) -> Any:
    """Set the result ``values`` (:meth:`~rlmoptimizer.records.CompileResult.attributes`) and the views of the
    finished run on ``program`` (:func:`attach_results`) and return it. ``state`` is the compile's: its
    ``directory``, ``tracker`` (or None) and ``read_back`` (a finished run returned again writes
    nothing, so no picture). ``best_outputs``: the detailed results hold the best outputs per validation example
    (``track_best_outputs``). The picture never fails a finished run."""
    directory, tracker = state.directory, state.tracker
    # (candidates are copies of the returned program without its result attributes, made when read: no second copy
    # of the program, its LMs or its state rides along with it)
    detailed = DetailedResults.from_run_directory(directory, program=program, best_outputs=best_outputs)
    estimate = state.cost_estimate
    values = {
        **values,
        "agent_trajectory": Trajectory(values["agent_trajectory"]),
        "detailed_results": detailed,
        "score": percent(values["selection"]["chosen_score"]),  # MIPROv2's names, on its scale
        "candidate_programs": detailed.candidate_programs,
        "cost_estimate": estimate,
        "cost_check": estimate.against(values["usage"]) if estimate is not None else None,
    }
    attach_results(program, values, str(directory))
    if values["cost_check"] is not None and not state.read_back:
        state.display.message(str(values["cost_check"]))
    picture = None
    if not state.read_back and picture_unavailable() is not None:  # the plot extra is optional: nothing to say
        logger.debug("No run.png: %s", picture_unavailable())
    elif not state.read_back:
        try:
            picture = write_run_picture(directory)
        except Exception as exc:  # a view of what is on disk: the run itself is complete
            logger.warning(
                "Could not draw the picture of the run (%s: %s); the run directory is complete.",
                type(exc).__name__,
                exc,
            )
    if tracker is not None:
        tracker.compile_finished(
            instructions=values["optimized_dspy_program"],
            selection=values["selection"],
            trajectory=list(values["agent_trajectory"]),
            picture=picture,
            detailed_results=detailed.to_dict(),
            budget=values["budget"],
            usage=detailed.usage,
            lineage=detailed.lineage_record(),
        )
    return program
