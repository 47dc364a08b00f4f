"""Where the returned instructions came from: the named candidates of a run (``proposal-N`` from
``propose_instructions``, ``gepa-N`` from ``run_gepa``), their lineage as the moves recorded it in
``candidates.json``, matched to the instruction sets that were evaluated, and the returned candidate's ancestry.

A lineage entry names its parents: candidate ids, a run id, or ``'current'`` (the current instructions when the move
ran, which were not a named candidate). A ``proposal-N`` keeps only the steps it wrote, so its whole instruction set
is its parent's with those steps replaced; a ``gepa-N`` keeps every step. ``'current'`` is told apart from the
prompt history (``prompts/v-NNNN.json``): the states the agent's edits produced that no named candidate names, and
the unchanged program; exactly, when the entry has ``parent_digests`` (the digest of each parent's instructions,
which the moves record), else by inference. When one of them fits the child (it is what the child was made from on the steps the move
did not write, and a GEPA reflective proposal rewrites one step), that is the parent; when several fit, the
ancestry ends at "the current instructions when X was made", unresolved, rather than guess.

May import what :mod:`rlmoptimizer.report` may.
"""

from __future__ import annotations

import re
from typing import Any

from rlmoptimizer.fingerprint import instructions_digest

UNCHANGED = "the unchanged program"
"""The label of the ancestry's root when it is the program as given."""

_RUN_ID = re.compile(r"^run-\d+$")


def _key(instructions: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(instructions.items()))


def lineage_shape(lineage: dict[str, Any], problems: list[str]) -> dict[str, dict[str, Any]]:
    """The lineage entries of ``candidates.json`` with their fields of the right kind (``parents``: candidate ids,
    ``move``, ``run``, ``from``: text, ``steps``: step names, ``reflected_on``: train example ids, ``made_for``: the
    failure analysis, group and train example ids a proposal was written for); a field of the wrong kind is dropped
    and named in ``problems``."""
    kept: dict[str, dict[str, Any]] = {}
    bad: list[str] = []
    for name, entry in lineage.items():
        clean: dict[str, Any] = {}
        for field, value in entry.items():
            if field in ("parents", "steps"):
                ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            elif field == "reflected_on":
                ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            elif field in ("move", "run", "from"):
                ok = isinstance(value, str)
            elif field == "made_for":
                ok = _made_for(value)
            else:
                ok = True
            if ok:
                clean[field] = value
            else:
                bad.append(f"{name}.{field}")
        kept[name] = clean
    if bad:
        problems.append(
            "candidates.json: ignored lineage field(s) of the wrong kind: "
            + ", ".join(bad[:8])
            + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        )
    return kept


def _states(
    initial: dict[str, str], versions: tuple[dict[str, Any], ...] | list[dict[str, Any]]
) -> list[dict[str, str]]:
    """The current instructions after each prompt version, the unchanged program first (each state once)."""
    states, seen, current = [dict(initial)], {_key(initial)}, dict(initial)
    for version in versions:
        step, text = version.get("step"), version.get("text")
        if isinstance(step, str) and isinstance(text, str):
            current = {**current, step: text}
            if _key(current) not in seen:
                seen.add(_key(current))
                states.append(dict(current))
    return states


class Lineage:
    """The named candidates of one run resolved to whole instruction sets, and the ancestry of any of them.

    ``named``: ``{id: {step: text}}`` as kept (partial for proposals); ``lineage``: ``{id: entry}``; ``evaluated``:
    the instruction sets evaluated, by index (candidate 0: the unchanged program); ``runs``: ``{run id:
    instructions}``; ``versions``: the prompt versions in order."""

    def __init__(
        self,
        named: dict[str, dict[str, str]],
        lineage: dict[str, dict[str, Any]],
        evaluated: list[dict[str, str]] | tuple[dict[str, str], ...],
        initial: dict[str, str] | None,
        runs: dict[str, dict[str, str]],
        versions: tuple[dict[str, Any], ...] | list[dict[str, Any]],
    ) -> None:
        self.named = named
        self.lineage = lineage
        self.index = {}
        for i, instructions in enumerate(evaluated):
            self.index.setdefault(_key(instructions), i)
        self.initial = dict(initial or {})
        self.runs = runs
        self.versions = list(versions)
        # the states the current instructions went through that no candidate names (as name_of would)
        self.states = [
            s
            for n, s in enumerate(_states(self.initial, versions))
            if n == 0 or not any(m and m.items() <= s.items() for m in named.values())
        ]
        self._full: dict[str, dict[str, str]] = {}
        self._origin: dict[str, dict[str, str] | None] = {}
        # every instruction set known, by digest: what a lineage entry's "parent_digests" name exactly
        self.by_digest = {
            instructions_digest(dict(i)): dict(i) for i in [*evaluated, *_states(self.initial, versions)] if i
        }

    # -- whole instruction sets ---------------------------------------------------------------------
    def _is_whole(self, name: str) -> bool:
        return set(self.named[name]) >= set(self.initial)

    def _parents(self, name: str) -> list[str]:
        return list(self.lineage.get(name, {}).get("parents", []))

    def origin(self, name: str) -> dict[str, str] | None:
        """The instructions ``'current'`` meant when ``name`` was made, when the prompt history tells them apart."""
        if name in self._origin:
            return self._origin[name]
        self._origin[name] = None  # a guard while it is worked out
        mapping, entry = self.named[name], self.lineage.get(name, {})
        if self._is_whole(name):
            touched = set(entry.get("steps") or self.initial)
            merge = "merge" in str(entry.get("move", ""))

            def fits(state: dict[str, str]) -> bool:
                differ = {step for step in set(state) | set(mapping) if state.get(step) != mapping.get(step)}
                return differ <= touched and (merge or len(differ) <= 1)

            fitting = [s for s in self.states if fits(s)]
        else:
            fitting = self.states
            if len(fitting) > 1:  # the one whose proposal was evaluated
                fitting = [s for s in fitting if _key({**s, **mapping}) in self.index] or fitting
        self._origin[name] = fitting[0] if len(fitting) == 1 else None
        return self._origin[name]

    def full(self, name: str, _seen: frozenset[str] = frozenset()) -> dict[str, str]:
        """The whole instruction set candidate ``name`` stands for."""
        if name in self._full:
            return self._full[name]
        mapping = self.named[name]
        if self._is_whole(name):
            full = {**self.initial, **mapping}
        else:
            parents = self._parents(name)
            base = self._parent_instructions(parents[0], name, _seen | {name}) if parents else None
            full = {**(base if base is not None else self.initial), **mapping}
        self._full[name] = full
        return full

    def _parent_instructions(self, parent: str, child: str, seen: frozenset[str]) -> dict[str, str] | None:
        entry = self.lineage.get(child, {})
        digests, parents = entry.get("parent_digests"), self._parents(child)
        if isinstance(digests, list) and parent in parents and parents.index(parent) < len(digests):
            exact = self.by_digest.get(str(digests[parents.index(parent)]))
            if exact is not None:  # the move recorded which instructions its parent was
                return exact
        if parent in self.named and parent not in seen:
            return self.full(parent, seen)
        if _RUN_ID.match(parent) and parent in self.runs:
            return dict(self.runs[parent])
        if parent == "current":
            return self.origin(child)
        return None

    def candidate_of(self, name: str) -> int | None:
        """The index of the evaluated instruction set candidate ``name`` stands for (None: never evaluated)."""
        return self.index.get(_key(self.full(name)))

    def ids_of(self, index: int) -> tuple[str, ...]:
        """The candidate ids naming instruction set ``index``, in the order they were made."""
        return tuple(name for name in self.named if self.candidate_of(name) == index)

    # -- ancestry -----------------------------------------------------------------------------------
    def ancestry(self, index: int | None) -> list[dict[str, Any]]:
        """The ancestors of instruction set ``index``, parents before children, the instruction set itself last:
        each ``{"label", "id", "candidate", "move", "parents" (labels), "run", "steps", "changed_steps",
        "reflected_on", "made_for", "generation"}``. Empty for ``None``."""
        if index is None:
            return []
        names = self.ids_of(index)
        nodes: dict[str, dict[str, Any]] = {}
        order: list[str] = []
        if names:
            self._walk(names[0], nodes, order, frozenset())
        elif index == self.index.get(_key(self.initial)):
            self._root(nodes, order, index)
        else:
            label = f"candidate {index}"
            nodes[label] = _outside_node(label, index, self._written(index))
            order.append(label)
        for label in order:  # parents come before their children
            node = nodes[label]
            node["generation"] = 1 + max((nodes[p]["generation"] for p in node["parents"] if p in nodes), default=-1)
        return [nodes[label] for label in order]

    def _written(self, index: int) -> str:
        """How an instruction set no candidate names was made, from the prompt versions that wrote its texts."""
        instructions = next((i for i in (dict(k) for k, v in self.index.items() if v == index)), {})
        changed = {step: text for step, text in instructions.items() if self.initial.get(step) != text}
        sources = sorted(
            {
                str(v.get("source"))
                for v in self.versions
                if v.get("source") and changed.get(v.get("step")) == v.get("text")
            }
        )
        how = f"written with {', '.join(sources)}" if sources else "submitted as a {step: text} map"
        return f"{how}; not a named candidate, no lineage recorded"

    def _root(self, nodes: dict[str, dict[str, Any]], order: list[str], index: int | None) -> str:
        if UNCHANGED not in nodes:
            nodes[UNCHANGED] = _outside_node(UNCHANGED, index, "the program as given")
            order.append(UNCHANGED)
        return UNCHANGED

    def _walk(self, name: str, nodes: dict[str, dict[str, Any]], order: list[str], stack: frozenset[str]) -> str:
        if name in nodes:
            return name
        entry = self.lineage.get(name, {})
        labels, first_parent = [], None
        for parent in entry.get("parents", []):
            if parent in self.named:
                if parent in stack | {name}:
                    continue  # a cycle in a damaged file: not followed
                label = self._walk(parent, nodes, order, stack | {name})
                instructions = self.full(parent)
            else:
                instructions = self._parent_instructions(parent, name, stack | {name})
                label = self._outside(parent, name, instructions, nodes, order)
            labels.append(label)
            if first_parent is None:
                first_parent = instructions
        full = self.full(name)
        changed = sorted(s for s in full if first_parent is not None and first_parent.get(s) != full[s])
        nodes[name] = {
            "label": name,
            "id": name,
            "candidate": self.candidate_of(name),
            "move": entry.get("move", "unknown"),
            "parents": labels,
            "run": entry.get("run"),
            "steps": list(entry.get("steps", [])),
            "changed_steps": changed,
            "reflected_on": entry.get("reflected_on"),
            "made_for": entry.get("made_for"),
        }
        order.append(name)
        return name

    def _outside(
        self,
        parent: str,
        child: str,
        instructions: dict[str, str] | None,
        nodes: dict[str, dict[str, Any]],
        order: list[str],
    ) -> str:
        """The node of a parent that is no named candidate: the unchanged program, a run's instructions, the
        agent's own edit, or the current instructions the history cannot tell."""
        if instructions is not None and _key(instructions) == _key(self.initial):
            return self._root(nodes, order, self.index.get(_key(self.initial)))
        if instructions is None and parent == "current":
            label, move = f"current when {child} was made", "the current instructions then (not recorded which)"
        elif instructions is None:
            label, move = parent, "not a named candidate (its instructions were not recorded)"
        elif _RUN_ID.match(parent):
            label, move = parent, f"the instructions of evaluation run {parent}"
        else:
            label, move = f"edited before {child}", "the agent's own edit of the instructions (not a named candidate)"
        if label not in nodes:
            candidate = self.index.get(_key(instructions)) if instructions is not None else None
            nodes[label] = _outside_node(label, candidate, move)
            order.append(label)
        return label


def _outside_node(label: str, candidate: int | None, move: str) -> dict[str, Any]:
    """An ancestry node for what is no named candidate: the unchanged program, a run's or an edit's instructions."""
    return {
        "label": label,
        "id": None,
        "candidate": candidate,
        "move": move,
        "parents": [],
        "run": None,
        "steps": [],
        "changed_steps": [],
        "reflected_on": None,
        "made_for": None,
    }


def _made_for(value: Any) -> bool:
    """Whether ``value`` is a ``made_for`` entry: ``{"analysis": id, "group": name, "example_ids": [train ids]}``."""
    ids = value.get("example_ids") if isinstance(value, dict) else None
    return (
        isinstance(value, dict)
        and isinstance(value.get("analysis"), str)
        and isinstance(value.get("group"), str)
        and isinstance(ids, list)
        and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    )
