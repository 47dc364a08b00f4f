"""The public surface is pinned: adding or removing a name is a deliberate change."""

import rlmoptimizer
from rlmoptimizer import testing


def test_public_names():
    assert sorted(rlmoptimizer.__all__) == sorted(
        [
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
    )
    for name in rlmoptimizer.__all__:
        assert getattr(rlmoptimizer, name).__module__.startswith("rlmoptimizer.")


def test_every_error_is_an_rlmoptimizer_error_and_bad_input_is_also_a_value_error():
    errors = [getattr(rlmoptimizer, n) for n in rlmoptimizer.__all__ if n.endswith(("Error", "Interrupted"))]
    assert all(issubclass(e, rlmoptimizer.RLMOptimizerError) for e in errors)
    assert issubclass(rlmoptimizer.ConfigurationError, ValueError)


def test_the_offline_lms_are_importable_for_users_tests():
    assert {"FunctionLM", "ScriptedLM", "scripted_agent"} <= set(dir(testing))
