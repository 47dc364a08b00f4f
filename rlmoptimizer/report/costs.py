"""What a compile() will cost, said before any paid call (:class:`CostEstimate`), and how that compared with what it
spent (:class:`CostCheck`).

The estimate is made by :mod:`rlmoptimizer.estimate` (``optimizer.estimate(...)``, and at the start of every
``compile()``: shown by ``verbose=True``, kept in the run directory as ``estimate.json``); these are its values:
frozen, plain-JSON (``to_dict()`` / ``from_dict()``), and readable at 80 columns (``str()``). The check is what
``optimized.cost_check`` and ``python -m rlmoptimizer report RUN_DIR`` show: per role, predicted beside actual.

May import what :mod:`rlmoptimizer.report` may.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from rlmoptimizer.usage import EVAL, ROOT, SUB, dollars, unpriced_models

__all__ = ["CostCheck", "CostEstimate", "RoleCheck", "RoleCost"]

_ORDER = (EVAL, SUB, ROOT)  # the table's order: the program's calls first, the agent's last


def _count(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _usd(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _tokens(n: float) -> str:
    """``n`` short: ``950``, ``12.3k``, ``4.10M``, ``2.00B``."""
    if n >= 1_000_000_000:
        return f"{n / 1_000_000_000:.2f}B"
    if n >= 1_000_000:
        return f"{n / 1_000_000:.2f}M"
    if n >= 10_000:
        return f"{n / 1_000:.1f}k"
    return f"{n:,.0f}"


def _calls(n: float) -> str:
    """Calls as counted (``1,234``), short from a million (``1.23M``)."""
    return _tokens(n) if n >= 1_000_000 else f"{n:,.0f}"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _money(usd: float | None, calls: int = 1) -> str:
    """Dollars as people read them; ``-`` for no call at all, ``unknown`` where litellm has no price."""
    if not calls:
        return "-"
    return "unknown" if usd is None else dollars(usd)


@dataclass(frozen=True)
class RoleCost:
    """The LM work of one role (or a total): calls, tokens and, where litellm knows the price, dollars."""

    role: str
    """``eval``, ``sub``, ``root``, or a total's name (``total``, ``if solved early``, ``at most``)."""
    model: str = ""
    """The LM's name (several, comma-separated, when the steps run on different LMs); empty for a total."""
    calls: int = 0
    """LM calls."""
    input_tokens: int = 0
    """Prompt tokens, without any provider's prompt-cache discount."""
    output_tokens: int = 0
    """Completion tokens."""
    cost_usd: float | None = 0.0
    """Dollars at litellm's price for ``model``; None when litellm has no price for it (never a guess)."""
    seconds: float = 0.0
    """Wall time of these calls at the latency the estimate was given."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], role: str = "") -> RoleCost:
        return cls(
            role=str(data.get("role", role)),
            model=str(data.get("model", "")),
            calls=_count(data.get("calls")),
            input_tokens=_count(data.get("input_tokens")),
            output_tokens=_count(data.get("output_tokens")),
            cost_usd=_usd(data.get("cost_usd")),
            seconds=float(_usd(data.get("seconds")) or 0.0),
        )

    def plus(self, other: RoleCost, role: str) -> RoleCost:
        """The sum of two rows (dollars unknown when either is)."""
        usd = None if self.cost_usd is None or other.cost_usd is None else self.cost_usd + other.cost_usd
        return RoleCost(
            role=role,
            calls=self.calls + other.calls,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost_usd=usd,
            seconds=self.seconds + other.seconds,
        )


def _total(rows: tuple[RoleCost, ...], role: str = "total") -> RoleCost:
    total = RoleCost(role=role)
    for row in rows:
        total = total.plus(row, role)
    return total


@dataclass(frozen=True)
class CostEstimate:
    """What a ``compile()`` with given settings will cost, computed before any paid call.

    Per role (``eval``: the program's calls, not an LLM-judge metric's; ``sub``: proposals and GEPA's reflections;
    ``root``: the agent's turns) the expected LM calls, tokens and dollars if the run spends its budget, which the
    default loop does unless the task is solved first. ``if_solved_early`` is the total when the first round of
    proposals (one per step) passes every train example (the loop then stops), ``at_most`` the total when every limit is reached
    (the budget, the sub-LM allowance, ``rlm_max_iterations`` turns of a full context window). ``cap`` says
    whether ``max_cost_usd`` will stop the run early. How it is computed and its assumptions: the "Costs" page of
    the docs (``assumptions`` lists those this estimate used)."""

    roles: tuple[RoleCost, ...]
    """One row per role, ``eval``, ``sub``, ``root``: if the run spends its budget."""
    solved_early: tuple[RoleCost, ...]
    """One row per role if the first round of proposals (one per step) passes every train example: the loop stops
    there (about the least a run that improves anything spends)."""
    at_most: RoleCost
    """The total if every limit is reached; the root's input at a full context window on every turn."""
    setting: str
    """The settings in one line: the pilot mode and the budget."""
    program_runs: int
    """Runs of the program on one example (metric calls), the baselines included."""
    baseline_runs: int
    """Of ``program_runs``, those of the unchanged program before the optimizer starts."""
    proposals: int
    """Sub-LM prompts: GEPA's reflections and the loop's proposals."""
    root_turns: int
    """Agent turns (0 with ``rlm_autopilot="loop"``)."""
    cap: str
    """Whether ``max_cost_usd`` will stop the run early, in a sentence."""
    max_cost_usd: float | None = None
    seconds_per_call: dict[str, float] = field(default_factory=dict)
    """The latency the times assume, per role."""
    sampled: int = 0
    """Train examples run (and paid for, unless dspy's cache had them) to measure the program's calls; 0: none."""
    assumptions: tuple[str, ...] = ()
    """What the estimate assumed, one line each."""

    @property
    def total(self) -> RoleCost:
        """The sum of the roles, if the run spends its budget."""
        return _total(self.roles)

    @property
    def if_solved_early(self) -> RoleCost:
        """The sum of the roles if the first round of proposals solves the task."""
        return _total(self.solved_early, "if solved early")

    def role(self, name: str) -> RoleCost:
        """The row of role ``name``."""
        for row in self.roles:
            if row.role == name:
                return row
        raise KeyError(f"no role {name!r}; the roles are {[r.role for r in self.roles]}")

    @property
    def cost_usd(self) -> float | None:
        """The expected dollars, or None when litellm has no price for some LM."""
        return self.total.cost_usd

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (``estimate.json``)."""
        data = asdict(self)
        data["total"] = asdict(self.total)
        data["if_solved_early"] = asdict(self.if_solved_early)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostEstimate:
        rows = data.get("roles") or []
        return cls(
            roles=tuple(RoleCost.from_dict(r) for r in rows if isinstance(r, Mapping)),
            solved_early=tuple(RoleCost.from_dict(r) for r in data.get("solved_early") or () if isinstance(r, Mapping)),
            at_most=RoleCost.from_dict(data.get("at_most") or {}, "at most"),
            setting=str(data.get("setting", "")),
            program_runs=_count(data.get("program_runs")),
            baseline_runs=_count(data.get("baseline_runs")),
            proposals=_count(data.get("proposals")),
            root_turns=_count(data.get("root_turns")),
            cap=str(data.get("cap", "")),
            max_cost_usd=_usd(data.get("max_cost_usd")),
            seconds_per_call={
                str(k): float(v) for k, v in (data.get("seconds_per_call") or {}).items() if _usd(v) is not None
            },
            sampled=_count(data.get("sampled")),
            assumptions=tuple(str(a) for a in data.get("assumptions") or ()),
        )

    def against(self, usage: Mapping[str, Any]) -> CostCheck:
        """This estimate beside what a run spent (``optimized.usage``, ``usage.json``)."""
        return CostCheck.of(self, usage)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """In IPython and Jupyter, the table :meth:`__str__` prints (the dataclass's repr is one long line)."""
        printer.text(str(self))

    def __str__(self) -> str:
        lines = [
            "Cost estimate (before any paid call)",
            self.setting,
            f"plan: {self.program_runs:,} program runs ({self.baseline_runs:,} baseline), "
            f"{self.proposals:,} sub-LM proposals, {self.root_turns:,} agent turns"
            + (f"; measured on {self.sampled} train example(s)" if self.sampled else ""),
            "",
            f"{'role':<6}{'model':<20}{'calls':>7}{'tokens in':>11}{'tokens out':>11}{'dollars':>12}{'time':>9}",
        ]
        for row in (*self.roles, self.total):
            model = row.model if len(row.model) <= 19 else row.model[:18] + "…"
            lines.append(
                f"{row.role:<6}{model:<20}{_calls(row.calls):>7}{_tokens(row.input_tokens):>11}"
                f"{_tokens(row.output_tokens):>11}{_money(row.cost_usd, row.calls):>12}{_duration(row.seconds):>9}"
            )
        lines.append("")
        for scenario in (self.if_solved_early, self.at_most):
            lines.append(
                f"{scenario.role}: {_calls(scenario.calls)} calls, {_tokens(scenario.input_tokens)} in / "
                f"{_tokens(scenario.output_tokens)} out, {_money(scenario.cost_usd)}"
            )
        lines.append(self.cap)
        unknown = unpriced_models(self.roles)
        if unknown:
            lines.append(f"dollars unknown: litellm has no price for {', '.join(unknown)}")
        return "\n".join(_wrap(line) for line in lines)


def _wrap(line: str, width: int = 80) -> str:
    """``line`` cut at spaces to ``width`` columns, continued with an indent."""
    if len(line) <= width:
        return line
    out, current = [], ""
    for word in line.split(" "):
        if current and len(current) + 1 + len(word) > width:
            out.append(current)
            current = "  " + word
        else:
            current = f"{current} {word}" if current else word
    out.append(current)
    return "\n".join(out)


@dataclass(frozen=True)
class RoleCheck:
    """One role's LM work as predicted (if the budget is spent, and if the task is solved early) and as spent."""

    role: str
    predicted: RoleCost
    solved_early: RoleCost
    actual: RoleCost

    @property
    def tokens_ratio(self) -> float | None:
        """Tokens (in + out) spent over those predicted if the budget is spent; None when none were predicted."""
        return _ratio(_all(self.actual), _all(self.predicted))

    @property
    def solved_early_ratio(self) -> float | None:
        """Tokens spent over those predicted if the task is solved early."""
        return _ratio(_all(self.actual), _all(self.solved_early))

    @property
    def calls_ratio(self) -> float | None:
        return _ratio(self.actual.calls, self.predicted.calls)

    @property
    def cost_ratio(self) -> float | None:
        p, a = self.predicted.cost_usd, self.actual.cost_usd
        return a / p if p and a is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "predicted": asdict(self.predicted),
            "solved_early": asdict(self.solved_early),
            "actual": asdict(self.actual),
            "calls_ratio": self.calls_ratio,
            "tokens_ratio": self.tokens_ratio,
            "solved_early_ratio": self.solved_early_ratio,
            "cost_ratio": self.cost_ratio,
        }


@dataclass(frozen=True)
class CostCheck:
    """An estimate beside what the run spent, per role and in total (``optimized.cost_check``)."""

    rows: tuple[RoleCheck, ...]
    """``eval``, ``sub``, ``root`` and ``total``."""
    estimate: CostEstimate

    @classmethod
    def of(cls, estimate: CostEstimate, usage: Mapping[str, Any]) -> CostCheck:
        rows = []
        for role in (*_ORDER, "total"):
            if role == "total":
                predicted, early = estimate.total, estimate.if_solved_early
            else:
                predicted, early = _row_of(estimate.roles, role), _row_of(estimate.solved_early, role)
            spent = usage.get(role) if isinstance(usage.get(role), Mapping) else {}
            actual = RoleCost.from_dict({**spent, "role": role})
            rows.append(RoleCheck(role, predicted, early, actual))
        return cls(tuple(rows), estimate)

    def row(self, role: str) -> RoleCheck:
        """The row of ``role`` (``eval``, ``sub``, ``root`` or ``total``)."""
        for row in self.rows:
            if row.role == role:
                return row
        raise KeyError(f"no role {role!r}; the rows are {[r.role for r in self.rows]}")

    @property
    def within_range(self) -> bool:
        """Whether the tokens spent lie between the estimate's solved-early case and its at-most bound."""
        spent = _all(self.row("total").actual)
        return _all(self.estimate.if_solved_early) <= spent <= _all(self.estimate.at_most)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [r.to_dict() for r in self.rows], "within_range": self.within_range}

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """In IPython and Jupyter, the table :meth:`__str__` prints (the dataclass's repr is one long line)."""
        printer.text(str(self))

    def __str__(self) -> str:
        lines = [
            "Cost: predicted before the run, and spent (right: tokens spent ÷ predicted)",
            f"{'role':<6}{'case':<15}{'calls':>7}{'tokens in':>11}{'tokens out':>12}{'dollars':>12}{'spent ÷':>9}",
        ]
        for row in self.rows:
            cases = (
                ("budget spent", row.predicted, row.tokens_ratio),
                ("solved early", row.solved_early, row.solved_early_ratio),
                ("spent", row.actual, None),
            )
            for i, (label, cost, ratio) in enumerate(cases):
                lines.append(
                    f"{row.role if i == 0 else '':<6}{label:<15}{_calls(cost.calls):>7}{_tokens(cost.input_tokens):>11}"
                    f"{_tokens(cost.output_tokens):>12}{_money(cost.cost_usd, cost.calls):>12}"
                    + (_x(ratio, 9) if label != "spent" else "")
                )
        most = self.estimate.at_most
        lines.append(f"at most: {_tokens(_all(most))} tokens, {_money(most.cost_usd)}")
        return "\n".join(_wrap(line) for line in lines)


def _all(cost: RoleCost) -> int:
    return cost.input_tokens + cost.output_tokens


def _row_of(rows: tuple[RoleCost, ...], role: str) -> RoleCost:
    for row in rows:
        if row.role == role:
            return row
    return RoleCost(role=role)


def _ratio(actual: float, predicted: float) -> float | None:
    return actual / predicted if predicted else None


def _x(ratio: float | None, width: int) -> str:
    return f"{'-' if ratio is None else f'{ratio:.2f}x':>{width}}"
