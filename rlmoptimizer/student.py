"""The student and its examples, checked at the edge, before any LM call: the program is a ``dspy.Module`` with
predictors, and every example is a ``dspy.Example`` whose marked inputs the program can take (its ``forward``'s
parameters, or for dspy's ``Predict``, ``ChainOfThought`` and ``ReAct``, their signature's input fields).

May import: dspy, ``rlmoptimizer.errors``.
"""

from __future__ import annotations

import inspect
import json
import logging
import types
import typing
from collections.abc import Sequence
from typing import Any

import dspy

from rlmoptimizer.errors import ConfigurationError

logger = logging.getLogger(__name__)

_EXAMPLE_FIX = 'dspy.Example(question=..., answer=...).with_inputs("question")'


DEMOS_SUFFIX = ":demos"
"""A prompt map's key for a step's demos is the step's name and this (``route:demos``): no step's name may end in it."""


def check_program(program: Any) -> None:
    """Raise :class:`ConfigurationError` unless ``program`` is a ``dspy.Module`` with a ``forward`` (not only an
    ``aforward``) and at least one predictor, none named as a step's demos are."""
    if not isinstance(program, dspy.Module):
        raise ConfigurationError(
            f"the program must be a dspy.Module (e.g. dspy.ChainOfThought('question -> answer') or your own "
            f"dspy.Module subclass), got {type(program).__name__}"
        )
    if not callable(getattr(type(program), "forward", None)):  # (the class: dspy warns on reading program.forward)
        has_async = callable(getattr(type(program), "aforward", None))
        raise ConfigurationError(
            f"the program {type(program).__name__} has no forward method"
            + (", only aforward" if has_async else "")
            + ": compile() runs the program as dspy.Evaluate does, by calling it, which calls forward. Define "
            "forward(self, ...) calling the same steps"
            + (" (dspy.Predict and dspy.ChainOfThought have both forms)." if has_async else ".")
        )
    frozen = _compiled_parts(program) if program.named_predictors() else []
    if frozen:
        logger.warning(
            "%s of %s %s marked compiled (_compiled=True, as an earlier optimizer such as BootstrapFewShot leaves its "
            "result): dspy's named_predictors() skips %s, so %s predictors keep their instructions and demos here. "
            "Set _compiled = False on %s to optimize %s too.",
            ", ".join(frozen),
            type(program).__name__,
            "is" if len(frozen) == 1 else "are",
            "it" if len(frozen) == 1 else "them",
            "its" if len(frozen) == 1 else "their",
            "it" if len(frozen) == 1 else "them",
            "it" if len(frozen) == 1 else "them",
        )
    if not program.named_predictors():
        frozen = _compiled_parts(program)
        if frozen:
            raise ConfigurationError(
                f"the program {type(program).__name__} has no predictors dspy lists: its predictors are inside "
                f"{', '.join(frozen)}, marked compiled (_compiled=True, as an earlier optimizer such as "
                "BootstrapFewShot leaves its result), and dspy's named_predictors() skips a compiled part. Set "
                "_compiled = False on it to optimize it again, or give compile() the program before that optimizer."
            )
        raise ConfigurationError(
            f"the program {type(program).__name__} has no predictors, so it has no instructions to optimize. "
            "Store its dspy.Predict / dspy.ChainOfThought modules as attributes in __init__ "
            "(self.generate = dspy.ChainOfThought(...)) so that program.named_predictors() finds them."
        )
    clashing = [name for name, _ in program.named_predictors() if name.endswith(DEMOS_SUFFIX)]
    if clashing:
        raise ConfigurationError(
            f"the program's step(s) {clashing} end in {DEMOS_SUFFIX!r}, which names a step's demos in the prompt "
            f"maps here (optimized_dspy_program: {{'route': instructions, 'route{DEMOS_SUFFIX}': its demos}}). "
            "Rename the attribute that holds each (e.g. its name without the colon)."
        )


def _compiled_parts(program: Any) -> list[str]:
    """The attributes of ``program`` (also inside a list, tuple or dict) that are modules marked compiled and hold
    predictors: dspy's ``named_predictors()`` does not look inside them."""
    found = []
    for name, value in vars(program).items():
        items = (
            value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
        )
        parts = [(name, value)] if not items else [(f"{name}[{key!r}]", item) for key, item in items]
        for where, part in parts:
            if isinstance(part, dspy.BaseModule) and getattr(part, "_compiled", False) and part.named_predictors():
                found.append(f"self.{where}")
    return found


def check_examples(examples: Any, split: str, allow_empty: bool = False, program: Any = None) -> list[dspy.Example]:
    """Return ``examples`` as a list after checking each is a ``dspy.Example`` with its inputs marked, and, with
    ``program``, that its inputs are what the program's own ``forward`` takes (:func:`_forward_parameters`)."""
    if isinstance(examples, (str, bytes, dict)) or not isinstance(examples, Sequence):
        raise ConfigurationError(
            f"{split} must be a list of dspy.Example, got {type(examples).__name__}. Build each with {_EXAMPLE_FIX}."
        )
    examples = list(examples)
    forward = _forward_parameters(program) if program is not None else None
    labels = _label_fields(program, forward) if program is not None else {}
    if not examples and not allow_empty:
        raise ConfigurationError(f"{split} is empty; pass at least one example built with {_EXAMPLE_FIX}")
    for index, example in enumerate(examples):
        if not isinstance(example, dspy.Example):
            raise ConfigurationError(
                f"{split}[{index}] is a {type(example).__name__}, not a dspy.Example. Build each example with {_EXAMPLE_FIX}."
            )
        if isinstance(example, dspy.Prediction):  # (an Example without marked inputs: a program's output)
            raise ConfigurationError(
                f"{split}[{index}] is a dspy.Prediction (what a program returns), not a dspy.Example. Build each "
                f"example with {_EXAMPLE_FIX}, e.g. dspy.Example(**prediction).with_inputs(...)."
            )
        input_keys = example._input_keys
        if not input_keys:
            raise ConfigurationError(
                f"{split}[{index}] has no input fields marked; call .with_inputs(...) naming the fields the program "
                f"receives, e.g. {_EXAMPLE_FIX}. Its fields are {sorted(example.keys())}."
            )
        missing = sorted(k for k in input_keys if k not in example)
        if missing:
            raise ConfigurationError(
                f"{split}[{index}] marks {missing} as inputs but has no such field(s); its fields are "
                f"{sorted(example.keys())}. Fix the .with_inputs(...) call, e.g. {_EXAMPLE_FIX}."
            )
        if forward is not None:
            _check_forward_takes(program, forward, example, f"{split}[{index}]")
        if labels:
            _check_no_label_as_input(labels, example, f"{split}[{index}]")
        for key in input_keys:
            if _unencodable(example[key]):
                raise ConfigurationError(
                    f"{split}[{index}].{key} holds text that cannot be encoded as UTF-8 (a lone surrogate, e.g. "
                    "from a file read with errors='surrogateescape'): no LM request can carry it, so every call "
                    "would fail. Clean it first, e.g. text.encode('utf-8', 'replace').decode('utf-8')."
                )
    return examples


def _unencodable(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` (text, or text in a list, tuple or dict, two levels deep) holds a lone surrogate."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if depth < 2 and isinstance(value, dict):
        return any(_unencodable(v, depth + 1) for v in value.values())
    if depth < 2 and isinstance(value, list | tuple):
        return any(_unencodable(v, depth + 1) for v in value)
    return False


def _label_fields(program: Any, forward: Any) -> dict[str, str]:
    """The fields the program's steps output (and none takes as an input) that its ``forward`` does not name, each
    with the step that outputs it: what an example must not mark as an input."""
    outputs, inputs = {}, set()
    for name, predictor in program.named_predictors():
        inputs |= set(predictor.signature.input_fields)
        for field in predictor.signature.output_fields:
            outputs.setdefault(field, name)
    named = forward[1] if forward is not None and forward[1] is not None else set()
    return {field: step for field, step in outputs.items() if field not in inputs and field not in named}


def _check_no_label_as_input(outputs: dict[str, str], example: dspy.Example, where: str) -> None:
    """:class:`ConfigurationError` when ``example`` marks as an input one of ``outputs`` (:func:`_label_fields`):
    the expected answer marked as an input."""
    labels = sorted(k for k in example._input_keys if k in outputs)
    if labels:
        raise ConfigurationError(
            f"{where} marks {labels} as input(s), but {'it is' if len(labels) == 1 else 'they are'} what step "
            f"{outputs[labels[0]]!r} outputs: the expected answer would never be shown as expected (the records, "
            "the analysis and the proposals would have none), and a forward(**kwargs) could pass it to the LM. Mark "
            f"only the program's inputs, e.g. .with_inputs({', '.join(repr(k) for k in sorted(example._input_keys) if k not in labels)})."
        )


def _forward_parameters(program: Any) -> tuple[str, set[str] | None, set[str]] | None:
    """What the program takes: a description of it, the names it takes (None: any) and those it requires. From
    its own ``forward`` (without ``self``); for dspy's ``Predict``, ``ChainOfThought`` and ``ReAct``, whose
    ``forward(**kwargs)`` passes every keyword to their signature, from its input fields, of which those with no
    default that cannot be None are required. None when that cannot be read (``*args``, any other ``**kwargs``)."""
    try:  # (from the class: dspy warns when an instance's forward is looked up outside its call)
        function = inspect.getattr_static(type(program), "forward")
        signature = inspect.signature(function)
    except (TypeError, ValueError, AttributeError):
        return None
    if not isinstance(function, (staticmethod, classmethod)):
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])  # without self
    parameters = signature.parameters.values()
    if [p.kind for p in parameters if p.kind != p.POSITIONAL_ONLY] == [inspect.Parameter.VAR_KEYWORD]:
        return _signature_inputs(program)
    if any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in parameters):
        return None
    taken = {p.name for p in parameters if p.kind != p.POSITIONAL_ONLY}
    required = {p.name for p in parameters if p.default is p.empty}
    return f"{type(program).__name__}.forward{signature}", taken, required


def _signature_inputs(program: Any) -> tuple[str, None, set[str]] | None:
    """For dspy's own modules that pass every keyword to their signature (``Predict``, ``ChainOfThought``,
    ``ReAct``); None for any other (what a custom ``forward(**kwargs)`` passes on, and to what, is its own)."""
    if isinstance(program, (dspy.Predict, dspy.ReAct)):
        own = program.signature
    elif isinstance(program, dspy.ChainOfThought) and isinstance(getattr(program, "predict", None), dspy.Predict):
        own = program.predict.signature
    else:
        return None
    required = {name for name, field in own.input_fields.items() if field.is_required() and not _may_be_none(field)}
    return f"{type(program).__name__}({own.signature!r})", None, required


def _may_be_none(field: Any) -> bool:
    """Whether an input may be left out: it may be None, or it is a conversation's history (empty at first)."""
    annotation = field.annotation
    if annotation is None or annotation is type(None) or annotation is Any or annotation is dspy.History:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return type(None) in typing.get_args(annotation)
    return False


def _check_forward_takes(
    program: Any, forward: tuple[str, set[str] | None, set[str]], example: Any, where: str
) -> None:
    """:class:`ConfigurationError` when the program (:func:`_forward_parameters`) cannot be called with
    ``example``'s inputs: it would raise ``TypeError`` on every example, or (a signature's input left out) run
    every example without it."""
    described, taken, required = forward
    inputs = set(example._input_keys)
    unknown, missing = sorted(inputs - taken) if taken is not None else [], sorted(required - inputs)
    if unknown or missing:
        problems = [f"{unknown} {'is' if len(unknown) == 1 else 'are'} not among its parameters"] if unknown else []
        problems += [f"it requires {missing}"] if missing else []
        names = sorted(required) or sorted(taken or ())
        raise ConfigurationError(
            f"{where} cannot be passed to {described}: its inputs are {sorted(inputs)}, and "
            f"{' and '.join(problems)}. Give the examples the fields the program takes, marked as inputs: "
            f"dspy.Example(...).with_inputs({', '.join(repr(name) for name in names)})."
        )


def warn_repeated_examples(
    trainset: Sequence[dspy.Example], valset: Sequence[dspy.Example], program: dspy.Module | None = None
) -> list[str]:
    """Warn (and return the warnings) when a split repeats an example (the same fields and values), when validation
    examples share their inputs with train examples, or when ``program``'s demos show a validation example's
    inputs: a copy in the validation set counts again in every comparison, so the rule that one example never
    decides counts it twice; a copy is paid for again; a validation example the optimizer also learns from (a
    proposal's failures, a demo) or the program already sees answered makes the validation score overstate.
    Examples whose content cannot be compared (objects without a stable form) are left out of the check."""
    keys = {"trainset": [_content_key(e) for e in trainset], "valset": [_content_key(e) for e in valset]}
    said = []
    for split, split_keys in keys.items():
        known = [k for k in split_keys if k is not None]
        repeated = len(known) - len(set(known))
        if repeated:
            said.append(
                f"{split} holds {repeated} repeated example(s) (the same fields and values as an earlier one): each "
                "copy is evaluated and paid for again"
                + (
                    ", and counts again when candidates are compared, so a change that wins on one repeated example "
                    "wins twice (one example should never decide what is returned)"
                    if split == "valset"
                    else " and weighs more in what the optimizer learns from"
                )
                + f". Remove the copies from {split}."
            )
    train_inputs = {_content_key(e, inputs=True) for e in trainset} - {None}
    shared = [k for k in (_content_key(e, inputs=True) for e in valset) if k is not None and k in train_inputs]
    if shared:
        said.append(
            f"{len(shared)} valset example(s) are also in the trainset (the same inputs): the optimizer learns from "
            "train (failures to fix, demos) and judges on validation, so these are judged after being learned from "
            "and the validation score overstates what the program does on new data. Keep the two sets apart."
        )
    shown = _demos_showing(program, valset) if program is not None else {}
    if shown:
        steps = ", ".join(f"{step!r} ({n})" for step, n in shown.items())
        said.append(
            f"The program's demos show the inputs of valset examples, with their answers, to these steps: {steps}. "
            "Every validation score then sees those answers and overstates what the program does on new data; "
            "remove those demos, or those examples from the valset."
        )
    for message in said:
        logger.warning(message)
    return said


def example_inputs(example: Any) -> dict[str, Any]:
    """An example's input fields (all its fields when it names none): what a program is shown of it."""
    fields = dict(example.items()) if callable(getattr(example, "items", None)) else {}
    names = getattr(example, "_input_keys", None)
    return {k: v for k, v in fields.items() if k in names} if names else fields


def _content_key(example: Any, inputs: bool = False) -> str | None:
    """The JSON of an example's fields (of its input fields, with ``inputs``); None for content without a stable
    form."""
    try:
        return json.dumps(
            example_inputs(example) if inputs else dict(example.items()), sort_keys=True, ensure_ascii=False
        )
    except (TypeError, ValueError, AttributeError):
        return None


def _demos_showing(program: dspy.Module, valset: Sequence[dspy.Example]) -> dict[str, int]:
    """Per step, how many of its demos hold every input field of a validation example, with the same values."""
    wanted = [fields for fields in map(example_inputs, valset) if fields]
    shown: dict[str, int] = {}
    for name, predictor in program.named_predictors() if wanted else ():
        for demo in getattr(predictor, "demos", None) or ():
            try:
                held = dict(demo.items()) if callable(getattr(demo, "items", None)) else {}
                if any(all(k in held and held[k] == v for k, v in fields.items()) for fields in wanted):
                    shown[name] = shown.get(name, 0) + 1
            except Exception:  # a value whose comparison raises (an array, say): not compared
                continue
    return shown


REPL_DATA_LIMIT = 100_000_000
"""The most characters of train data the agent's sandbox is given: each train example's record reaches the REPL as
JSON with non-ASCII characters escaped (``\\uXXXX``), its inputs twice (the example's and its steps'), and Python
objects in the sandbox's WebAssembly memory (2 GB) take several times that."""


def check_repl_data(trainset: Sequence[dspy.Example], most: int | None = None) -> None:
    """:class:`ConfigurationError`, before any LM call, when the train set is too large to hand the agent's sandbox
    (about :data:`REPL_DATA_LIMIT` characters, each example counted twice, as its record carries its inputs twice):
    it would be refused only after both baselines were paid, and again on every resume. ``most``: the most train
    examples the REPL can ever get (a budget of metric calls evaluates no more), the largest of them counted."""
    sizes = [2 * len(json.dumps(dict(example.items()), ensure_ascii=True, default=repr)) for example in trainset]
    if most is not None:
        sizes = sorted(sizes, reverse=True)[: max(0, most)]
    if sum(sizes) > REPL_DATA_LIMIT:
        raise ConfigurationError(
            f"the trainset is too large for the optimizer agent's sandbox: its records would take more than "
            f"{REPL_DATA_LIMIT // 1_000_000} million characters in the REPL (each example's inputs twice, non-ASCII "
            "characters escaped), more than its 2 GB of memory holds. Pass rlm_autopilot='loop' (the default loop "
            "in Python: no sandbox), or fewer or shorter train examples (a sample of a few hundred is plenty to "
            "optimize instructions on)."
        )
