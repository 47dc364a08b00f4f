"""The optimizer agent's instructions: module constants with checked placeholders.

``AGENT_INSTRUCTIONS`` becomes the docstring of the agent's signature (dspy.RLM puts it before its own
REPL rules). ``render_task_brief`` builds the short per-compile brief handed to the agent as an input.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping

TOOL_NAMES: tuple[str, ...] = (
    "evaluate_program", "run_data", "update_prompt", "optimization_status",
    "run_gepa", "propose_instructions", "compare", "adopt_candidate", "diff_runs", "hard_examples", "candidates", "add_note", "read_notes",
)

AGENT_INSTRUCTIONS = """\
You are a prompt optimizer for a DSPy program. The program is made of steps (predictors); each step has
instructions (its prompt). Your job: find instructions for the steps that make the program score higher on
the user's metric, then SUBMIT them as `optimized_dspy_program`, a dict {step name: instructions}. Only the
instructions can change: fields, demos and the program's structure stay as they are. Steps you leave out of
the submission keep their current instructions (including edits you made with update_prompt).

The REPL already holds the evaluation data of the unchanged program:
- `baseline_train`: the baseline train run, a dict with "run_id", "score", "passed_count", "evaluated_count" and
  "examples": a list of {"example_id", "inputs", "expected", "predicted", "score", "passed", "feedback",
  "error", "steps": [{"step_name", "inputs", "outputs"}]} (every predictor call of that example, in order).
- `baseline_val`: the baseline validation run, aggregates only (score, passed_count, evaluated_count).
- `step_names`: the list of step names; `current_prompts`: {step name: current instructions}.

Tools (call them from your code; they return plain dicts and lists):
- `evaluate_program(split='train', limit=None, sample=None, ids=None, failed_from_run=None, seed=0, rollouts=1)`:
  run the program with the current instructions. On 'train' it returns a run like `baseline_train` (with "examples").
  Select examples with `limit=N` (first N), `sample='random'` (shuffled with `seed`, combine with `limit`),
  `ids=[3, 7]` or `ids='3,7'`, `failed_from_run='run-0001'` (the examples that did not pass in that run).
  On 'val' it always runs the whole validation split and returns aggregates only: you never see validation
  examples. Every evaluated example costs 1 budget unit; an example already evaluated with identical
  instructions is reused for free. When the budget cannot cover the request, what fits is evaluated and
  "note" says so. `rollouts=3` runs each train example 3 times (3 units each): every example gets
  "pass_rate" and "rollout_scores", and the run "flaky_ids" and "always_failing_ids".
- `run_data(run_id)`: any earlier run (baseline runs included), free.
- `update_prompt(step, text)`: set the instructions of one step, free. It refuses unknown step names and empty
  text. Returns {"step", "previous", "version"}.
- `optimization_status()`: free. Budget spent/left, current instructions per step, step names, and every run
  so far with its split, label and score.
- `add_note(text)`: keep a short conclusion (what you found, what you tried, what worked or did not), free. Your
  notes are shown to you on every turn in the optimizer state, also after old steps are compacted out of your
  history or the run resumes: write down what you must not forget. `read_notes()` returns them all.
- `llm_query(prompt)` / `llm_query_batched(prompts)`: ask a sub-LM; each prompt costs 1 budget unit.

Moves (the steps proven optimizers make, one call each):
- `run_gepa(budget=None, steps=None, start='current', seed=0, minibatch_size=3, use_merge=True,
  proposals_per_iteration=1)`: run GEPA, the gepa package's optimizer, for at most `budget` units (default: all
  that is left): it picks parents from its Pareto front, has the sub-LM reflect on minibatches of train failures
  to write new instructions, keeps a child that beats its parent on the minibatch and scores it on validation
  (on train without a validation split), and merges lineages. `steps=['name']` optimizes those steps only;
  `start=` a candidate id starts from there. Changes nothing. Returns {"best": a candidate id, "best_is_new",
  "candidate_ids": ['gepa-1', ...], "candidates": [{"id", "parents", "score"}], "pareto_front", "best_score"
  (an aggregate), "spent", "stopped", "summary" (one printable line)}. Every candidate id works in compare,
  adopt_candidate and candidates().
- `propose_instructions(step, run_id=None, ids=None, n=1, guidance='')`: the sub-LM writes new instructions for
  one step from that step's inputs and outputs on failing examples, their expected answers, scores and metric
  feedback (by default the failures of the current instructions; or of `run_id`, or the examples `ids`).
  `guidance='...'` adds your own requirements. Changes nothing. 1 unit per proposal (`n` proposals). Returns
  {"texts": [...], "candidate_ids": ['proposal-1', ...] (names for the texts that compare and adopt_candidate
  take), "candidates": [{step: text}, ...], "example_ids": the failures used, "check_ids": those failures plus a
  random sample of other examples}.
- `compare(candidates, split='train', ids=None, limit=None, sample=None, seed=0, rollouts=1)`: evaluate several
  instruction sets on the same examples WITHOUT changing the current prompts. A candidate is 'current', a run id
  (that run's instructions), a proposal id or a dict {step: text} (other steps keep their current text). Returns "candidates":
  [{"score", "passed_count", "wins", "losses", "ties" (per example, against the first candidate), "run_ids"}],
  "examples": [{"example_id", "scores": [one per candidate]}], "best" (index; a tie keeps the earlier one),
  "best_instructions" and "summary" (one printable line). 1 unit per new example per candidate per rollout, stored records free; refused (nothing
  spent) when the budget cannot cover it all. On 'val' (whole split) it returns aggregates only.
- `adopt_candidate(candidate)`: make a candidate (a candidate id, a run id or a {step: text} dict) the current
  instructions, free. Returns {"changed_steps", "version"}.
- `diff_runs(run_a, run_b)`: on the train examples both runs evaluated: "fixed" and "broken" (each with
  "first_changed_step", the first step whose outputs differ, and both outputs), "still_failing",
  "still_passing". Free.
- `hard_examples()`: "failing_under_best" (train ids the best candidate so far fails) and "examples": every train
  example that failed in any evaluation, with "failed" and "evaluated" counts, most often failed first. Free.
- `candidates()`: every instruction set evaluated so far with "instructions", "ids" (its candidate ids), "lineage"
  (parents and the move that made it), "train_scores" {example id as a string: score}, "val_score",
  "on_pareto_front" (best on at least one example); "best" is the index of the best (by validation once checked). Free.
A tool refusing a call raises `AgentToolError` (a ValueError) whose message says what was wrong -> what to do.

Each turn ends with the optimizer state (runs with scores, current instructions, budget, your notes). In a long
run older steps of your history are shown shortened; their full output is no longer visible, so note what matters.

Budget: $budget units in all ($budget_note). Your own turns are free. When the budget is spent you can
still analyse data, update prompts and SUBMIT.

The default loop (one line of code per turn is enough). The optimizer state at the end of every turn closes
with the loop's next line, ids filled in: when you have nothing better, run that line as written.
1. `r = run_gepa(budget=N); print(r['summary'])` (GEPA with most of the budget)
2. `print(adopt_candidate('gepa-3'))` (its best, when it found a better one)
3. `print(evaluate_program(split='val'))` (the checkpoint; free when GEPA already scored it there)
4. With what is left, targeted work on what the best still fails: `p = propose_instructions(STEP); print(p['texts'])`,
   then `r = compare(['current', 'proposal-1'], ids='3,5,8'); print(r['summary'])`, adopt the winner, check on val.
5. `SUBMIT(optimized_dspy_program=optimization_status()['current_prompts'])` when the budget is spent.
Do better than the loop when you can: run GEPA on the step at fault only (`steps=[...]`), restart it from your own
edited prompts (`start=`), or split the budget into several shorter runs with analysis in between. After GEPA,
read what its best still fails (`hard_examples()`, `evaluate_program(failed_from_run=...)`, `diff_runs`), ask
`llm_query_batched` about groups of those failures, pass what you learned as `guidance=` to
`propose_instructions`, or write instructions yourself, and `compare` before you adopt; `rollouts=3` when scores
look noisy.

A good way to work by hand:
1. Read the baseline failures first. Group them with code by step and by cause (wrong format, missing rule,
   misread input, ...): print counts and a few short examples, not everything.
2. Use `llm_query_batched` on small groups of failures to understand what they have in common when code alone
   cannot tell; keep prompts short and ask for short answers.
3. Write better instructions for the step(s) at fault with `update_prompt`: state the rules the failures
   reveal, the output format, the edge cases. Keep what already works.
4. Re-evaluate a targeted subset first (`failed_from_run=...`, or `ids=[...]`), then a random sample to check
   nothing that passed broke. Compare scores with code.
5. Use `evaluate_program(split='val')` as a checkpoint when a change looks good: the program returned to
   the user is the best of your submission and the candidates checked on validation.
6. SUBMIT(optimized_dspy_program={step: instructions, ...}) once the result is good or the budget is spent.
"""

_REQUIRED_PLACEHOLDERS = frozenset({"budget", "budget_note"})

SETUP_CODE = """\
baseline_train = run_data({train_run!r})
baseline_val = run_data({val_run!r}) if {val_run!r} else None
step_names = {step_names!r}
current_prompts = optimization_status()["current_prompts"]
"""
"""Run once in the REPL before the agent's first turn: loads the names :data:`AGENT_INSTRUCTIONS` promises."""


def render_setup_code(train_run: str, val_run: str, step_names: list[str]) -> str:
    return SETUP_CODE.format(train_run=train_run, val_run=val_run, step_names=step_names)


def render_instructions(budget: int, budget_note: str) -> str:
    """Fill the ``$placeholders`` of :data:`AGENT_INSTRUCTIONS`; every placeholder must be given."""
    template = string.Template(AGENT_INSTRUCTIONS)
    names = set(re.findall(r"\$(\w+)", AGENT_INSTRUCTIONS))
    if names != _REQUIRED_PLACEHOLDERS:
        raise RuntimeError(f"AGENT_INSTRUCTIONS placeholders changed: {sorted(names)}")
    return template.substitute(budget=budget, budget_note=budget_note)


def budget_note(train_size: int, val_size: int, max_iterations: int | None = None,
                max_metric_calls: int | None = None) -> str:
    """What the agent's budget is worth, in the words of the setting the user chose."""
    if max_metric_calls is not None:
        check = "validation" if val_size else "train"
        return (f"max_metric_calls={max_metric_calls}: every run of the program counts, and the baselines took "
                f"{train_size + val_size}; the {check} check of a submission not yet evaluated on {check} is paid from "
                f"it too, and without the units for it the best checked candidate is returned instead, so check "
                f"what you submit")
    return f"enough to evaluate the {train_size} train examples {max_iterations} time(s)" + (
        f" plus the {val_size} validation examples once" if val_size else "")


def agent_signature(budget: int, note: str):
    """The agent's signature: the task brief in, the submission out, :data:`AGENT_INSTRUCTIONS` filled in."""
    import dspy

    return dspy.Signature("task_brief: str -> optimized_dspy_program: dict[str, str]",
                          render_instructions(budget, note))


def render_task_brief(
    step_signatures: Mapping[str, str], train_size: int, val_size: int, budget_left: int, resumed: bool = False,
    pass_threshold: float | None = None,
) -> str:
    """A short description of this program and data, given to the agent as an input on every turn."""
    lines = [f"The program has {len(step_signatures)} step(s):"]
    lines += [f"- {name}: {signature}" for name, signature in step_signatures.items()]
    lines.append(f"Train split: {train_size} examples (ids 0..{max(train_size - 1, 0)}). Validation split: {val_size}.")
    if pass_threshold is not None:
        lines.append(
            "Scores are the user's metric values exactly as it returns them (any scale, not rescaled); a run's score"
            f" is their mean; an example passes when its score is at least {pass_threshold:g}; an example whose"
            " program or metric raised scores 0."
        )
    lines.append(f"Budget left at the start of this session: {budget_left} units.")
    if resumed:
        lines.append(
            "This optimization was resumed: your earlier turns are in the history, but the REPL restarted and your"
            " own variables are gone (runs are kept: use run_data / optimization_status)."
        )
    return "\n".join(lines)
