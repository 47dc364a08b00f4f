"""What a resume reads back from a run directory, read once, as one frozen record.

A directory that already holds this same compile (its manifest matches) is resumed: the ledger, the prompt
versions and the agent's turns written so far come back here. The runs themselves and the records of
evaluations a killed process never finished are read by :class:`~rlmoptimizer.storage.run_store.RunStore`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlmoptimizer.budget import example_kind
from rlmoptimizer.errors import RunDirectoryMismatchError
from rlmoptimizer.fingerprint import (
    EXAMPLES_DIGEST_VERSION,
    examples_digest,
    fingerprint_digest,
    get_instructions,
    program_code_identity,
    sha256_json,
)
from rlmoptimizer.records import EvalRun, jsonable
from rlmoptimizer.storage.identity import eval_lm_identity
from rlmoptimizer.storage.journal import RunJournal

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resume:
    """The state of a run directory when ``compile()`` opened it.

    Invariant: a fresh directory (``resumed`` False) has no ledger, no prompt versions and no turns.
    """

    resumed: bool
    """True when the directory already held this same compile."""
    ledger: dict[str, Any] | None = None
    """The ledger snapshot last written, or None (a fresh directory, or none written yet)."""
    prompt_versions: tuple[dict[str, Any], ...] = ()
    """Every prompt version the agent made, in order: re-applied to the working program."""
    turns: tuple[dict[str, Any], ...] = ()
    """Every agent turn so far, in order: the agent continues after them."""
    pending_reply: dict[str, Any] | None = None
    """The root LM's reply of the turn that was cut off while its code ran (``{"iteration", "reasoning", "code"}``):
    the agent runs it again instead of asking the root LM for that turn again."""
    has_result: bool = False
    """``result.json`` exists: with :attr:`final_turn`, the run is finished and is only read back."""
    submission_checked: bool = True
    """The result was chosen with a complete check of the submission (``result.json`` names its run; True when
    that cannot be read): reading the run back needs that run."""

    @property
    def final_turn(self) -> dict[str, Any] | None:
        """The turn in which the agent submitted, when the earlier compile got that far."""
        return self.turns[-1] if self.turns and self.turns[-1].get("final") else None

    def ledger_for(self, limit: int, sub_lm_limit: int | None, runs: Sequence[EvalRun]) -> dict[str, Any] | None:
        """The stored ledger, checked against this compile's budget ``limit``: :class:`RunDirectoryMismatchError`
        naming ``ledger.json`` when it is not this budget's (edited, or written by another version). When it is
        missing although stored ``runs`` were charged (deleted, or the process was killed before its first
        write), one rebuilt from what those runs spent, so nothing they paid for is paid again."""
        ledger = self.ledger
        if ledger is None:
            spent: dict[str, int] = {}
            for run in runs:
                kind = example_kind(run.split)
                spent[kind] = spent.get(kind, 0) + run.budget_spent
            if not sum(spent.values()):
                return None
            logger.warning(
                "ledger.json is missing from this run directory; the budget spent is rebuilt from its runs "
                "(%d unit(s); sub-LM prompts paid before are not counted).",
                sum(spent.values()),
            )
            return {"limit": limit, "spent_by_kind": spent, "sub_lm_limit": sub_lm_limit}
        spent_by_kind = ledger.get("spent_by_kind")
        if not (
            ledger.get("limit") == limit
            and isinstance(spent_by_kind, dict)
            and all(type(v) is int and v >= 0 for v in spent_by_kind.values())
        ):
            raise RunDirectoryMismatchError(
                f"ledger.json in this run directory does not hold this compile's budget (limit {limit}) but limit "
                f"{ledger.get('limit')!r}, spent {spent_by_kind!r}: it was edited or written by another version. "
                "Restore it, or use a new run_storage_dir to start over."
            )
        return ledger

    @property
    def finished(self) -> bool:
        """A finished run: its result is returned without the agent, so no sandbox starts and nothing is written."""
        return self.resumed and self.has_result and self.final_turn is not None


RESULT_SETTINGS = ("rlm_autopilot", "max_demos", "add_format_failure_as_feedback")
"""Settings that decide what a run does (who decides, whether demos may change, what GEPA's reflections read) beside
the budget: a directory holds a run made under one value of each (:meth:`RunJournal.open_manifest` refuses
another)."""


def _compact_structure(fingerprint: dict[str, Any]) -> dict[str, Any]:
    """The program's structure as the manifest keeps it, to say what changed when a resume is refused: its demos'
    long values (an image's data, a long document) cut to their start and a digest, so the file stays small."""

    def short(value: Any) -> Any:
        text = value if isinstance(value, str) else json.dumps(jsonable(value), sort_keys=True)
        return text if len(text) <= 120 else f"{text[:80]}... ({len(text):,} chars, sha256 {sha256_json(text)[:12]})"

    compact = jsonable(fingerprint)
    for predictor in compact.get("predictors", []):
        demos = predictor.get("demos")
        if isinstance(demos, list):
            predictor["demos"] = [
                {k: short(v) for k, v in d.items()} if isinstance(d, dict) else short(d) for d in demos
            ]
    return compact


def _budget_setting(config: Any) -> dict[str, Any]:
    """The budget as the user set it: ``auto`` or ``max_full_evals`` where one sized ``max_metric_calls`` (its number
    follows the data's size), else ``budget_mode``'s own. Told, never compared: a message names what changed."""
    sized = getattr(config.max_metric_calls, "setting", None)
    if sized is not None:
        return {sized[0]: sized[1]}
    if config.max_metric_calls:
        return {"max_metric_calls": int(config.max_metric_calls)}
    return {"max_iterations": config.max_iterations}


def compile_manifest(
    program: Any,
    fingerprint: Any,
    trainset: list,
    valset: list,
    eval_lm: Any,
    metric_id: str,
    budget_limit: int,
    config: Any,
    adapter: Any = None,
    default_adapter: Any = None,
) -> dict[str, Any]:
    """What a run directory belongs to (``manifest.json``): the program's structure and code, the data, the
    evaluation LM, the metric, the budget, ``pass_threshold`` and ``attempt``; ``budget_limit``: the budget's units;
    ``config``: the optimizer (sized for this compile); ``adapter``: the adapter in effect, recorded with the
    evaluation LM unless it is dspy's default one (``default_adapter``)."""
    return {
        "program": fingerprint_digest(fingerprint),
        "program_structure": _compact_structure(fingerprint),
        "starting_instructions": {step: sha256_json(text)[:16] for step, text in get_instructions(program).items()},
        "trainset": examples_digest(trainset),
        "valset": examples_digest(valset),
        "examples_digest_version": EXAMPLES_DIGEST_VERSION,
        "eval_lm": eval_lm_identity(eval_lm, program, adapter, default_adapter),
        "metric": metric_id,
        "program_code": program_code_identity(program),
        "budget_limit": budget_limit,
        "budget_mode": (
            {"max_metric_calls": config.max_metric_calls}
            if config.max_metric_calls
            else {"max_iterations": config.max_iterations}
        ),
        "budget_setting": _budget_setting(config),
        "pass_threshold": config.pass_threshold,
        "attempt": config.attempt,
        "settings": {name: getattr(config, name) for name in RESULT_SETTINGS},
        "created_at": time.time(),
    }


def open_run_directory(
    journal: RunJournal,
    manifest: dict[str, Any],
    *,
    allow_eval_lm_change: bool = False,
    allow_program_change: bool = False,
    hints: Mapping[str, Callable[[Any], str]] | None = None,
) -> Resume:
    """Write or check the manifest (:meth:`RunJournal.open_manifest`, with its ``hints``), then read back what a
    resume needs."""
    opened = journal.open_manifest(
        manifest, allow_eval_lm_change=allow_eval_lm_change, allow_program_change=allow_program_change, hints=hints
    )
    if not opened:
        return Resume(resumed=False)
    return Resume(
        resumed=True,
        ledger=journal.read_ledger(),
        prompt_versions=tuple(journal.prompt_versions()),
        turns=tuple(journal.turns()),
        pending_reply=journal.pending_reply(),
        has_result=journal.layout.result.exists(),
        submission_checked=_submission_checked(journal.layout.result),
    )


def _submission_checked(path: Any) -> bool:
    """Whether ``result.json`` at ``path`` names the run that checked the submission (True unless it says none:
    the spending cap or the budget kept the submission from a check)."""
    try:
        selection = json.loads(path.read_text(encoding="utf-8"))["selection"]
        return selection["submission_run_id"] is not None
    except (OSError, ValueError, TypeError, KeyError):
        return True


def metric_failed_message(directory: Any, temporary: bool, metric_id: str) -> str:
    """What to do once the metric that stopped a compile is fixed: the fixed metric is another metric to the run
    directory (a resume with it is refused), so say what works."""
    if temporary:
        return f"Optimization stopped by the metric. Fix it and run compile() again (what was paid is in {directory})."
    return (
        f"Optimization stopped by the metric. Everything paid for so far is in {directory}. Once the metric is "
        "fixed it is another metric to that directory: run compile() with a new run_storage_dir (or delete this "
        f"one); or, if the fix changes no score the metric already gave, pass metric_id={metric_id!r} to "
        "RLMDocstringOptimizer(...) or compile() to resume with what was paid."
    )


def missing_from_finished_run(directory: Any, what: str) -> RunDirectoryMismatchError:
    """The error for a finished run whose result cannot be read back because ``what`` (a complete run the result
    was chosen from) is missing or unreadable in its ``runs/``: reading it back must not pay for it again."""
    return RunDirectoryMismatchError(
        f"run_storage_dir {str(directory)!r} holds a finished run, but {what} is missing from its runs/ folder or "
        "cannot be read (see the warnings above), so its result cannot be read back without evaluating it again. "
        "Restore the file; or, to run the compile again, use a new run_storage_dir (dspy's cache answers the "
        "requests it has seen)."
    )


def where_message(what: str, directory: Any, temporary: bool) -> str:
    """ "Optimization <what>." and where everything paid for is, and how to resume from it."""
    if temporary:
        return (
            f"Optimization {what}. Everything paid for so far is in {directory} (a temporary directory; "
            "pass run_storage_dir= to make runs resumable)."
        )
    return (
        f"Optimization {what}. Everything paid for so far is in {directory}; run compile() again with "
        "the same run_storage_dir to resume where it stopped."
    )
