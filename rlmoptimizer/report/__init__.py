"""What a person sees of a run, read from its run directory: the summary (``python -m rlmoptimizer report``),
the picture, the detailed results, the trajectory display, and MLflow tracking.

* :mod:`rlmoptimizer.report.rundir` reads any run directory (finished, interrupted, in flight, empty);
* :mod:`rlmoptimizer.report.plot` draws score against budget spent (``run.png``);
* :mod:`rlmoptimizer.report.summary` prints the summary;
* :mod:`rlmoptimizer.report.results` builds :class:`DetailedResults` (GEPA's and MIPROv2's names);
* :mod:`rlmoptimizer.report.trajectory` shows ``optimized.agent_trajectory`` turn by turn;
* :mod:`rlmoptimizer.report.tracking` logs a compile() to MLflow (the optional extra).

May import: ``rlmoptimizer.errors``, ``rlmoptimizer.records``, ``rlmoptimizer.fingerprint``, rich, and, each only
where it is used, matplotlib and mlflow.
"""

from rlmoptimizer.report.results import DetailedResults
from rlmoptimizer.report.rundir import RunDirectory, read_run_directory
from rlmoptimizer.report.trajectory import Trajectory

__all__ = ["DetailedResults", "RunDirectory", "Trajectory", "read_run_directory"]
