"""Classifying a failure of the evaluation LM: unusable (systemic), no answer this time (transient), or not
an LM failure at all.

* systemic: retrying cannot fix it and every example would fail the same way (bad key, no billing, unknown
  model, unreachable host after dspy's own retries); enough of them in a row stop the evaluation;
* transient (``"lm"``): the LM call failed without an answer (rate limit, timeout, server error after
  retries, a connection the server reset mid-request); the example is tried again, and if it still fails it is
  recorded but not charged;
* anything else (a request the LM refused, a reply that does not parse, a bug in the program): charged.

The evaluator classifies each failure once, when it makes the record, and stores the kind on it
(:attr:`~rlmoptimizer.records.ExampleResult.error_kind`).

May import: dspy's public exceptions, ``rlmoptimizer.errors`` and the standard library.
"""

from __future__ import annotations

import sys

from dspy.utils import exceptions as dspy_errors

from rlmoptimizer.errors import RAISED_BY_LM, exception_chain

SYSTEMIC = "systemic"
TRANSIENT = "lm"

# Errors that retrying cannot fix and that would fail every example the same way.
_SYSTEMIC_LM_ERRORS: tuple[type[BaseException], ...] = (
    dspy_errors.LMAuthError,
    dspy_errors.LMBillingError,
    dspy_errors.LMConfigurationError,  # includes LMNotConfiguredError
    dspy_errors.LMUnsupportedModelError,
    dspy_errors.LMUnsupportedFeatureError,
    dspy_errors.LMTransportError,  # a connection refused, an unknown host (after dspy.LM's retries); not a read cut off
)
# LiteLLM's own names for the same failures, in case one reaches us unwrapped (e.g. from a custom LM).
# Checked before the request names below: litellm derives some of these from BadRequestError.
_SYSTEMIC_LITELLM_NAMES = (
    "AuthenticationError",
    "PaymentRequiredError",  # no credits left (HTTP 402)
    "LiteLLMUnknownProvider",  # a model name litellm cannot route (a typo)
    "PermissionDeniedError",
    "NotFoundError",
    "APIConnectionError",
    "BudgetExceededError",
)
# LiteLLM's own names for an outage (dspy.LM maps them to its transient errors), checked before the systemic names.
_TRANSIENT_LITELLM_NAMES = (
    "RateLimitError",
    "Timeout",
    "InternalServerError",
    "ServiceUnavailableError",
    "BadGatewayError",
)
# LM errors that are about this example's request (it was sent and rejected): the example is charged.
_REQUEST_LM_ERRORS: tuple[type[BaseException], ...] = (
    dspy_errors.LMInvalidRequestError,  # includes ContextWindowExceededError
    dspy_errors.LMCollectionLimitError,
)

# LiteLLM's own names for a rejected request (a context window exceeded, a content policy): dspy.LM maps them to
# LMInvalidRequestError; unwrapped (a custom LM raising litellm's error) they are a request, not an outage.
_REQUEST_LITELLM_NAMES = ("BadRequestError", "UnprocessableEntityError")


def _litellm_error(exc: BaseException, names: tuple[str, ...]) -> bool:
    litellm = sys.modules.get("litellm")
    if litellm is None:
        return False
    for name in names:
        cls = getattr(litellm, name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return True
    return False


def _is_systemic(exc: BaseException) -> bool:
    return isinstance(exc, _SYSTEMIC_LM_ERRORS) or _litellm_error(exc, _SYSTEMIC_LITELLM_NAMES)


# What a transport error that reached the server but got no answer holds: a read that timed out, a connection the
# server reset or dropped mid-request. An outage, not an unusable LM (unlike a refused connection, an unknown host).
_CUT_MID_REQUEST = (TimeoutError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError)


def _cut_mid_request(exc: BaseException) -> bool:
    """Whether ``exc`` holds a read that timed out or a connection cut mid-request, not a connection that was never
    made (a connect timeout to a host that drops packets is an unreachable host, as a refused one is: dspy's client
    names it ``ConnectTimeout``/``ConnectError``, over a ``TimeoutError``)."""
    chain = list(exception_chain(exc))
    if any(type(e).__name__ in ("ConnectTimeout", "ConnectError") for e in chain):
        return False
    return any(isinstance(e, _CUT_MID_REQUEST) for e in chain)


def _lm_failure_kind(exc: BaseException) -> str | None:
    """What ``exc`` itself says: SYSTEMIC, ``"request"`` (sent and rejected), TRANSIENT for a specific LM error
    (rate limit, timeout, server error), ``"unexpected"`` for dspy's catch-all wrapper or another error an LM call
    raised (marked :data:`~rlmoptimizer.errors.RAISED_BY_LM`), ``None`` for no LM error."""
    if _litellm_error(exc, _TRANSIENT_LITELLM_NAMES):
        return TRANSIENT
    if isinstance(exc, dspy_errors.LMTransportError) and _cut_mid_request(exc):  # dspy's own client's read timeout
        return TRANSIENT
    if _is_systemic(exc):
        return SYSTEMIC
    if isinstance(exc, _REQUEST_LM_ERRORS) or _litellm_error(exc, _REQUEST_LITELLM_NAMES):
        return "request"
    if isinstance(exc, dspy_errors.LMUnexpectedError):
        return "unexpected"
    if isinstance(exc, dspy_errors.LMError):
        return TRANSIENT
    if getattr(exc, RAISED_BY_LM, False):  # raised by an LM call itself: a custom LM's own error (dspy.LM wraps
        return "unexpected"  # those in LMUnexpectedError)
    return None


def classify_lm_failure(exc: BaseException) -> tuple[str, BaseException] | None:
    """``("systemic", e)`` when the LM is unusable, ``("lm", e)`` when the LM call failed without an
    answer (rate limit, timeout, server error after retries), ``None`` for any other error (charged).

    The LM error nearest the top of ``exc``'s chain decides (a program that falls back after a rejected request
    and then meets a rate limit failed on the rate limit), except that dspy's catch-all ``LMUnexpectedError``
    yields to the error it wraps (a custom LM's litellm error, which dspy.LM would have mapped); an outage
    behind it is transient."""
    unexpected = None
    chain = list(exception_chain(exc))
    for i, e in enumerate(chain):
        kind = _lm_failure_kind(e)
        if kind == "request":
            for behind in chain[i:]:  # dspy maps litellm's 402 and unknown provider to a rejected request
                if getattr(behind, "status", None) == 402 or _litellm_error(behind, _SYSTEMIC_LITELLM_NAMES):
                    return SYSTEMIC, behind
            return None  # the request was sent and rejected: charged, not tried again
        if kind in (SYSTEMIC, TRANSIENT):
            return kind, e
        if kind == "unexpected" and unexpected is None:
            unexpected = e
    return (TRANSIENT, unexpected) if unexpected is not None else None


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` is an LM that gave no answer for a reason of its service (a rate limit, a timeout, a server
    error after its retries), not an unusable LM and not dspy's catch-all around an error of a custom LM's own code."""
    failure = classify_lm_failure(exc)
    return failure is not None and failure[0] == TRANSIENT and _lm_failure_kind(failure[1]) == TRANSIENT


def format_error(exc: BaseException) -> str:
    """How an error is stored on a record and shown: ``"TypeName: message"``."""
    return f"{type(exc).__name__}: {exc}"


def failure_summary(exc: BaseException) -> str:
    """One line for a failed LM call: the LM failure found in ``exc``'s chain (:func:`classify_lm_failure`), else
    ``exc`` itself, as ``"TypeName: first line of its message"``."""
    failure = classify_lm_failure(exc)
    cause = failure[1] if failure else exc
    if isinstance(cause, dspy_errors.LMUnexpectedError) and cause.__cause__ is not None:
        cause = cause.__cause__  # dspy's catch-all around a custom LM's own error: that error says what went wrong
    text = str(cause)
    return f"{type(cause).__name__}: {text.splitlines()[0] if text else ''}"
