"""rlmoptimizer: a DSPy teleprompter whose optimizer is an LLM agent in a sandboxed Python REPL."""

# First, before any module that imports from dspy: the installed dspy must be in the supported range and have
# every name the package uses, or the import fails with one DspyVersionError listing every problem.
from rlmoptimizer.dspy_contract import check_installed_dspy as _check_installed_dspy

_check_installed_dspy()

from rlmoptimizer.errors import (  # noqa: E402
    BudgetExhaustedError,
    ConfigurationError,
    DspyVersionError,
    EvaluationLMError,
    MetricError,
    OptimizationInterrupted,
    ProgramError,
    RLMOptimizerError,
    RunDirectoryInUseError,
    RunDirectoryMismatchError,
    SandboxError,
    StructureChangedError,
)
from rlmoptimizer.optimizer import RLMDocstringOptimizer  # noqa: E402
from rlmoptimizer.report.costs import CostEstimate  # noqa: E402
from rlmoptimizer.report.finish import without_results  # noqa: E402

__all__ = [
    "RLMDocstringOptimizer",
    "CostEstimate",
    "without_results",
    "RLMOptimizerError",
    "ConfigurationError",
    "MetricError",
    "BudgetExhaustedError",
    "StructureChangedError",
    "EvaluationLMError",
    "ProgramError",
    "SandboxError",
    "RunDirectoryMismatchError",
    "RunDirectoryInUseError",
    "OptimizationInterrupted",
    "DspyVersionError",
]

__version__ = "0.1.0"
