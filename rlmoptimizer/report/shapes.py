"""The shapes the views read from a run directory's JSON files, checked: what is well formed is kept, what is not is
dropped and named.

A file that parses can still be damaged (edited by hand, written by another version, a disk error that kept the
syntax): a ledger without ``limit``, a ``budget_limit`` of ``"lots"``, a ``selection`` that is a string. Each
``*_shape`` function takes what the file held and a list of problems, and returns the part the report, the
picture and the detailed results can use, appending one line per thing it dropped, so that reading a run
directory never raises on what it finds inside.

May import what :mod:`rlmoptimizer.report` may.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from rlmoptimizer.records import SPLITS, EvalRun
from rlmoptimizer.storage.layout import MANIFEST, RESULT

Check = Callable[[Any], bool]


def is_count(value: Any) -> bool:
    """A whole number (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite number (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def is_instructions(value: Any) -> bool:
    """``{step name: instructions}``, every key and value a string."""
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _is_counts(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and is_count(v) for k, v in value.items())


def _is_candidates(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(c, dict) and isinstance(c.get("run_id"), str) and is_number(c.get("score")) for c in value
    )


_BUDGET = {"limit": is_count, "spent": is_count, "left": is_count, "spent_by_kind": _is_counts}
_SELECTION = {
    "split": lambda v: v in SPLITS,
    "chosen_run_id": _is_str,
    "chosen_label": _is_str,
    "chosen_score": is_number,
    "submission_run_id": _optional(_is_str),
    "submission_score": _optional(is_number),
    "baseline_score": _optional(is_number),
    "reason": _is_str,
    "candidates": _is_candidates,
    "spending_cap_reached": _optional(lambda v: isinstance(v, bool)),
}
_ROLE_USAGE = {
    "calls": is_count,
    "input_tokens": is_count,
    "cached_input_tokens": is_count,
    "output_tokens": is_count,
    "cost_usd": _optional(is_number),
    "unpriced_models": lambda v: isinstance(v, list) and all(isinstance(m, str) for m in v),
}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _kept(data: dict[str, Any], spec: dict[str, Check], where: str, problems: list[str]) -> dict[str, Any]:
    """``data`` without the keys of ``spec`` whose values fail their check (each named in ``problems``)."""
    bad = [key for key, check in spec.items() if key in data and not check(data[key])]
    if bad:
        problems.append(f"{where}: ignored " + ", ".join(f"{key}={_short(data[key])}" for key in bad))
    return {key: value for key, value in data.items() if key not in bad}


def _dict(value: Any, where: str, what: str, problems: list[str]) -> dict[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value
    problems.append(f"{where}: not {what} (a {type(value).__name__})")
    return None


def budget_shape(value: Any, where: str, problems: list[str]) -> dict[str, Any] | None:
    """A ledger snapshot (``limit``, ``spent``, ``left`` in units, ``spent_by_kind``), or None when its numbers
    are missing or not counts."""
    budget = _dict(value, where, "a budget", problems)
    if budget is None:
        return None
    missing = [key for key in ("limit", "spent", "left") if not is_count(budget.get(key))]
    if missing:
        problems.append(f"{where}: not a budget (" + ", ".join(f"{k}={_short(budget.get(k))}" for k in missing) + ")")
        return None
    return _kept(budget, _BUDGET, where, problems)


def manifest_shape(value: Any, problems: list[str]) -> dict[str, Any] | None:
    manifest = _dict(value, MANIFEST, "a manifest", problems)
    if manifest is None:
        return None
    return _kept(manifest, {"budget_limit": is_count, "created_at": is_number}, MANIFEST, problems)


def usage_shape(value: Any, where: str, problems: list[str]) -> dict[str, Any] | None:
    """Per-role usage: each role a dict of counts and dollars; other entries (``max_cost_usd``, ``cap_reached``)
    kept when they are numbers or flags."""
    usage = _dict(value, where, "LM usage", problems)
    if usage is None:
        return None
    kept: dict[str, Any] = {}
    for key, item in usage.items():
        if isinstance(item, dict):
            kept[key] = _kept(item, _ROLE_USAGE, f"{where} {key}", problems)
        elif item is None or isinstance(item, bool) or is_number(item):
            kept[key] = item
        else:
            problems.append(f"{where}: ignored {key}={_short(item)}")
    return kept


def estimate_shape(value: Any, where: str, problems: list[str]) -> dict[str, Any] | None:
    """``estimate.json``: a cost estimate, kept when it has its rows per role (read tolerantly by
    :meth:`rlmoptimizer.report.costs.CostEstimate.from_dict`)."""
    estimate = _dict(value, where, "a cost estimate", problems)
    if estimate is None:
        return None
    if not isinstance(estimate.get("roles"), list) or not all(isinstance(r, dict) for r in estimate["roles"]):
        problems.append(f"{where}: not a cost estimate (no rows per role)")
        return None
    return estimate


def _is_demo_sources(value: Any) -> bool:
    """``{step: [train id or None, ...]}``."""
    return isinstance(value, dict) and all(
        isinstance(step, str) and isinstance(ids, list) and all(i is None or is_count(i) for i in ids)
        for step, ids in value.items()
    )


def result_shape(value: Any, problems: list[str]) -> dict[str, Any] | None:
    """``result.json``: its returned instructions, selection, budget, usage and seed, each kept when well formed."""
    result = _dict(value, RESULT, "a result", problems)
    if result is None:
        return None
    result = _kept(
        result,
        {"optimized_dspy_program": is_instructions, "seed": is_count, "demo_sources": _is_demo_sources},
        RESULT,
        problems,
    )
    if "selection" in result:
        selection = _dict(result["selection"], "result.json selection", "a selection", problems)
        result["selection"] = _kept(selection, _SELECTION, "result.json selection", problems) if selection else None
    if "budget" in result:
        result["budget"] = budget_shape(result["budget"], "result.json budget", problems)
    if "usage" in result:
        result["usage"] = usage_shape(result["usage"], "result.json usage", problems)
    return {key: value for key, value in result.items() if value is not None}


_TURN = {
    "iteration": is_count,
    "reasoning": _is_str,
    "code": _is_str,
    "output": _is_str,
    "final": lambda v: isinstance(v, bool),
    "created_at": is_number,
}
_VERSION = {"version": is_count, "step": _is_str, "text": _is_str, "previous": _optional(_is_str), "source": _is_str}


def turn_shape(turn: dict[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    """An agent turn (``turns/turn-NNNN.json``) without the fields of the wrong kind."""
    return _kept(turn, _TURN, where, problems)


def version_shape(version: dict[str, Any], where: str, problems: list[str]) -> dict[str, Any]:
    """A prompt version (``prompts/v-NNNN.json``) without the fields of the wrong kind."""
    return _kept(version, _VERSION, where, problems)


_RUN_ID = re.compile(r"^run-\d+$")


def run_problem(run: EvalRun) -> str | None:
    """Why a run read from ``runs/`` cannot be shown (an id, split, label or instructions of the wrong kind)."""
    if not isinstance(run.run_id, str) or not _RUN_ID.match(run.run_id):
        return f"run_id {_short(run.run_id)}"
    if run.split not in SPLITS:
        return f"split {_short(run.split)}"
    if not isinstance(run.label, str):
        return f"label {_short(run.label)}"
    if not is_instructions(run.instructions):
        return "instructions that are not {step: text}"
    if not all(is_number(r.score) for r in run.records):
        return "a score that is not a finite number"
    return None
