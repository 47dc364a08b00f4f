"""Which LM failures stop an evaluation, which are retried and left uncharged."""

from __future__ import annotations

import dspy

from rlmoptimizer.evaluation.lm_failures import classify_lm_failure


def test_classify_lm_failure_tells_systemic_transient_and_content_errors_apart():
    assert classify_lm_failure(dspy.LMNotConfiguredError("no key"))[0] == "systemic"
    assert classify_lm_failure(dspy.LMUnsupportedModelError("no such model"))[0] == "systemic"
    assert classify_lm_failure(dspy.LMRateLimitError("slow down"))[0] == "lm"
    assert classify_lm_failure(dspy.LMServerError("500"))[0] == "lm"
    assert classify_lm_failure(dspy.ContextWindowExceededError(model="m")) is None
    assert classify_lm_failure(ValueError("bad parse")) is None
    try:
        try:
            raise dspy.LMAuthError("denied")
        except dspy.LMAuthError as inner:
            raise RuntimeError("program wrapped it") from inner
    except RuntimeError as outer:
        kind, cause = classify_lm_failure(outer)
    assert kind == "systemic" and isinstance(cause, dspy.LMAuthError)


# -- selecting ids -------------------------------------------------------------------------------
