"""What an optimization run spent on LM calls, per role, in tokens and (where litellm knows the price) dollars.

Roles:

``root``
    the optimizer agent's own turns and the final extraction;
``sub``
    the agent's ``llm_query`` / ``llm_query_batched`` prompts, its proposals and GEPA's reflections;
``eval``
    the program under optimization (every predictor, whatever LM it is set to) and the metric's own LM calls.

How calls are counted: dspy reports every completed, non-cached LM call to ``dspy.settings.usage_tracker``
(``add_usage(model, usage)``), on every engine path (chat, Responses API, explicit requests), from whichever
thread made the call. :class:`UsageMeter` hands out one tracker per role, and the optimizer installs it with
``dspy.context(usage_tracker=meter.tracker(role))`` around the work of that role; contextvars carry it into the
evaluation threads. A tracker that was installed before (a user's ``dspy.track_usage()``) still receives every
call. Cache hits cost nothing and are not counted.

Dollars: ``litellm.cost_per_token`` for the model name the call reports, per call (tiered prices apply per
request), summed as decimals so the total is the same whatever order threads finish in. A model litellm has no
price for makes that role's dollars ``None`` (never a guess) while its tokens are still counted.

May import: dspy, litellm, ``rlmoptimizer.events``, ``rlmoptimizer.errors`` and the standard library.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from functools import lru_cache
from typing import Any

from rlmoptimizer.events import AgentTurn, EvaluationFinished, Event, ExampleEvaluated, SubLMAnswered

logger = logging.getLogger(__name__)

ROOT = "root"
SUB = "sub"
EVAL = "eval"
ROLES: tuple[str, ...] = (ROOT, SUB, EVAL)
CHARS_PER_TOKEN = 4.0
"""Characters per token of English prose on common tokenizers: a prompt's size before it is sent."""

__all__ = [
    "EVAL",
    "ROLES",
    "ROOT",
    "SUB",
    "CostGate",
    "RoleTracker",
    "UsageMeter",
    "UsageObserver",
    "dollars",
    "price_of_call",
]


def dollars(amount: float) -> str:
    """``amount`` as people read dollars: 4 decimals, and as many more as a smaller amount needs to show two
    significant digits (``$0.000001``, never ``$0.0000``)."""
    amount = float(amount)
    decimals = 4
    if 0 < abs(amount) < 0.001:
        decimals = min(20, 1 - math.floor(math.log10(abs(amount))))
    text = f"{amount:.{decimals}f}"
    if decimals > 4:
        text = text.rstrip("0")
    return f"${text}"


def _int(value: Any) -> int:
    """A token count as reported, 0 for anything else (a missing, negative or non-finite count says nothing)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return 0
    return int(value) if isinstance(value, int) or math.isfinite(value) else 0


def _cached_tokens(usage: dict[str, Any]) -> int:
    details = usage.get("prompt_tokens_details") or {}
    if not isinstance(details, dict):
        details = getattr(details, "__dict__", {}) or {}
    cached = _int(details.get("cached_tokens"))
    # Anthropic-style counters some providers report at the top level.
    return cached or _int(usage.get("cache_read_input_tokens"))


_LITELLM_IMPORT = threading.Lock()


def import_litellm() -> Any:
    """``litellm``, imported. Its first import takes seconds; one stopped midway (a Ctrl-C, as a compile starts)
    leaves half-made ``litellm.*`` modules behind, and every later ``import litellm`` in the process then fails on
    them (``partially initialized module 'litellm'``), dspy's own LM calls included. So the modules an import that
    did not finish added are taken out again, and the next import starts clean."""
    module = sys.modules.get("litellm")
    if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
        return module  # (one still being imported by another thread is waited for by the import below)
    with _LITELLM_IMPORT:
        started = "litellm" not in sys.modules  # this import makes it (not one another thread started)
        before = {name for name in sys.modules if name == "litellm" or name.startswith("litellm.")}
        try:
            import litellm
        except BaseException:
            if started:
                for name in [
                    n for n in sys.modules if (n == "litellm" or n.startswith("litellm.")) and n not in before
                ]:
                    sys.modules.pop(name, None)
            raise
        return litellm


@lru_cache(maxsize=256)
def _priced_name(model: str) -> str | None:
    """The key under which litellm's price table knows ``model`` (with or without its provider prefix)."""
    try:
        litellm = import_litellm()
    except ImportError:  # pragma: no cover - litellm ships with dspy's default extras
        return None
    table = getattr(litellm, "model_cost", {}) or {}
    candidates = [model]
    if "/" in model:
        candidates.append(model.split("/", 1)[1])
    for name in candidates:
        entry = table.get(name)
        if isinstance(entry, dict) and (
            entry.get("input_cost_per_token") is not None or entry.get("output_cost_per_token") is not None
        ):
            return model if name == model else name
    return None


def unpriced_models(rows: Any) -> list[str]:
    """The models litellm has no price for among ``rows`` (objects with ``model`` and ``cost_usd``) whose dollars are
    unknown; a row's ``model`` may name several (``"a, b"``: the program's steps on different LMs)."""
    names = {name for row in rows if row.cost_usd is None and row.model for name in row.model.split(", ")}
    return sorted(name for name in names if price_of_call(name, 1, 1) is None)


def price_of_call(model: str, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0) -> Decimal | None:
    """Dollars for one call by litellm's price table, or None when litellm has no price for ``model``."""
    name = _priced_name(model) if isinstance(model, str) and model else None
    if name is None:
        return None
    litellm = import_litellm()

    try:
        prompt_cost, completion_cost = litellm.cost_per_token(
            model=name,
            prompt_tokens=input_tokens,
            completion_tokens=output_tokens,
            cache_read_input_tokens=cached_input_tokens,
        )
    except Exception:  # litellm's table has the name but cannot price this shape: unknown, not zero
        return None
    return Decimal(repr(float(prompt_cost))) + Decimal(repr(float(completion_cost)))


class _RoleTotals:
    __slots__ = ("calls", "input_tokens", "cached_input_tokens", "output_tokens", "usd", "unpriced_models", "units")

    def __init__(self) -> None:
        self.calls = 0
        self.input_tokens = 0
        self.cached_input_tokens = 0
        self.output_tokens = 0
        self.usd = Decimal(0)
        self.unpriced_models: set[str] = set()
        self.units = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "input_tokens": self.input_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": None if self.unpriced_models else float(self.usd),
            # what the calls with a price cost: the cap counts them, and a resume goes on from them
            **(
                {"unpriced_models": sorted(self.unpriced_models), "priced_usd": float(self.usd)}
                if self.unpriced_models
                else {}
            ),
        }

    def load(self, data: dict[str, Any]) -> None:
        self.calls = _int(data.get("calls"))
        self.input_tokens = _int(data.get("input_tokens"))
        self.cached_input_tokens = _int(data.get("cached_input_tokens"))
        self.output_tokens = _int(data.get("output_tokens"))
        cost = data.get("cost_usd")
        if not isinstance(cost, (int, float)) or isinstance(cost, bool):
            cost = data.get("priced_usd")  # a role with an unpriced model: what its priced calls cost
        self.usd = (
            Decimal(repr(float(cost))) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else Decimal(0)
        )
        self.unpriced_models = set(data.get("unpriced_models") or ())


@lru_cache(maxsize=1)
def mark_lm_errors() -> Any:
    """The dspy callback that marks every exception an LM call raises (:data:`~rlmoptimizer.errors.RAISED_BY_LM`): a
    custom ``dspy.BaseLM``'s own error reaches us unwrapped, and is then still told for an LM that gave no answer.
    One instance, made on first use (dspy is imported then)."""
    from dspy.utils import BaseCallback

    from rlmoptimizer.errors import RAISED_BY_LM

    class MarksLMErrors(BaseCallback):
        def on_lm_end(self, call_id: str, outputs: Any, exception: Exception | None = None) -> None:
            if exception is not None:
                try:
                    setattr(exception, RAISED_BY_LM, True)
                except (AttributeError, TypeError):  # (an exception type without attributes: left unmarked)
                    pass

    return MarksLMErrors()


class RoleTracker:
    """A ``dspy.settings.usage_tracker`` that books every call to one role of a :class:`UsageMeter`."""

    def __init__(self, meter: UsageMeter, role: str, forward: Any = None) -> None:
        self.meter = meter
        self.role = role
        self.forward = forward

    def __deepcopy__(self, memo: dict) -> RoleTracker:
        # dspy's ParallelExecutor (dspy.Parallel, dspy.Evaluate inside a program or metric) deep-copies the tracker
        # into each worker thread; the meter is thread-safe and must see those calls, so the copy is this tracker.
        return self

    def __copy__(self) -> RoleTracker:
        return self

    def add_usage(self, lm: str, usage_entry: dict[str, Any]) -> None:
        self.meter.record(self.role, lm, usage_entry)
        forward = self.forward
        while isinstance(forward, RoleTracker) and forward.meter is self.meter:
            forward = forward.forward  # a nested role of the same meter: counted once, by the innermost role
        if forward is not None:
            forward.add_usage(lm, usage_entry)


class UsageMeter:
    """Thread-safe per-role totals of LM calls, tokens and dollars, with an optional spending cap."""

    def __init__(self, *, max_cost_usd: float | None = None) -> None:
        self.max_cost_usd = max_cost_usd
        _priced_name.cache_clear()  # prices registered with litellm.register_model since the last run count
        self._lock = threading.Lock()
        self._roles = {role: _RoleTotals() for role in ROLES}
        self._cap_reached_at: dict[str, Any] | None = None
        self._warned: set[str] = set()  # models whose calls reported no usage, warned of once

    # -- recording --------------------------------------------------------------------------------------
    def tracker(self, role: str, forward: Any = None) -> RoleTracker:
        """The usage tracker to install with ``dspy.context(usage_tracker=...)`` for ``role``'s calls;
        ``forward`` (e.g. the tracker installed before) also receives every call."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
        return RoleTracker(self, role, forward)

    def in_role(self, role: str, fn: Callable) -> Callable:
        """``fn`` with every LM call it makes (in its thread and the threads it starts with a copied context)
        booked to ``role``; a tracker installed when it is called still receives them too. An error an LM call
        raises is marked as the LM's (:func:`mark_lm_errors`)."""
        import functools

        import dspy

        @functools.wraps(fn)
        def booked(*args: Any, **kwargs: Any) -> Any:
            callbacks = list(dspy.settings.get("callbacks") or [])
            mark = mark_lm_errors()
            if not any(callback is mark for callback in callbacks):
                callbacks.append(mark)
            with dspy.context(
                usage_tracker=self.tracker(role, forward=dspy.settings.usage_tracker), callbacks=callbacks
            ):
                return fn(*args, **kwargs)

        return booked

    def record(self, role: str, model: str, usage: dict[str, Any]) -> None:
        """Book one call of ``model`` with dspy's usage dict (``prompt_tokens``, ``completion_tokens``, ...)."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
        usage = dict(usage or {})
        input_tokens = _int(usage.get("prompt_tokens", usage.get("input_tokens")))
        output_tokens = _int(usage.get("completion_tokens", usage.get("output_tokens")))
        cached = _cached_tokens(usage)
        # A call that reports no input tokens (a client that returns no usage) costs what it costs: unknown, not $0.
        price = price_of_call(model, input_tokens, output_tokens, cached) if input_tokens else None
        unpriced = str(model) if input_tokens else f"{model} (no token usage reported)"
        with self._lock:
            totals = self._roles[role]
            totals.calls += 1
            totals.input_tokens += input_tokens
            totals.output_tokens += output_tokens
            totals.cached_input_tokens += cached
            if price is None:
                if not input_tokens and unpriced not in self._warned and self.max_cost_usd is not None:
                    self._warned.add(unpriced)  # once per model, whichever role calls it
                    logger.warning(
                        "A call of %s (%s) reported no token usage: its cost is unknown, and max_cost_usd counts "
                        "only the calls it can price. Have the LM's client return its usage.",
                        model,
                        role,
                    )
                totals.unpriced_models.add(unpriced)
            else:
                totals.usd += price
            if self.max_cost_usd is not None and self._cap_reached_at is None:  # (any role: the root's turns too)
                spent = sum((t.usd for t in self._roles.values()), Decimal(0))
                if spent >= Decimal(repr(float(self.max_cost_usd))):
                    self._cap_reached_at = {"role": role, "spent_usd": float(spent)}

    def add_units(self, role: str, n: int = 1) -> None:
        """Count ``n`` units of work done by ``role`` (an evaluated example, a sub-LM prompt), for the spending
        cap's estimate of what the next unit costs."""
        with self._lock:
            self._roles[role].units += n

    # -- reading ----------------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """``{"root": {...}, "sub": {...}, "eval": {...}, "total": {...}}``; each with ``calls``,
        ``input_tokens``, ``cached_input_tokens``, ``output_tokens`` and ``cost_usd`` (None when a model of that
        role has no price in litellm's table, listed in ``unpriced_models``); and ``<role>_units``, the work each
        role's calls paid for (evaluated examples, sub-LM prompts)."""
        with self._lock:
            out: dict[str, Any] = {role: totals.as_dict() for role, totals in self._roles.items()}
            total = _RoleTotals()
            for totals in self._roles.values():
                total.calls += totals.calls
                total.input_tokens += totals.input_tokens
                total.cached_input_tokens += totals.cached_input_tokens
                total.output_tokens += totals.output_tokens
                total.usd += totals.usd
                total.unpriced_models |= totals.unpriced_models
            out["total"] = total.as_dict()
            # the work each role's dollars paid for (evaluated examples, sub-LM prompts): a resumed run's spending cap
            # prices its next unit from them, as the run before it did
            out.update({f"{role}_units": totals.units for role, totals in self._roles.items()})
            if self.max_cost_usd is not None:
                out["max_cost_usd"] = self.max_cost_usd
                out["cap_reached"] = self._cap_reached_at is not None
        return out

    def restore(self, snapshot: dict[str, Any] | None, finished: bool = False) -> None:
        """Continue counting from a stored :meth:`snapshot` (a resumed run); a cap it reached stays reached at the
        same ``max_cost_usd``, and a ``max_cost_usd`` lowered to what was already spent is reached at once.
        ``finished``: a finished run read back, which is shown with the cap it ran with, reached or not."""
        if not snapshot:
            return
        with self._lock:
            for role in ROLES:
                if isinstance(snapshot.get(role), dict):
                    self._roles[role].load(snapshot[role])
                    self._roles[role].units = _int(snapshot.get(f"{role}_units"))
            spent = sum((t.usd for t in self._roles.values()), Decimal(0))
            if finished:  # nothing more is spent: the cap is the one it ran with, as it ended
                self.max_cost_usd = snapshot.get("max_cost_usd")
                self._cap_reached_at = (
                    {"role": None, "spent_usd": float(spent)} if snapshot.get("cap_reached") else None
                )
                return
            same_cap = snapshot.get("cap_reached") and snapshot.get("max_cost_usd") == self.max_cost_usd
            lowered = self.max_cost_usd is not None and spent >= Decimal(repr(float(self.max_cost_usd)))
            if same_cap or lowered:  # (a raised cap above what was spent: go on)
                self._cap_reached_at = {"role": None, "spent_usd": float(spent)}

    @property
    def spent_usd(self) -> float:
        """Dollars spent on calls with a known price."""
        with self._lock:
            return float(sum((t.usd for t in self._roles.values()), Decimal(0)))

    def summary(self) -> str:
        """One line for people: calls, tokens and dollars per role (or which models litellm has no price for)."""
        snap = self.snapshot()
        parts = []
        for role in (*ROLES, "total"):
            data = snap[role]
            unpriced = ", ".join(data.get("unpriced_models", ()))
            cost = f"no price for {unpriced}" if data["cost_usd"] is None else dollars(data["cost_usd"])
            cached = f" ({data['cached_input_tokens']:,} cached)" if data["cached_input_tokens"] else ""
            parts.append(
                f"{role} {data['calls']} calls, {data['input_tokens']:,} in{cached} / "
                f"{data['output_tokens']:,} out, {cost}"
            )
        return "; ".join(parts)

    # -- the spending cap -------------------------------------------------------------------------------
    @property
    def cap_reached(self) -> bool:
        return self._cap_reached_at is not None

    def affordable_units(self, role: str, n: int) -> int:
        """How many of ``n`` further units of ``role``'s work fit under ``max_cost_usd``.

        A unit is priced at what the role's units cost so far on average (0 before the first priced one: the
        first unit is always allowed, the free baseline evaluation calibrates the eval role). Once a request does
        not fit whole, the cap counts as reached (and stays so): the part granted is the last work it allows."""
        if self.max_cost_usd is None or n <= 0:
            return n
        with self._lock:
            if self._cap_reached_at is not None:
                return 0
            spent = sum((t.usd for t in self._roles.values()), Decimal(0))
            room = Decimal(repr(float(self.max_cost_usd))) - spent
            totals = self._roles[role]
            per_unit = totals.usd / totals.units if totals.units and totals.usd else Decimal(0)
            if room <= 0:
                fits = 0
            elif per_unit == 0:
                fits = n
            else:
                fits = min(n, int(room / per_unit))
            if fits < n:  # what is granted now is the last the cap allows
                self._cap_reached_at = {"role": role, "spent_usd": float(spent)}
            return fits

    def prompts_refused(self, role: str, model: str, prompts: list[str], max_tokens: int | None = None) -> str | None:
        """Why ``max_cost_usd`` cannot pay ``prompts`` to ``model`` for ``role``, or None when it can (or no price is
        known): each priced before it is sent from its own length (:data:`CHARS_PER_TOKEN`) and the role's average
        answer so far (``max_tokens`` before the first). A prompt's size is the sender's to choose, so an average
        over earlier, shorter prompts would let a long one through."""
        if self.max_cost_usd is None or not prompts:
            return None
        with self._lock:
            totals = self._roles[role]
            answer = totals.output_tokens // totals.calls if totals.calls else int(max_tokens or 0)
            room = Decimal(repr(float(self.max_cost_usd))) - sum((t.usd for t in self._roles.values()), Decimal(0))
        cost = Decimal(0)
        for prompt in prompts:
            price = price_of_call(model, math.ceil(len(prompt) / CHARS_PER_TOKEN), answer)
            if price is None:
                return None
            cost += price
        if cost <= room:
            return None
        size = sum(len(prompt) for prompt in prompts)
        return (
            f"{len(prompts)} prompt(s) of {size:,} characters would cost about {dollars(float(cost))}, and "
            f"{dollars(max(0.0, float(room)))} of max_cost_usd={dollars(self.max_cost_usd)} is left"
        )

    @property
    def spent_all(self) -> bool:
        """Whether what was spent is ``max_cost_usd`` or more: no LM call of any role is sent any more (the agent's
        turns included, which the cap cannot price before they are sent)."""
        return self.max_cost_usd is not None and self.spent_usd >= self.max_cost_usd

    def gate(self) -> CostGate:
        """The :class:`~rlmoptimizer.budget.BudgetLedger` gate that applies ``max_cost_usd`` to budget units."""
        return CostGate(self)

    @property
    def cap_reason(self) -> str:
        """Why spending stopped, in a few words (no advice): ``""`` until the cap is reached."""
        if not self.cap_reached:
            return ""
        return (
            f"spending cap reached: {dollars(self.spent_usd)} of max_cost_usd={dollars(self.max_cost_usd)} spent on LM "
            "calls"
        )

    def cap_message(self) -> str:
        """:attr:`cap_reason` with what the agent can still do."""
        reason = self.cap_reason or "spending cap not reached"
        return f"{reason}, so no more evaluations or sub-LM calls; you can still analyse, update prompts and SUBMIT"


_ROLE_OF_KIND = {"train_example": EVAL, "val_example": EVAL, "sub_lm_call": SUB}


class CostGate:
    """Applies a meter's ``max_cost_usd`` to the budget ledger's reservations: evaluated examples are the eval
    role's units, sub-LM prompts the sub role's."""

    def __init__(self, meter: UsageMeter) -> None:
        self.meter = meter

    def allow(self, kind: str, n: int) -> int:
        return self.meter.affordable_units(_ROLE_OF_KIND.get(kind, EVAL), n)

    def reason(self) -> str | None:
        return self.meter.cap_message() if self.meter.cap_reached else None


class UsageObserver:
    """Counts each evaluated example as a unit of the eval role and each paid sub-LM prompt as one of the sub role
    (for the spending cap's estimate) and hands
    the meter's snapshot to ``write`` after every evaluation and agent turn (``usage.json``)."""

    EVERY_S = 0.1
    """Within an evaluation, ``usage.json`` is written after an example at most this often (a process killed in the
    middle of one loses what its calls cost since the last write; the records it paid are kept and charged on
    resume)."""

    def __init__(
        self,
        meter: UsageMeter,
        write: Callable[[dict[str, Any]], None],
        write_soon: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """``write_soon``: how a snapshot is written after an example, on the evaluation's thread (default
        ``write``); one that cannot be written then is written when the evaluation ends."""
        self.meter = meter
        self.write = write
        self.write_soon = write_soon or write
        self._written = 0.0
        self._lock = threading.Lock()

    def on_event(self, event: Event) -> None:
        if isinstance(event, ExampleEvaluated):
            self.meter.add_units(EVAL, 1)
            with self._lock:  # (examples finish on the evaluation's threads)
                due = time.monotonic() - self._written >= self.EVERY_S
                if due:
                    self._written = time.monotonic()
            if due:
                self.write_soon(self.meter.snapshot())
        elif isinstance(event, (AgentTurn, EvaluationFinished, SubLMAnswered)):
            if isinstance(event, SubLMAnswered):  # every paid sub-LM prompt: the agent's, a proposal, a reflection
                self.meter.add_units(SUB, event.prompts)
            with self._lock:
                self._written = time.monotonic()
            self.write(self.meter.snapshot())
