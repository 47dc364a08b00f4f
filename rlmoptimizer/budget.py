"""The budget ledger: one thread-safe count of what an optimization run has paid for.

What it counts: one unit per evaluated example (train or validation) and one unit per sub-LM prompt
(``llm_query`` / ``llm_query_batched`` inside the agent's REPL, a proposal, a GEPA reflection). What it does not
count: the baseline evaluations paid before the agent starts (:func:`budget_for_metric_calls` says which), records
reused from an identical earlier evaluation, and the optimizer agent's own turns. With ``sub_lm_limit`` (a budget of ``max_metric_calls``, counted as dspy.GEPA counts: sub-LM prompts are not
metric calls) sub-LM prompts draw on an allowance of their own, and ``limit``, ``spent`` and ``left`` are metric
calls only.

Work that costs budget first *reserves* what it wants; the ledger grants what is left (possibly less,
possibly nothing) and never lets reservations plus spending exceed the limit. The work then *spends*
each unit as it completes and *releases* the rest, so an example that never produced an answer is
never charged, and nothing is overspent however many threads share the ledger.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from rlmoptimizer.errors import BudgetExhaustedError, ConfigurationError

TRAIN_EXAMPLE = "train_example"
VAL_EXAMPLE = "val_example"
SUB_LM_CALL = "sub_lm_call"
KINDS: tuple[str, ...] = (TRAIN_EXAMPLE, VAL_EXAMPLE, SUB_LM_CALL)


def example_kind(split: str) -> str:
    """The kind of unit one evaluation of an example of ``split`` ("train" or "val") costs."""
    return TRAIN_EXAMPLE if split == "train" else VAL_EXAMPLE


def budget_for(max_iterations: int, train_size: int, val_size: int) -> int:
    """``max_iterations * len(trainset) + len(valset)``: the number of units one ``compile()`` may spend."""
    return max_iterations * train_size + val_size


def budget_for_metric_calls(max_metric_calls: int, train_size: int, val_size: int) -> int:
    """The units left of ``max_metric_calls`` (every run of the program on one example counted, as
    ``dspy.GEPA``'s ``max_metric_calls``) once the baseline on the selection split is paid: the validation set when
    there is one (``dspy.GEPA`` evaluates its seed there first too; the train baseline is then evaluated on demand
    and charged like any other evaluation), else the train set. At least what one more evaluation of that split
    costs (a changed program is returned only once scored there), else :class:`ConfigurationError` saying how many
    that needs."""
    baseline = val_size or train_size
    left = max_metric_calls - baseline
    if left < baseline:
        split = f"{val_size} validation" if val_size else f"{train_size} train"
        fewer = ", or use fewer examples" if _fewer_examples_help(max_metric_calls, val_size) else ""
        raise ConfigurationError(
            f"{_calls_named(max_metric_calls)} does not cover the baseline evaluation of the unchanged program "
            f"({split} examples) and one check of a changed program there (a changed program is returned only "
            f"once it scores better there): pass {_at_least(max_metric_calls, 2 * baseline, train_size, val_size)} "
            f"(a useful run needs several times the train set more){fewer}"
        )
    return left


FIRST_CANDIDATE = 6
"""What finding a first candidate costs at least besides checking it on the selection split: its parent and itself on a
3-example minibatch (GEPA's default)."""


def thin_budget_warning(max_metric_calls: int, train_size: int, val_size: int) -> str | None:
    """What a ``max_metric_calls`` that covers the baseline and one check but not a candidate found before that check
    means for the result, said when a compile starts; None when a first candidate fits."""
    baseline = val_size or train_size
    # with a valset, the parent's minibatch is paid too; without, the train baseline holds it
    found = FIRST_CANDIDATE if val_size else FIRST_CANDIDATE // 2
    needed = 2 * baseline + found
    if max_metric_calls >= needed:
        return None
    split = "validation" if val_size else "train"
    fewer = f", or use fewer {split} examples" if _fewer_examples_help(max_metric_calls, val_size) else ""
    return (
        f"{_calls_named(max_metric_calls)} leaves {max_metric_calls - baseline} after the baseline on the "
        f"{baseline} {split} examples, and a first changed program costs about "
        f"{found + baseline} (found on a {FIRST_CANDIDATE // 2}-example minibatch, then checked on all "
        f"{baseline}): the default loop tries no change on what is left, an agent's own moves have those "
        f"{max_metric_calls - baseline} for all they try, and the unchanged program is the likely result. "
        f"Pass {_at_least(max_metric_calls, needed, train_size, val_size)} (a useful run needs several times "
        f"the train set more){fewer}."
    )


class SizedMetricCalls(int):
    """The ``max_metric_calls`` that ``auto`` or ``max_full_evals`` stands for (:func:`gepa_metric_calls`): an int
    that keeps the setting it was sized from (``setting``: its name and value, e.g. ``("max_full_evals", 1)``), so
    what :func:`budget_for_metric_calls` and :func:`thin_budget_warning` say of it names what the user passed."""

    setting: tuple[str, Any]

    def __new__(cls, calls: int, name: str, value: Any) -> SizedMetricCalls:
        sized = super().__new__(cls, calls)
        sized.setting = (name, value)
        return sized

    def __getnewargs__(self) -> tuple[int, str, Any]:  # (copied and pickled with its setting)
        return (int(self), *self.setting)


def _calls_named(max_metric_calls: int) -> str:
    """``max_metric_calls=N`` as the user passed it: ``max_full_evals=1 gives max_metric_calls=12, which`` when a
    setting sized it (see :class:`SizedMetricCalls`)."""
    setting = getattr(max_metric_calls, "setting", None)
    if setting is None:
        return f"max_metric_calls={max_metric_calls}"
    return f"{setting[0]}={setting[1]!r} gives max_metric_calls={int(max_metric_calls)}, which"


def _at_least(max_metric_calls: int, needed: int, train_size: int, val_size: int) -> str:
    """What to pass for ``needed`` metric calls or more, in the setting the user passed: ``max_full_evals >= N`` (the
    fewest evaluations of both sets that cover it), ``max_metric_calls >= needed`` instead of ``auto``, else
    ``max_metric_calls >= needed``."""
    name, value = getattr(max_metric_calls, "setting", ("max_metric_calls", None))
    if name == "max_full_evals":
        return f"max_full_evals >= {math.ceil(needed / (train_size + val_size))}"
    if name == "auto":
        return f"max_metric_calls >= {needed} instead of auto={value!r}"
    return f"max_metric_calls >= {needed}"


def _fewer_examples_help(max_metric_calls: int, val_size: int) -> bool:
    """Whether fewer examples could make ``max_metric_calls`` cover what it must: not when ``max_full_evals`` sized it
    without a validation set (it shrinks with the train set that the baseline is paid on)."""
    return val_size > 0 or getattr(max_metric_calls, "setting", ("",))[0] != "max_full_evals"


AUTO_CANDIDATES = {"light": 6, "medium": 12, "heavy": 18}
"""``auto=`` and the number of candidates ``dspy.GEPA`` sizes its budget for (its ``AUTO_RUN_SETTINGS``)."""


def auto_metric_calls(auto: str, steps: int, val_size: int) -> int:
    """``max_metric_calls`` for ``auto="light" | "medium" | "heavy"``, computed as ``dspy.GEPA.auto_budget`` does
    (dspy 3.4.1) for a program of ``steps`` predictors and a validation set of ``val_size`` examples (the train set's
    size without one): with n candidates (6, 12, 18) it plans N = max(4 * steps * log2(n), 1.5 * n) trials (an int),
    and pays the seed's validation, 5 calls per candidate, N minibatches of 35 and a validation every 5 trials:
    ``V + 5n + 35N + ((N + 1) // 5 + 1 + (1 if N < 5 else 0)) * V``."""
    candidates = AUTO_CANDIDATES[auto]
    trials = int(max(2 * (max(steps, 1) * 2) * math.log2(candidates), 1.5 * candidates))
    full_evals = (trials + 1) // 5 + 1 + (1 if trials < 5 else 0)
    return val_size + candidates * 5 + trials * 35 + full_evals * val_size


def gepa_metric_calls(
    auto: str | None, max_full_evals: int | None, steps: int, train_size: int, val_size: int
) -> int | None:
    """The ``max_metric_calls`` that ``auto`` or ``max_full_evals`` stand for on this program and data, as
    ``dspy.GEPA`` sizes it in its ``compile()`` (a :class:`SizedMetricCalls`, which names the setting); None when
    neither is set. ``max_full_evals`` is that many evaluations of the train and validation sets together."""
    if auto is not None:
        return SizedMetricCalls(auto_metric_calls(auto, steps, val_size or train_size), "auto", auto)
    if max_full_evals is not None:
        return SizedMetricCalls(max_full_evals * (train_size + val_size), "max_full_evals", max_full_evals)
    return None


def baseline_on_demand(max_metric_calls: int | None, val_size: int) -> bool:
    """Whether the train baseline waits until something reads it: with ``max_metric_calls`` and a validation set,
    where it is paid from the budget (see :func:`budget_for_metric_calls`) and a GEPA run that starts from the
    unchanged program pays only the train examples it draws, as ``dspy.GEPA`` does."""
    return bool(max_metric_calls) and val_size > 0


class Reservation:
    """Units set aside for one batch of work. Spend them one by one; release what is left.

    Use as a context manager to release the unspent rest on exit, also when the batch fails.
    """

    def __init__(self, ledger: BudgetLedger, kind: str, granted: int) -> None:
        self._ledger = ledger
        self.kind = kind
        self.granted = granted
        self.spent = 0
        self._open = granted

    @property
    def remaining(self) -> int:
        """Units still reserved and not yet spent or released."""
        return self._open

    def spend(self, n: int = 1) -> None:
        """Charge ``n`` of the reserved units. Spending more than was granted is a programming error."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"can only spend an int >= 0 of units, got {n!r}")
        if n == 0:
            return
        with self._ledger._lock:
            if n > self._open:
                raise BudgetExhaustedError(
                    f"reservation of {self.granted} {self.kind} unit(s) has only {self._open} left, asked to spend {n}"
                )
            self._open -= n
            self.spent += n
            self._ledger._reserved[self._ledger.pool_of(self.kind)] -= n
            self._ledger._spent_by_kind[self.kind] = self._ledger._spent_by_kind.get(self.kind, 0) + n

    def release(self) -> None:
        """Give back every unit not spent. Idempotent."""
        with self._ledger._lock:
            self._ledger._reserved[self._ledger.pool_of(self.kind)] -= self._open
            self._open = 0

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


_MAIN, _SUB = "main", "sub"


class BudgetLedger:
    """Thread-safe ledger with a fixed ``limit`` of units, spent by kind (see :data:`KINDS`)."""

    def __init__(
        self,
        limit: int,
        spent_by_kind: dict[str, int] | None = None,
        gate: Any = None,
        sub_lm_limit: int | None = None,
    ) -> None:
        """``gate``: another limit on what may be reserved (the spending cap): an object with
        ``allow(kind, n) -> int`` (how many of ``n`` units it permits) and ``reason() -> str | None`` (why it
        refuses, once it does). ``sub_lm_limit``: sub-LM prompts get an allowance of their own instead of drawing
        on ``limit`` (see the module docstring)."""
        for name, value in (("budget limit", limit), ("sub_lm_limit", 0 if sub_lm_limit is None else sub_lm_limit)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        self.limit = limit
        self.sub_lm_limit = sub_lm_limit
        self._lock = threading.Lock()
        self._reserved = {_MAIN: 0, _SUB: 0}
        self._spent_by_kind: dict[str, int] = {kind: 0 for kind in KINDS}
        for kind, amount in (spent_by_kind or {}).items():
            self._spent_by_kind[kind] = int(amount)
        self.gate = gate

    def pool_of(self, kind: str) -> str:
        """Which allowance units of ``kind`` draw on: ``"sub"`` for sub-LM prompts with a ``sub_lm_limit``."""
        return _SUB if kind == SUB_LM_CALL and self.sub_lm_limit is not None else _MAIN

    def counts_toward_limit(self, kind: str) -> bool:
        """Whether units of ``kind`` draw on :attr:`limit` (every kind, unless sub-LM prompts have their own)."""
        return self.pool_of(kind) == _MAIN

    def _spent_in(self, pool: str) -> int:
        return sum(amount for kind, amount in self._spent_by_kind.items() if self.pool_of(kind) == pool)

    def _available(self, pool: str) -> int:
        limit = self.limit if pool == _MAIN else (self.sub_lm_limit or 0)
        return max(0, limit - self._spent_in(pool) - self._reserved[pool])

    @property
    def stop_reason(self) -> str | None:
        """Why no more can be reserved although units are left (the spending cap), or None."""
        return self.gate.reason() if self.gate is not None else None

    # -- reading ---------------------------------------------------------------------------------
    @property
    def spent(self) -> int:
        """Units spent of :attr:`limit`."""
        with self._lock:
            return self._spent_in(_MAIN)

    @property
    def left(self) -> int:
        """Units of :attr:`limit` neither spent nor reserved."""
        with self._lock:
            return self._available(_MAIN)

    def left_for(self, kind: str) -> int:
        """Units neither spent nor reserved of the allowance units of ``kind`` draw on (:attr:`left`, or the sub-LM
        prompts' own)."""
        with self._lock:
            return self._available(self.pool_of(kind))

    @property
    def spent_by_kind(self) -> dict[str, int]:
        with self._lock:
            return dict(self._spent_by_kind)

    def snapshot(self) -> dict[str, Any]:
        """JSON-friendly state: ``{"limit", "spent", "left", "spent_by_kind"}``, plus ``"sub_lm_limit"`` and
        ``"sub_lm_left"`` when sub-LM prompts have their own allowance."""
        with self._lock:
            state: dict[str, Any] = {
                "limit": self.limit,
                "spent": self._spent_in(_MAIN),
                "left": self._available(_MAIN),
                "spent_by_kind": dict(self._spent_by_kind),
            }
            if self.sub_lm_limit is not None:
                state["sub_lm_limit"] = self.sub_lm_limit
                state["sub_lm_left"] = self._available(_SUB)
            return state

    @classmethod
    def from_snapshot(cls, snapshot: dict[str, Any], gate: Any = None) -> BudgetLedger:
        sub = snapshot.get("sub_lm_limit")
        return cls(
            int(snapshot["limit"]),
            spent_by_kind=snapshot.get("spent_by_kind"),
            gate=gate,
            sub_lm_limit=None if sub is None else int(sub),
        )

    # -- reserving -------------------------------------------------------------------------------
    def reserve(self, n: int, kind: str) -> Reservation:
        """Reserve up to ``n`` units of ``kind``; the grant is ``min(n, left)`` and may be 0. Never raises
        for lack of budget: the caller evaluates what was granted and says so."""
        self._check(n, kind)
        with self._lock:
            granted = min(n, self._available(self.pool_of(kind)))
            if self.gate is not None and granted:
                granted = max(0, min(granted, self.gate.allow(kind, granted)))
            self._reserved[self.pool_of(kind)] += granted
        return Reservation(self, kind, granted)

    def reserve_exactly(self, n: int, kind: str) -> Reservation:
        """Reserve exactly ``n`` units or raise :class:`BudgetExhaustedError` (reserving nothing)."""
        self._check(n, kind)
        pool = self.pool_of(kind)
        with self._lock:
            available = self._available(pool)
            if n > available:
                of = (
                    f"{self.limit}"
                    if pool == _MAIN
                    else f"the {self.sub_lm_limit} sub-LM prompts allowed besides max_metric_calls"
                )
                raise BudgetExhaustedError(f"budget exhausted: {n} {kind} unit(s) requested, {available} of {of} left")
            if self.gate is not None and n and self.gate.allow(kind, n) < n:
                raise BudgetExhaustedError(self.gate.reason() or f"{n} {kind} unit(s) refused by the spending cap")
            self._reserved[pool] += n
        return Reservation(self, kind, n)

    def _check(self, n: int, kind: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown budget kind {kind!r}; expected one of {KINDS}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"can only reserve an int >= 0 of units, got {n!r}")
