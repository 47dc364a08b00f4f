"""rlmoptimizer: a DSPy teleprompter whose optimizer is an LLM agent in a sandboxed Python REPL."""

from rlmoptimizer.errors import (
    BudgetExhaustedError,
    ConfigurationError,
    DspyVersionError,
    EvaluationLMError,
    MetricError,
    OptimizationInterrupted,
    RLMOptimizerError,
    RunDirectoryInUseError,
    RunDirectoryMismatchError,
    SandboxError,
    StructureChangedError,
)
from rlmoptimizer.optimizer import RLMDocstringOptimizer

__all__ = [
    "RLMDocstringOptimizer",
    "RLMOptimizerError",
    "ConfigurationError",
    "MetricError",
    "BudgetExhaustedError",
    "StructureChangedError",
    "EvaluationLMError",
    "SandboxError",
    "RunDirectoryMismatchError",
    "RunDirectoryInUseError",
    "OptimizationInterrupted",
    "DspyVersionError",
]

__version__ = "0.1.0"
