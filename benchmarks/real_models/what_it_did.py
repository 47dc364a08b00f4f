"""What each optimizer run of a real-model benchmark did, seed by seed, from the arm files run.py saved.

    python benchmarks/real_models/what_it_did.py benchmarks/.work/results/OUT

For an rlmoptimizer arm (the default and ``rlmoptimizer-loop``): the GEPA children it accepted and GEPA's best on
validation, the failure analyses and their groups, the proposals made for a group, the demos proposed and whether
they were adopted (the train examples the returned demos came from), the candidates adopted, and the test score. For
``gepa`` (dspy.GEPA alone): the children it accepted and its best on validation, so the two searches can be compared
seed by seed. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

GROUP_LINE = re.compile(r"^\s+(\d+)\. (.+?) \((\d+)\): ")
GEPA_LINE = re.compile(
    r"gepa run \d+: best (\S+) \(validation score ([\d.]+), "
    r"(?:the start|its seed, the instructions it started from,) scored ([\d.]+)\); (\d+) new"
)
CONFIRM_LINE = re.compile(r"confirmed on (\d+ fresh train example\(s\) \(\d+ unit\(s\)\): .+)$", re.MULTILINE)


PHASE_LINE = re.compile(r"^([a-z_]+\(.*?\)(?:; [a-z_]+\(.*?\))*) -> ", re.MULTILINE)
"""A line of a phase's summary: the calls it ran, then what they did (``next_phase()`` called by the agent's code)."""


def calls(arm: dict[str, Any]) -> list[str]:
    """Every tool call the pilot made, in order, every line of the agent's own code, and the calls of every phase
    the agent's code took with ``next_phase()`` (read from the phase's summary in the turn's output)."""
    turns = arm.get("details", {}).get("agent_trajectory") or []
    made = []
    for turn in turns:
        made += turn.get("pilot") or []
        if not turn.get("pilot"):
            made += [line for line in str(turn.get("code", "")).splitlines() if line.strip()]
            made += PHASE_LINE.findall(str(turn.get("output", "")))
    # one call per entry: a pilot line may chain several ("p = propose_instructions(...); adopt_candidate(...)")
    return [re.sub(r"^\w+ = ", "", call.strip()) for line in made for call in line.split("; ") if call.strip()]


def outputs(arm: dict[str, Any]) -> str:
    return "\n".join(str(t.get("output", "")) for t in arm.get("details", {}).get("agent_trajectory") or [])


def rlm_summary(arm: dict[str, Any]) -> dict[str, Any]:
    details = arm.get("details", {})
    results = details.get("detailed_results") if isinstance(details.get("detailed_results"), dict) else {}
    lineage = results.get("lineage") or {}
    text = outputs(arm)
    made = calls(arm)
    gepa = [
        {"best": m.group(1), "val": float(m.group(2)), "start": float(m.group(3)), "new": int(m.group(4))}
        for m in GEPA_LINE.finditer(text)
    ]
    groups: list[list[tuple[str, int]]] = []
    for block in text.split("analysis-")[1:]:
        if "groups by cause" not in block.split("\n", 1)[0] + block[:2000]:
            continue
        found = []
        for line in block.splitlines()[1:]:
            match = GROUP_LINE.match(line)
            if match:
                found.append((match.group(2), int(match.group(3))))
            elif line.startswith("groups by what code sees"):
                break
        groups.append(found)
    made_for = [(name, entry["made_for"]["group"]) for name, entry in lineage.items() if entry.get("made_for")]
    adopted = [c for c in made if c.startswith("adopt_candidate(")]
    returned = details.get("optimized_dspy_program") or {}
    demo_keys = [key for key in returned if key.endswith(":demos")]
    return {
        "gepa_children": sum(run["new"] for run in gepa),
        "gepa_best_val": [run["val"] for run in gepa],
        "analyses": sum(1 for c in made if c.startswith("analyze_failures(")),
        "groups": groups,
        "proposals": sum(1 for c in made if c.startswith("propose_instructions(")),
        "made_for": made_for,
        "demos_proposed": sum(1 for c in made if c.startswith("propose_demos(")),
        "demos_returned": {key: len(json.loads(returned[key])) for key in demo_keys},
        "adopted": [  # an id, or the pilot's "the proposal just made"
            m.group(1) if (m := re.match(r"^adopt_candidate\('([^']+)'\)", c)) else "its proposal" for c in adopted
        ],
        "confirmed": [m.group(1) for m in CONFIRM_LINE.finditer(text)],
        "selection": (details.get("selection") or {}).get("reason", ""),
        "roles": {
            row["role"]: row["actual"]
            for row in (details.get("cost_check") or {}).get("rows", [])
            if row.get("role") in ("root", "sub") and row.get("actual")
        },
    }


def gepa_summary(arm: dict[str, Any]) -> dict[str, Any]:
    search = arm.get("details", {}).get("gepa_search") or {}
    return {"gepa_children": search.get("accepted_children"), "gepa_best_val": search.get("best_val_score")}


def test_score(arm: dict[str, Any]) -> str:
    test = arm.get("test") or {}
    return f"{test.get('correct', '?')}/{test.get('total', '?')}" if test else "-"


def report(out: Path) -> str:
    arms = []
    for path in sorted((out / "arms").glob("*.json")):
        try:
            arms.append(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            print(f"skipped {path.name}: {e}", file=sys.stderr)
    seeds = sorted({a.get("seed") for a in arms if a.get("seed") is not None})
    lines = [f"{a.get('arm')}: test {test_score(a)}" for a in arms if a.get("seed") is None]
    for seed in seeds:
        lines.append(f"seed {seed}")
        for arm in sorted((a for a in arms if a.get("seed") == seed), key=lambda a: a.get("arm", "")):
            name = str(arm.get("key") or arm.get("arm", "?")).rsplit("-seed", 1)[0]
            if arm.get("status") != "ok":
                lines.append(f"  {name}: {arm.get('status')} ({arm.get('error')})")
                continue
            if name.startswith("rlmoptimizer"):
                s = rlm_summary(arm)
                lines.append(
                    f"  {name}: test {test_score(arm)}; GEPA accepted {s['gepa_children']} child(ren), best on "
                    f"validation {s['gepa_best_val']}; {s['analyses']} analysis(es), groups "
                    + "; ".join(", ".join(f"{g} ({n})" for g, n in found) or "none" for found in s["groups"])
                    + f"; {s['proposals']} proposal(s), {len(s['made_for'])} for a group "
                    + (f"({', '.join(f'{c}: {g}' for c, g in s['made_for'])})" if s["made_for"] else "")
                    + f"; demos proposed {s['demos_proposed']}x, returned {s['demos_returned'] or 'none'}"
                    + f"; adopted {', '.join(s['adopted']) or 'nothing'}"
                    + "".join(f"; confirmed {c}" for c in s["confirmed"])
                    + "".join(
                        f"; {role} LM {used['calls']} call(s), {used['input_tokens']:,} tokens in"
                        for role, used in sorted(s["roles"].items())
                    )
                )
                lines.append(f"    returned: {s['selection']}")
            elif name == "gepa":
                s = gepa_summary(arm)
                lines.append(
                    f"  gepa: test {test_score(arm)}; accepted {s['gepa_children']} child(ren), best on validation "
                    f"{s['gepa_best_val']}"
                )
            else:
                lines.append(f"  {name}: test {test_score(arm)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the benchmark's --out directory (it holds arms/)")
    args = parser.parse_args(argv)
    if not (args.out / "arms").is_dir():
        print(f"{args.out}: no arms/ directory (give run.py's --out)", file=sys.stderr)
        return 2
    print(report(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
