"""What a person sees of a run, read from its run directory: the summary (``python -m rlmoptimizer report``),
the picture, the detailed results, the trajectory display, and MLflow tracking.

* :mod:`rlmoptimizer.report.rundir` reads any run directory (finished, interrupted, in flight, empty);
* :mod:`rlmoptimizer.report.plot` draws score against budget spent (``run.png``);
* :mod:`rlmoptimizer.report.summary` prints the summary;
* :mod:`rlmoptimizer.report.results` builds :class:`DetailedResults` (GEPA's and MIPROv2's names);
* :mod:`rlmoptimizer.report.costs` holds what a compile was predicted to cost (:class:`CostEstimate`, made by
  :mod:`rlmoptimizer.estimate`) and how that compared with what it spent (:class:`CostCheck`);
* :mod:`rlmoptimizer.report.lineage` follows the named candidates' lineage to the returned candidate's ancestry;
* :mod:`rlmoptimizer.report.trajectory` shows ``optimized.agent_trajectory`` turn by turn;
* :mod:`rlmoptimizer.report.tracking` logs a compile() to MLflow (the optional extra);
* :mod:`rlmoptimizer.report.compile_state` types what the report reads of a compile() while it runs
  (:class:`CompileState`), and opens its MLflow run (:func:`tracked`);
* :mod:`rlmoptimizer.report.finish` attaches these views to the program compile() returns.

May import: ``rlmoptimizer.errors``, ``rlmoptimizer.records``, ``rlmoptimizer.fingerprint``, ``rlmoptimizer.storage``
(the run directory's formats and lock: read only),
``rlmoptimizer.events``, ``rlmoptimizer.usage`` (how dollars read), ``rlmoptimizer.display`` (how printed text is shown), rich, and, each only
where it is used, matplotlib and mlflow.
"""

from rlmoptimizer.report.compile_state import CompileState, tracked
from rlmoptimizer.report.costs import CostCheck, CostEstimate
from rlmoptimizer.report.finish import present_result
from rlmoptimizer.report.results import DetailedResults
from rlmoptimizer.report.rundir import RunDirectory, read_run_directory
from rlmoptimizer.report.tracking import MlflowTracker, check_use_mlflow
from rlmoptimizer.report.trajectory import Trajectory

__all__ = [
    "CompileState",
    "CostCheck",
    "CostEstimate",
    "DetailedResults",
    "MlflowTracker",
    "RunDirectory",
    "Trajectory",
    "check_use_mlflow",
    "present_result",
    "read_run_directory",
    "tracked",
]
