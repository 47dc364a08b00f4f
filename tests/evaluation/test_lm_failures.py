"""Which LM failures stop an evaluation, which are retried and left uncharged."""

from __future__ import annotations

import dspy

from rlmoptimizer.evaluation.lm_failures import classify_lm_failure, failure_summary


def wrapped(inner: BaseException) -> RuntimeError:
    """``inner`` raised, and the program's own error raised from it (as a program that catches and re-raises)."""
    try:
        try:
            raise inner
        except type(inner) as caught:
            raise RuntimeError("the program wrapped it") from caught
    except RuntimeError as outer:
        return outer


def raised_from(outer: BaseException, inner: BaseException) -> BaseException:
    """``outer`` as ``raise outer from inner`` leaves it (an LM wrapper's or a program's error over ``inner``)."""
    try:
        raise outer from inner
    except BaseException as raised:
        return raised


def test_classify_lm_failure_tells_systemic_transient_and_content_errors_apart():
    assert classify_lm_failure(dspy.LMNotConfiguredError("no key"))[0] == "systemic"
    assert classify_lm_failure(dspy.LMUnsupportedModelError("no such model"))[0] == "systemic"
    assert classify_lm_failure(dspy.LMRateLimitError("slow down"))[0] == "lm"
    assert classify_lm_failure(dspy.LMServerError("500"))[0] == "lm"
    assert classify_lm_failure(dspy.ContextWindowExceededError(model="m")) is None
    assert classify_lm_failure(ValueError("bad parse")) is None
    kind, cause = classify_lm_failure(wrapped(dspy.LMAuthError("denied")))
    assert kind == "systemic" and isinstance(cause, dspy.LMAuthError)


def test_litellms_own_rejected_request_is_charged_also_when_an_lm_wrapper_raised_it_unmapped():
    """Regression: a custom LM raising litellm's ContextWindowExceededError (which dspy.LM maps to its own) reached
    the evaluator inside dspy's LMUnexpectedError and was taken for an outage: retried with backoff in every
    evaluation, never charged (186 calls and 80 s where 72 calls took 1 s)."""
    import litellm

    too_long = litellm.ContextWindowExceededError("maximum context length is 8192", model="m", llm_provider="openai")
    assert classify_lm_failure(too_long) is None
    assert classify_lm_failure(wrapped(too_long)) is None
    unmapped = raised_from(dspy.LMUnexpectedError("[fake] litellm.ContextWindowExceededError"), too_long)
    assert classify_lm_failure(unmapped) is None
    assert classify_lm_failure(litellm.AuthenticationError("bad key", llm_provider="openai", model="m"))[0] == (
        "systemic"
    )
    assert classify_lm_failure(dspy.LMUnexpectedError("connection reset"))[0] == "lm"  # still an outage


def test_the_lm_error_nearest_the_top_of_the_chain_decides():
    """Regression: a rejected request anywhere in the chain made the failure charged, so a program that fell back
    after a rejected request and then met a rate limit was charged for an outage; and litellm's 402 (a subclass of
    its BadRequestError) was charged on every example instead of stopping the evaluation."""
    import litellm

    fallback = raised_from(  # the program's fallback call after a rejected request
        dspy.LMRateLimitError("429 rate limited", model="m"), dspy.LMInvalidRequestError("too long", model="m")
    )
    kind, cause = classify_lm_failure(fallback)
    assert kind == "lm" and isinstance(cause, dspy.LMRateLimitError)
    assert classify_lm_failure(wrapped(dspy.LMInvalidRequestError("too long", model="m"))) is None
    no_credits = litellm.PaymentRequiredError("insufficient credits", model="m", llm_provider="openrouter")
    assert classify_lm_failure(no_credits)[0] == "systemic"
    unmapped = raised_from(dspy.LMUnexpectedError("[fake] litellm.PaymentRequiredError"), no_credits)
    assert classify_lm_failure(unmapped) == ("systemic", no_credits)
    mapped = raised_from(dspy.LMInvalidRequestError("no credits", model="m", status=402), no_credits)  # as dspy.LM
    assert classify_lm_failure(mapped)[0] == "systemic"
    assert classify_lm_failure(dspy.LMInvalidRequestError("402 no credits", model="m", status=402))[0] == "systemic"


def test_a_failure_reads_as_the_lm_error_behind_it_on_one_line():
    assert failure_summary(wrapped(dspy.LMAuthError("403 Forbidden\nrequest id abc"))) == "LMAuthError: 403 Forbidden"
    assert failure_summary(ValueError("no field 'answer'\nin the reply")) == "ValueError: no field 'answer'"
    assert failure_summary(KeyError()) == "KeyError: "


# -- selecting ids -------------------------------------------------------------------------------


def test_litellms_own_outages_are_outages_also_when_a_custom_lm_raised_them_unmapped():
    """Regression: a custom LM raising litellm's RateLimitError (which dspy.LM maps to its own) was no outage, so a
    sub LM down that way ended the run early as finished."""
    import litellm

    from rlmoptimizer.evaluation.lm_failures import is_outage

    outages = [
        litellm.RateLimitError("429", llm_provider="openai", model="m"),
        litellm.Timeout("timed out", model="m", llm_provider="openai"),
        litellm.InternalServerError("500", llm_provider="openai", model="m"),
        litellm.ServiceUnavailableError("503", llm_provider="openai", model="m"),
    ]
    for error in outages:
        unmapped = raised_from(dspy.LMUnexpectedError(f"[fake] {type(error).__name__}"), error)
        assert classify_lm_failure(unmapped) == ("lm", error) and is_outage(unmapped), error
    unreachable = litellm.APIConnectionError("connection refused", llm_provider="openai", model="m")
    assert classify_lm_failure(unreachable)[0] == "systemic"
    assert not is_outage(raised_from(dspy.LMUnexpectedError("[fake]"), RuntimeError("a bug in the client")))


def test_a_read_that_timed_out_or_a_connection_reset_mid_request_is_an_outage_not_an_unusable_lm():
    """Regression: dspy's own client (its default engine) raises LMTransportError for a read that timed out and for
    a connection the server reset, as for a refused connection: all three were taken for an unusable LM, and a
    timeout= the docs advise stopped a compile on its first slow reply, saying to check the key and billing."""
    from rlmoptimizer.evaluation.lm_failures import is_outage

    def transport(message: str, cause: BaseException) -> BaseException:
        return raised_from(dspy.LMTransportError(message, model="m"), cause)

    timed_out = transport("read timed out waiting for headers", TimeoutError("timed out"))
    reset = transport("read failed: [Errno 104] Connection reset by peer", ConnectionResetError(104, "reset"))
    refused = transport("failed to connect: [Errno 111] Connection refused", ConnectionRefusedError(111, "refused"))
    assert classify_lm_failure(timed_out)[0] == "lm" and is_outage(timed_out)
    assert classify_lm_failure(reset)[0] == "lm" and is_outage(reset)
    assert classify_lm_failure(refused)[0] == "systemic"  # nothing listens there: retrying cannot help

    class ConnectTimeout(Exception):  # dspy's client's name for a connection never made
        pass

    never_made = transport("failed to connect: timed out", raised_from(ConnectTimeout("timed out"), TimeoutError()))
    assert classify_lm_failure(never_made)[0] == "systemic"  # a host that drops packets: an unreachable host
