"""The optimizer agent's instructions: module constants with checked placeholders.

``AGENT_INSTRUCTIONS`` becomes the docstring of the agent's signature: the task, the data, the budget and the
default loop. :func:`action_signature` builds what the root LM is sent each turn from it: those instructions,
then :data:`ACTION_RULES` (how a turn works, the sandbox's own rules, and the tool list: each tool's summary, the
first paragraph of its docstring; ``help(compare)`` in the REPL prints the whole, see :func:`tool_docs_code`). It is
ours rather than dspy.RLM's template, which repeats the tools, adds rules for dspy sub-agents in the REPL and doubles
a small root LM's every request.
``render_task_brief`` builds the short per-compile brief handed to the agent as an input.
"""

from __future__ import annotations

import inspect
import re
import string
from collections.abc import Callable, Mapping, Sequence

TOOL_NAMES: tuple[str, ...] = (
    "next_phase",
    "evaluate_program",
    "run_data",
    "update_prompt",
    "optimization_status",
    "run_gepa",
    "analyze_failures",
    "propose_instructions",
    "propose_demos",
    "compare",
    "adopt_candidate",
    "confirm_gain",
    "diff_runs",
    "hard_examples",
    "candidates",
    "add_note",
    "read_notes",
)

AGENT_INSTRUCTIONS = """\
You are a prompt optimizer for a DSPy program. The program is made of steps (predictors); each step has
instructions (its prompt). Find instructions that make the program score higher on the user's metric, then
SUBMIT them: `SUBMIT(optimized_dspy_program={step name: instructions})`. Instructions and demos can change (a
step's demos are its entry '<step>:demos', present when it has some; fields and structure stay); steps left out
keep their current instructions, including your update_prompt edits.

In the REPL:
- `baseline_train`: the unchanged program's train run: {"run_id", "score", "passed_count", "evaluated_count",
  "examples": [{"example_id", "inputs", "expected", "predicted", "score", "passed", "feedback", "error",
  "steps": [{"step_name", "inputs", "outputs"}]}]} (every predictor call of the example, in order).
- `baseline_val`: its validation run, aggregates only: validation examples are never shown.
- `step_names`; `current_prompts` {step name: instructions}, set anew at the start of a turn after a tool changed
  them (`optimization_status()` is always current); `task_brief`; the tools listed below.

Budget: $budget units. $budget_note Your turns are free. With the budget spent you can still analyse, update
prompts and SUBMIT.

The default loop, as code: `print(next_phase()['summary'])` takes its next phase (the optimizer state at the end of
every turn names it). Its phases: GEPA with most of the budget, then its best adopted and checked on validation
(free: GEPA scored it there); with what is left, the failures grouped by cause (`analyze_failures()`), a proposal
for the largest group, demos from the program's own successes (`propose_demos()`), and targeted rounds on what the
best still fails (propose, compare against 'current', adopt a clear winner, check on validation); SUBMIT when
nothing is left to pay for. A clear winner wins at least 3 more examples than it loses
(`compare` says `beats_first`): one example never decides; `confirm_gain()` adds fresh train examples to a lead on
validation that is not clear yet. A phase that
SUBMITs ends the run after your cell.$pilot_note
Do better than the loop when you can: run GEPA on the step at fault only (`steps=[...]`), restart it from your
own edited prompts (`start=`), or split the budget into several runs with analysis in between. Read what the best
still fails (`hard_examples()`, `evaluate_program(failed_from_run=...)`, `diff_runs`); `analyze_failures()` groups
every failure by step and cause with counts and ids, and `propose_instructions(step, group=0)` writes for its largest
group (or group failures with code and ask `llm_query_batched`); pass what you learned as `guidance=` to
`propose_instructions`, or write instructions yourself with `update_prompt` (state the rules the failures reveal,
keep what works); `compare` before you adopt (`rollouts=3` when scores look noisy).
What is returned is the best of your submission and the candidates checked on validation. Older turns are shown
shortened: keep what you must not forget with `add_note`.
"""

ACTION_RULES = """\
How you work: each turn, write `reasoning` (what you know, what you do next) and `code`: Python in a ```python
block. It runs in a persistent REPL and you see what it prints, then you write the next turn. Take one small step
per turn; print() what you need to see, short (slice long lists and texts); reuse variables instead of retyping
long values. `SUBMIT(...)` ends the run: call it in a turn of its own, after you saw what it relies on.
$runtime_rules
Tools (call them in your code; they return plain dicts and lists; a refused call raises AgentToolError, whose
message says what to do; `help(compare)` prints that tool's arguments, what it returns and what it costs):
$tools"""

_REQUIRED_PLACEHOLDERS = frozenset({"budget", "budget_note", "pilot_note"})

ASSIST_NOTE = (
    " A turn that spends nothing, evaluates nothing, makes no candidate, adds no note and changes no prompt is\n"
    "followed by the loop's next phase: when you only analyse, end the turn with `add_note(what you found)`."
)
"""What ``rlm_autopilot="assist"`` adds to the instructions (with ``"off"`` every turn is the agent's)."""

SETUP_CODE = """\
baseline_train = run_data({train_run!r})
baseline_val = run_data({val_run!r}) if {val_run!r} else None
step_names = {step_names!r}
current_prompts = optimization_status()["current_prompts"]
"""
"""Run once in the REPL before the agent's first turn: loads the names :data:`AGENT_INSTRUCTIONS` promises."""

BASELINE_TRAIN = "baseline_train"
"""The id ``run_data`` takes for the unchanged program's train run, evaluated then if it has not been yet."""

ON_DEMAND_SETUP_CODE = """\
class OnFirstRead(dict):
    \"\"\"A run read from the host the first time it is used, read or written (the train baseline: its new examples
    are charged). Not empty before (C code that sees a dict's size, as json.dumps does, then asks for its items).\"\"\"

    def __init__(self, run_id):
        super().__init__(not_read_yet=run_id)
        self._run_id, self._pending = run_id, True

    def _data(self):
        if self._pending:
            data = run_data(self._run_id)
            dict.clear(self)
            dict.update(self, data)
            self._pending = False
        return self

    __hash__ = None


def _on_first_read(name, method):
    def call(self, *args, **kwargs):
        return method(self._data(), *args, **kwargs)

    call.__name__ = name
    return call


for _name in (
    "__getitem__", "__setitem__", "__delitem__", "__contains__", "__iter__", "__reversed__", "__len__", "__eq__",
    "__ne__", "__repr__", "__or__", "__ror__", "__ior__", "get", "keys", "values", "items", "pop", "popitem",
    "setdefault", "update", "clear", "copy",
):
    setattr(OnFirstRead, _name, _on_first_read(_name, getattr(dict, _name)))
OnFirstRead.__str__ = OnFirstRead.__repr__
del _name, _on_first_read


baseline_train = OnFirstRead({baseline_id!r})
baseline_val = run_data({val_run!r}) if {val_run!r} else None
step_names = {step_names!r}
current_prompts = optimization_status()["current_prompts"]
"""
"""The setup when the train baseline is evaluated on demand (``train_run`` empty): ``baseline_train`` reads it from
the host on first use, so a compile whose agent never reads it never pays for it."""


CUT_OFF_NOTE = (
    "[Note] Your reply was cut off at the root LM's output limit (max_tokens), so its code may be incomplete: write "
    "a shorter cell, and build a long text over several cells (one part per variable)."
)
"""Added to a turn's output when the root LM's reply ran into its output limit."""


def render_setup_code(train_run: str, val_run: str, step_names: list[str]) -> str:
    """The setup cell; an empty ``train_run`` reads the train baseline on demand (:data:`ON_DEMAND_SETUP_CODE`)."""
    if not train_run:
        return ON_DEMAND_SETUP_CODE.format(baseline_id=BASELINE_TRAIN, val_run=val_run, step_names=step_names)
    return SETUP_CODE.format(train_run=train_run, val_run=val_run, step_names=step_names)


def render_instructions(budget: int, budget_note: str, pilot_mode: str = "assist") -> str:
    """Fill the ``$placeholders`` of :data:`AGENT_INSTRUCTIONS`; every placeholder must be given."""
    template = string.Template(AGENT_INSTRUCTIONS)
    names = set(re.findall(r"\$(\w+)", AGENT_INSTRUCTIONS))
    if names != _REQUIRED_PLACEHOLDERS:
        raise RuntimeError(f"AGENT_INSTRUCTIONS placeholders changed: {sorted(names)}")
    return template.substitute(
        budget=budget, budget_note=budget_note, pilot_note=ASSIST_NOTE if pilot_mode == "assist" else ""
    )


def budget_note(
    train_size: int, val_size: int, max_iterations: int | None = None, max_metric_calls: int | None = None
) -> str:
    """What the agent's budget is worth, in the words of the setting the user chose."""
    new = "A unit is one newly evaluated example (one already evaluated with the same instructions is free)"
    if max_metric_calls is not None:
        check = "validation" if val_size else "train"
        return (
            f"{new}: max_metric_calls={max_metric_calls}, every run of the program counts, and the "
            + (
                f"validation baseline took {val_size}; `baseline_train` is evaluated the first time you read it (its "
                "examples not yet run with the unchanged instructions are charged; at most half of the units beyond "
                "one validation check: a random sample of a larger train set)"
                if val_size
                else f"baseline took {train_size}"
            )
            + ". Sub-LM prompts (llm_query, proposals, GEPA's reflections) are not metric "
            f"calls: they have an allowance of {max_metric_calls} of their own. The {check} check of a submission "
            f"not yet evaluated on {check} is paid from the units too, and without the units for it the best "
            f"checked candidate is returned instead, so check what you submit. Once fewer units are left than one "
            f"{check} check costs, the run ends before your next turn (nothing could change the result)."
        )
    return (
        f"{new}, or one sub-LM prompt: enough to evaluate the {train_size} train examples {max_iterations} time(s)"
        + (f" plus the {val_size} validation examples once" if val_size else "")
        + "."
    )


_SUB_LM_TOOLS = (
    "- llm_query(prompt): ask the sub-LM one question (1 unit); answers a string.\n"
    "- llm_query_batched(prompts): several questions at once (1 unit each); answers a list of strings."
)


def tool_summary(tool: Callable) -> str:
    """A tool's docstring's first paragraph, on one line: what the tool list shows of it."""
    first = (inspect.getdoc(tool) or "").split("\n\n", 1)[0]
    return " ".join(first.split())


def tool_help(tool: Callable) -> str:
    """A tool's whole docstring, each paragraph on one line: what ``help(tool)`` prints in the REPL."""
    paragraphs = (inspect.getdoc(tool) or "").split("\n\n")
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs if paragraph.strip())


def format_tools(tools: Sequence[Callable]) -> str:
    """One line per tool, as the agent calls it: ``name(arg, arg=default, ...): its summary`` (the docstring's first
    paragraph; the rest is one ``help(tool)`` away: :func:`tool_docs_code`). Every turn's request carries this list,
    so it is kept to what a choice between tools needs."""
    lines = []
    for tool in tools:
        parameters = inspect.signature(tool).parameters.values()
        args = ", ".join(
            p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}" for p in parameters
        )
        lines.append(f"- {tool.__name__}({args}): {tool_summary(tool)}")
    return "\n".join([*lines, _SUB_LM_TOOLS])


def tool_docs_code(tools: Sequence[Callable]) -> str:
    """REPL code that gives each tool's wrapper its whole docstring, so ``help(tool)`` prints what the tool list
    shortens: its arguments, what it returns and what it costs."""
    docs = {tool.__name__: tool_help(tool) for tool in tools}
    return (
        f"for _name, _doc in {docs!r}.items():\n"
        "    try:\n"
        "        globals()[_name].__doc__ = _doc\n"
        "    except (KeyError, AttributeError, TypeError):  # a help text is not worth failing the run for\n"
        "        pass\n"
        "del _name, _doc\n" + _HELP_BY_NAME.format(names=sorted(docs))
    )


_HELP_BY_NAME = """\
import builtins as _rlmopt_builtins


def _rlmopt_help(*args, _pydoc_help=_rlmopt_builtins.help, **kwargs):
    \"\"\"help(compare), or help('compare'): a tool's name in quotes means the tool.\"\"\"
    if args and isinstance(args[0], str) and args[0] in {names!r} and args[0] in globals():
        args = (globals()[args[0]],) + args[1:]
    return _pydoc_help(*args, **kwargs)


_rlmopt_builtins.help = _rlmopt_help
del _rlmopt_builtins, _rlmopt_help
"""
"""Appended to :func:`tool_docs_code`: ``help('compare')``, the tool's name in quotes, prints the tool's help too
(pydoc would look for a module or topic of that name). Set on ``builtins``, so the REPL gains no global name."""


def action_signature(task_instructions: str, tools: Sequence[Callable], runtime_rules: str = ""):
    """The signature of one agent turn: the task's instructions, how a turn works (:data:`ACTION_RULES`, with the
    sandbox's ``runtime_rules`` and the tool list) in; ``reasoning`` and ``code`` out. The field names are
    dspy.RLM's, so its history type and our bounded context render it as dspy does."""
    import dspy

    from rlmoptimizer.agent._dspy import REPLHistory

    rules = string.Template(ACTION_RULES).substitute(
        runtime_rules=f"{runtime_rules.strip()}\n" if runtime_rules.strip() else "", tools=format_tools(tools)
    )
    return (
        dspy.Signature({}, f"{task_instructions.rstrip()}\n\n{rules}")
        .append("variables_info", dspy.InputField(desc="the variables in the REPL"), type_=str)
        .append("repl_history", dspy.InputField(desc="your earlier turns: code and output"), type_=REPLHistory)
        .append("iteration", dspy.InputField(desc="this turn's number out of the most there can be"), type_=str)
        .append("reasoning", dspy.OutputField(desc="what you know, what remains, what you do next"), type_=str)
        .append("code", dspy.OutputField(desc="Python to run, in a ```python block"), type_=str)
    )


def extract_signature(signature):
    """The signature of the extraction when the agent runs out of turns without a SUBMIT: its history in, the
    task's outputs out."""
    import dspy

    from rlmoptimizer.agent._dspy import REPLHistory

    instructions = (
        f"The history below was written with this objective:\n{signature.instructions}\n\n"
        "The turns ran out. From the history (what was found and computed), give the final outputs now."
    )
    return (
        dspy.Signature({**signature.output_fields}, instructions)
        .prepend("repl_history", dspy.InputField(desc="your turns: code and output"), type_=REPLHistory)
        .prepend("variables_info", dspy.InputField(desc="the variables in the REPL"), type_=str)
    )


def agent_signature(budget: int, note: str, pilot_mode: str = "assist"):
    """The agent's signature: the task brief in, the submission out, :data:`AGENT_INSTRUCTIONS` filled in."""
    import dspy

    return dspy.Signature(
        "task_brief: str -> optimized_dspy_program: dict[str, str]", render_instructions(budget, note, pilot_mode)
    )


def render_task_brief(
    step_signatures: Mapping[str, str],
    train_size: int,
    val_size: int,
    budget_left: int,
    resumed: bool = False,
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
