"""Which step of the program a traced predictor call belongs to, wherever dspy copied the predictor.

May import: the standard library and ``rlmoptimizer.fingerprint``.
"""

from __future__ import annotations

import threading
from typing import Any

from rlmoptimizer.fingerprint import canonical_json, signature_description

__all__ = ["StepNames"]

_STEP_TAG = "_rlmoptimizer_step"


class StepNames:
    """Which step of the program a traced predictor call belongs to, wherever dspy copied the predictor.

    ``dspy.Refine`` and ``dspy.BestOfN`` run a deep copy of their module (and a user's code may build a
    predictor from a step's signature), so the predictor object in the trace is often not the program's.
    A call is matched, in order: by a tag set on each program predictor (deep copies carry it), by identity,
    and by what it is, its signature (fields and instructions), when exactly one step has that signature.
    Calls matching no step (e.g. Refine's feedback predictor) are not steps.
    """

    def __init__(self, program: Any) -> None:
        self._by_id: dict[int, str] = {}
        by_signature: dict[str, list[str]] = {}
        steps = program.named_predictors()
        self._not_steps = _other_predictors(program, {id(predictor) for _, predictor in steps})
        for name, predictor in steps:
            self._by_id[id(predictor)] = name
            try:
                predictor.__dict__[_STEP_TAG] = name
            except Exception:  # a predictor without an instance dict: identity and signature still work
                pass
            by_signature.setdefault(self._key(predictor), []).append(name)
        self._by_signature = {key: names[0] for key, names in by_signature.items() if len(names) == 1}
        self._keys: dict[Any, str | None] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(predictor: Any) -> str | None:
        signature = getattr(predictor, "signature", None)
        if signature is None:
            return None
        try:
            return canonical_json(signature_description(signature))
        except Exception:
            return None

    def name(self, predictor: Any) -> str | None:
        tag = getattr(predictor, "__dict__", {}).get(_STEP_TAG)
        if isinstance(tag, str):
            return tag
        name = self._by_id.get(id(predictor))
        if name is not None:
            return name
        if id(predictor) in self._not_steps:  # a predictor of a part marked compiled: its own, never a step's
            return None
        signature = getattr(predictor, "signature", None)
        with self._lock:
            try:
                if signature in self._keys:
                    key = self._keys[signature]
                else:
                    key = self._keys[signature] = self._key(predictor)
            except TypeError:  # an unhashable signature
                key = self._key(predictor)
        return self._by_signature.get(key) if key is not None else None


def _other_predictors(program: Any, steps: set[int]) -> set[int]:
    """The ids of the program's predictors that are not steps: those inside a part marked compiled (as an earlier
    optimizer leaves its result), which ``named_predictors()`` skips. Their calls must not be taken for a step's
    when their signature reads the same."""
    try:
        modules = [module for _, module in program.named_sub_modules()]  # (compiled parts too)
    except Exception:  # a program dspy cannot walk: only the steps are known
        return set()
    return {id(m) for m in modules if hasattr(m, "signature") and hasattr(m, "demos")} - steps
