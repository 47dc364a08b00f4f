"""Exceptions raised by rlmoptimizer.

The tree::

    RLMOptimizerError
     +-- ConfigurationError (also ValueError)   bad input to the optimizer; raised before any LM call
     +-- MetricError (also TypeError)           the metric returned something that is not a score, or raises the
     |                                      same error on every example, the expected answer's too
     +-- BudgetExhaustedError                   a budgeted action was asked for with nothing left
     +-- StructureChangedError                  something other than instructions changed
     +-- EvaluationLMError                      the evaluation LM fails in a way retrying cannot fix
     +-- ProgramError                           the program raises one error whatever its instructions say
     +-- SandboxError                           the sandbox could not be started or restarted
     +-- RunDirectoryMismatchError              run_storage_dir holds a run of another program/data/metric/LM
     +-- RunDirectoryInUseError                 another live compile() holds run_storage_dir
     +-- OptimizationInterrupted                Ctrl-C or an error mid-run; says where the state is
     +-- DspyVersionError (also ImportError)    the installed dspy lacks a private member we rely on (at import)

    AgentToolError (a ValueError)               a tool call the agent should correct; raised by a tool, shown to the
                                                agent inside its REPL as an ``AgentToolError`` of the same name,
                                                never to the user; :func:`agent_error` makes it (the one format of
                                                a refusal, for the agent's tools and the moves)

Only systemic failures propagate to the user. A failure is often wrapped (``raise ... from``, or raised while
handling another): :func:`exception_chain` lists an error and the ones it was raised from, for the classifiers
that look for a kind of failure anywhere in that chain.
"""

from __future__ import annotations

from collections.abc import Iterator

RAISED_BY_LM = "_rlmoptimizer_raised_by_lm"
"""The attribute set (True) on an exception an LM call raised (:func:`rlmoptimizer.usage.mark_lm_errors`): a custom
LM's own error, which ``dspy.LM`` would have wrapped in its ``LMUnexpectedError``, is then known for an LM that gave
no answer, not a bug of the program around it."""


def exception_chain(exc: BaseException | None, limit: int = 16) -> Iterator[BaseException]:
    """``exc``, then the errors it was raised from or while handling (``__cause__``, ``__context__``), nearest
    first, each once (a chain may loop), at most ``limit`` of them."""
    seen: list[BaseException] = []
    queue = [exc]
    while queue and len(seen) < limit:
        current = queue.pop(0)
        if current is None or any(current is s for s in seen):
            continue
        seen.append(current)
        yield current
        queue += [current.__cause__, current.__context__]


class RLMOptimizerError(Exception):
    """Base class of every error rlmoptimizer raises on purpose."""


class ConfigurationError(RLMOptimizerError, ValueError):
    """The optimizer, program, data or metric given by the user cannot be used as given."""


class MetricError(RLMOptimizerError, TypeError):
    """The metric returned a value that is not a score (None, NaN, text, ...), or raises one and the same error on
    every example of the unchanged program's first baseline and on the expected answer given as the prediction."""


class BudgetExhaustedError(RLMOptimizerError):
    """A budgeted action was requested but no budget is left."""


class StructureChangedError(RLMOptimizerError):
    """The program's structure (fields, demos, modules) changed; only instructions and demos may change."""


class EvaluationLMError(RLMOptimizerError):
    """The evaluation LM failed on consecutive examples in a way that retrying cannot fix."""


class ProgramError(RLMOptimizerError):
    """The program raised one and the same error on every example of the unchanged program's baseline and again on
    every example of several evaluations with other instructions for each step that ran: instructions have not changed
    it (an error in its code, or in its handling of what the LM answers)."""


class SandboxError(RLMOptimizerError):
    """The sandboxed REPL could not be started or restarted."""


class RunDirectoryMismatchError(RLMOptimizerError):
    """``run_storage_dir`` already holds a run of a different program, trainset, valset, metric or evaluation LM."""


class RunDirectoryInUseError(RLMOptimizerError):
    """``run_storage_dir`` belongs to another compile() that is still running (this process or another)."""


class OptimizationInterrupted(RLMOptimizerError):
    """The optimization stopped early (interrupt or error); the message says where the state is kept."""


class DspyVersionError(RLMOptimizerError, ImportError):
    """The installed dspy lacks a private member rlmoptimizer relies on (see ``rlmoptimizer.dspy_contract``)."""


class AgentToolError(ValueError):
    """A tool call the agent should correct; the message says how. The sandbox raises it inside the REPL
    under the same class name (see ``rlmoptimizer/sandbox/assets/tool_wrappers.py``)."""


REFUSAL_CLIP = 600
"""The most characters of a refusal's problem or fix shown to the agent: a value echoed in it (a 200,000-character
argument) is cut in the middle, so what went wrong and what to do next stay in view."""


def _clip(text: str, limit: int = REFUSAL_CLIP) -> str:
    """``text`` cut in the middle to at most about ``limit`` characters, saying how much was cut."""
    text = str(text)
    if len(text) <= limit:
        return text
    head, tail = (2 * limit) // 3, limit // 4
    return f"{text[:head]} ...[{len(text) - head - tail} characters cut]... {text[-tail:]}"


def agent_error(problem: str, fix: str) -> AgentToolError:
    """The one place that formats errors shown to the agent (by the agent's tools and by the moves): what went
    wrong, then what to do (each clipped); ``problem`` alone is kept on it, for a reason shown to the user."""
    error = AgentToolError(f"{_clip(problem)} -> {_clip(fix)}")
    error.problem = _clip(problem)
    return error
