"""Running a program on examples and keeping the results as runs.

Rooms:
    evaluator.py    :class:`Evaluator`: a program on examples in threads, LM pinned, scored by the metric
    lm_failures.py  which LM failures stop an evaluation, which are retried and left uncharged
    steps.py        :class:`StepNames`: which step a traced call belongs to, wherever dspy copied the predictor
    runs.py         :class:`Runs`: a program on a split as one stored, charged, cached :class:`EvalRun`

May import: dspy, ``rlmoptimizer.storage`` and the flat rooms below it (``budget``, ``errors``, ``events``,
``fingerprint``, ``metric``, ``records``). Nothing above it (agent, optimizer, display).
"""
