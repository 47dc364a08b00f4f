"""What compile() adds to the program it returns, beyond its result attributes: the trajectory as a list that
renders turn by turn, the detailed results (and MIPROv2's ``score`` / ``candidate_programs``), the cost estimate made
before the run with what the run spent beside it, the picture of the run in the run directory, and the end of the
MLflow run."""

from __future__ import annotations

import logging
from typing import Any

from rlmoptimizer.fingerprint import copy_program
from rlmoptimizer.report.compile_state import CompileState
from rlmoptimizer.report.plot import picture_unavailable, write_run_picture
from rlmoptimizer.report.results import DetailedResults
from rlmoptimizer.report.trajectory import Trajectory

logger = logging.getLogger(__name__)


def present_result(program: Any, state: CompileState, best_outputs: bool = False) -> Any:
    """Attach the views of the finished run to ``program`` and return it. ``state`` is the compile's: its
    ``directory``, ``student``, ``tracker`` (or None) and ``read_back`` (a finished run returned again writes
    nothing, so no picture). ``best_outputs``: the detailed results hold the best outputs per validation example
    (``track_best_outputs``). The picture never fails a finished run."""
    directory, student, tracker = state.directory, state.student, state.tracker
    program.agent_trajectory = Trajectory(program.agent_trajectory)
    detailed = DetailedResults.from_run_directory(directory, program=copy_program(student), best_outputs=best_outputs)
    program.detailed_results = detailed
    program.score = program.selection["chosen_score"]  # MIPROv2's names
    program.candidate_programs = detailed.candidate_programs
    estimate = state.cost_estimate
    program.cost_estimate = estimate
    program.cost_check = estimate.against(program.usage) if estimate is not None else None
    if program.cost_check is not None and not state.read_back:
        state.display.message(str(program.cost_check))
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
            instructions=program.optimized_dspy_program,
            selection=program.selection,
            trajectory=list(program.agent_trajectory),
            picture=picture,
            detailed_results=detailed.to_dict(),
            budget=program.budget,
            usage=detailed.usage,
            lineage=detailed.lineage_record(),
        )
    return program
