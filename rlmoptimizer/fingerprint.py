"""What an optimization may change (each step's instructions and demos) and what it must not (everything else).

Instructions are read and written by step name, the name ``program.named_predictors()`` gives each
predictor (``"generate.predict"`` for a ``ChainOfThought`` stored as ``self.generate``). A step's demos are
part of the same map under the key ``"<step>:demos"`` (:func:`demos_key`), as the canonical JSON of a list of
demos, each a dict of the demo's fields (:func:`demos_text`); the key is present only for a step that has demos,
so a program without demos has the plain ``{step: instructions}`` map, and ``"[]"`` clears a step's demos.

The *structural fingerprint* is a canonical, JSON-friendly description of everything except the
instructions: every predictor's signature fields (name, prefix, description, type), its demos and its
class, plus the class of every sub-module along ``named_sub_modules()`` paths. Two programs with the
same fingerprint differ at most in their instructions. :func:`check_structure` compares a program
with a fingerprint taken earlier, leaving demos out (they are changed through the map), and, when they
differ, raises :class:`StructureChangedError` listing each difference in words.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import decimal
import enum
import fractions
import hashlib
import json
import logging
import pathlib
import re
import sys
import types
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rlmoptimizer.errors import ConfigurationError, StructureChangedError
from rlmoptimizer.records import jsonable
from rlmoptimizer.student import DEMOS_SUFFIX

FINGERPRINT_VERSION = 1

logger = logging.getLogger(__name__)


# -- canonical JSON ------------------------------------------------------------------------------
def canonical_json(value: Any) -> str:
    """JSON text with sorted keys and no whitespace: equal values give equal text."""
    return json.dumps(jsonable(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def sha256_json(value: Any) -> str:
    """sha256 hex digest of :func:`canonical_json` of ``value``."""
    return hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()


MAX_INSTRUCTION_CHARS = 50_000
"""The longest instructions the agent may give a step (about 12k tokens, sent with every call of the step), or twice
the unchanged program's own when they are longer: a text past it is refused before any evaluation pays for it."""
MAX_DEMOS_CHARS = 400_000
"""The same for a step's demos (their JSON text): examples the program runs on can be long documents."""


def text_limit(initial: str | None, limit: int = MAX_INSTRUCTION_CHARS) -> int:
    """The most characters a step's text may have: ``limit``, or twice the unchanged program's own (``initial``)."""
    return max(limit, 2 * len(initial or ""))


def demos_key(step: str) -> str:
    """The prompt map's key for the demos of ``step`` (no step's own name ends in :data:`DEMOS_SUFFIX`:
    :func:`rlmoptimizer.student.check_program` refuses one)."""
    return step + DEMOS_SUFFIX


def demos_step(key: str) -> str | None:
    """The step whose demos ``key`` holds, or None when ``key`` names instructions."""
    return key[: -len(DEMOS_SUFFIX)] if key.endswith(DEMOS_SUFFIX) else None


def demos_text(demos: Any) -> str:
    """The canonical JSON of a list of demos (``dspy.Example`` objects or dicts), each as a dict of its fields."""
    return canonical_json([_demo(d) for d in (demos or [])])


def parse_demos(key: str, text: Any) -> list[dict[str, Any]]:
    """The demos a map's ``text`` for ``key`` holds: a JSON list of objects; :class:`ConfigurationError` otherwise."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(d, dict) and d for d in value):
        raise ConfigurationError(
            f"{key!r} must be the JSON text of a list of demos, each an object of the step's fields "
            f'(e.g. \'[{{"question": "...", "answer": "..."}}]\'; "[]" for none), got {str(text)[:80]!r}'
        )
    return value


def instructions_digest(instructions: dict[str, str]) -> str:
    """Digest of a ``{step name: instructions}`` map; the key under which evaluations are cached."""
    return sha256_json(dict(instructions))


# -- instructions --------------------------------------------------------------------------------
def get_instructions(program: Any) -> dict[str, str]:
    """``{step name: instructions}`` for every predictor, in ``named_predictors()`` order, then
    ``{"<step>:demos": demos_text}`` for every predictor that has demos."""
    predictors = list(program.named_predictors())
    mapping = {name: predictor.signature.instructions for name, predictor in predictors}
    mapping.update({demos_key(name): demos_text(p.demos) for name, p in predictors if getattr(p, "demos", None)})
    return mapping


def apply_instructions(program: Any, mapping: dict[str, str], *, whole: bool = False) -> None:
    """Set the instructions (and, under ``"<step>:demos"`` keys, the demos) of the named steps, in place (callers
    deep-copy first). An edit (the default) leaves the demos it does not name alone, also when it names every
    step's instructions. ``whole=True``: ``mapping`` is a whole program's, as :func:`get_instructions` gives it (a
    candidate's, a run's): a step without a demos key then has no demos, since the key is left out only then.
    Demos equal to a step's own (by :func:`demos_text`) leave its demo objects as they are.

    Unknown step names and malformed values raise :class:`ConfigurationError` before anything is changed.
    """
    import dspy

    predictors = dict(program.named_predictors())
    unknown = [name for name in mapping if (demos_step(name) or name) not in predictors]
    if unknown:
        raise ConfigurationError(
            f"unknown step name(s) {unknown}; the program's steps are {list(predictors)} "
            "(the names program.named_predictors() gives; a step's demos are under '<step>:demos')"
        )
    demos = {}
    for name, text in mapping.items():
        if not isinstance(text, str):
            raise ConfigurationError(f"instructions for step {name!r} must be a str, got {type(text).__name__}")
        if demos_step(name) is not None:
            demos[demos_step(name)] = parse_demos(name, text)
    if whole:  # a step without a demos key has none
        demos = {name: demos.get(name, []) for name in predictors}
    for name, text in mapping.items():
        if demos_step(name) is None:
            predictors[name].signature = predictors[name].signature.with_instructions(text)
    for step, wanted in demos.items():
        if demos_text(getattr(predictors[step], "demos", None)) != canonical_json(wanted):
            predictors[step].demos = [dspy.Example(**d) for d in wanted]


def save_signatures(program: Any) -> dict[str, Any]:
    """The signature object and the demos list of every predictor, by step name, for :func:`restore_signatures`."""
    return {name: (p.signature, getattr(p, "demos", None)) for name, p in program.named_predictors()}


def restore_signatures(program: Any, saved: dict[str, Any]) -> None:
    """Put back the very signature objects and demos lists :func:`save_signatures` took (instructions and all)."""
    for name, predictor in program.named_predictors():
        predictor.signature, demos = saved[name]
        if demos is not None or hasattr(predictor, "demos"):
            predictor.demos = demos


@contextmanager
def instructions_for_now(program: Any, mapping: dict[str, str], *, whole: bool = False) -> Iterator[None]:
    """``mapping`` applied to ``program`` in place for the block only (:func:`apply_instructions`, ``whole`` as
    there): no copy, since a program may hold things that cannot be copied. The very signature objects come back
    when the block ends, also when it (or applying ``mapping``) raises."""
    saved = save_signatures(program)
    try:
        apply_instructions(program, mapping, whole=whole)
        yield
    finally:
        restore_signatures(program, saved)


# -- copying -------------------------------------------------------------------------------------
def _lenient_copy(value: Any, memo: dict[int, Any], where: str, shared: list[str]) -> Any:
    """A deep copy of ``value`` that, like dspy's ``Module.deepcopy()``, shares what cannot be copied, but
    also walks into modules held in lists, tuples and dicts so that no predictor ends up shared."""
    import dspy

    if id(value) in memo:
        return memo[id(value)]
    trial = dict(memo)  # a failed deep copy leaves half-built objects in its memo: keep them out
    try:
        result = copy.deepcopy(value, trial)
    except Exception:
        pass
    else:
        memo.update(trial)
        return result
    if isinstance(value, dspy.BaseModule):
        new = value.__class__.__new__(value.__class__)
        memo[id(value)] = new
        for attr, item in value.__dict__.items():
            new.__dict__[attr] = _lenient_copy(item, memo, f"{where}.{attr}", shared)
        return new
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        items = [_lenient_copy(item, memo, f"{where}[{i}]", shared) for i, item in enumerate(value)]
        return items if type(value) is list else tuple(items)
    if type(value) is dict:
        return {key: _lenient_copy(item, memo, f"{where}[{key!r}]", shared) for key, item in value.items()}
    shared.append(f"{where} ({type(value).__name__})")
    try:
        return copy.copy(value)
    except Exception:
        return value


_SAID_SHARED: set[str] = set()


RESULTS_MARK = "_rlmoptimizer_result_attributes"
"""On a program compile() returned: the names of the result attributes compile() set on it (``detailed_results``,
``agent_trajectory``, ...). A copy of the program leaves them out, and a later compile of it may set them again."""


def copy_program(program: Any) -> Any:
    """A copy of ``program`` whose predictors are its own, as lenient as dspy's ``Module.deepcopy()``.

    What can be deep-copied is; what cannot (a lock, a client, ``dspy.Parallel``, an LM holding a lock) is
    shallow-copied or shared by reference, as dspy does (modules inside lists, tuples and dicts are still
    copied one by one). The result attributes an earlier compile() set on it (:data:`RESULTS_MARK`) are left out:
    they describe that run, not the copy. Raises :class:`ConfigurationError` if a predictor of the copy would still
    be the original's object: changing its instructions would then change the caller's program.
    """
    shared: list[str] = []
    new = _lenient_copy(program, {}, type(program).__name__, shared)
    own = getattr(new, "__dict__", None)
    if isinstance(own, dict) and own is not getattr(program, "__dict__", None) and RESULTS_MARK in own:
        for name in (*own[RESULTS_MARK], RESULTS_MARK):  # (taken off the copy: the original keeps its own)
            own.pop(name, None)
    said = ", ".join(shared)
    if shared and said not in _SAID_SHARED:  # (once: every evaluation copies the program)
        _SAID_SHARED.add(said)
        logger.info("Copying the program shared what cannot be deep-copied (as dspy does): %s", said)
    originals = {id(predictor): name for name, predictor in program.named_predictors()}
    same = [name for name, predictor in new.named_predictors() if id(predictor) in originals]
    if same:
        raise ConfigurationError(
            f"the program cannot be copied without sharing its step(s) {same} with the original (a deep copy "
            "failed and the object holding them could not be copied apart). Hold predictors as attributes of a "
            "dspy.Module, or in a list, tuple or dict attribute, or give the object holding them a __deepcopy__."
        )
    return new


# -- fingerprint ---------------------------------------------------------------------------------
def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type) and not getattr(annotation, "__args__", None):
        return annotation.__qualname__
    return str(annotation)


def _field(name: str, info: Any) -> dict[str, Any]:
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return {
        "name": name,
        "prefix": extra.get("prefix"),
        "desc": extra.get("desc"),
        "type": _type_name(info.annotation),
    }


def _demo(demo: Any) -> Any:
    items = getattr(demo, "items", None)
    if callable(items):
        try:
            return jsonable(dict(items()))
        except Exception:
            pass
    return jsonable(demo)


def signature_description(signature: Any) -> dict[str, Any]:
    """A signature's instructions and fields as JSON-friendly data: what a predictor call is."""
    return {
        "instructions": signature.instructions,
        "inputs": [_field(n, f) for n, f in signature.input_fields.items()],
        "outputs": [_field(n, f) for n, f in signature.output_fields.items()],
    }


def structural_fingerprint(program: Any) -> dict[str, Any]:
    """Everything about ``program`` except its instructions, as canonical JSON-friendly data."""
    predictors = []
    for name, predictor in program.named_predictors():
        signature = predictor.signature
        predictors.append(
            {
                "name": name,
                "class": type(predictor).__qualname__,
                "inputs": [_field(n, f) for n, f in signature.input_fields.items()],
                "outputs": [_field(n, f) for n, f in signature.output_fields.items()],
                "demos": [_demo(d) for d in (getattr(predictor, "demos", None) or [])],
            }
        )
    modules = [{"path": path, "class": type(module).__qualname__} for path, module in program.named_sub_modules()]
    return {"version": FINGERPRINT_VERSION, "predictors": predictors, "modules": modules}


def fingerprint_digest(fp: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a fingerprint."""
    return sha256_json(fp)


# -- the program's own code ------------------------------------------------------------------------
_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _code_only(value: Any, depth: int = 0) -> Any:
    """What code ``value`` stands for, the same in every process and after every call: a function's bytecode,
    constants and names (its decorator's wrapped function too), its defaults and closure values as far as they are
    plain values, tuples of them, functions or classes; any other object (a list, dict or set too) as its class's
    name only, never its state (a retry decorator's statistics, a logger's cache, a client's clock, a mutable
    default that fills up). Classes and functions are named without their
    module, so a class run as ``__main__`` and imported later is the same."""
    if isinstance(value, _PLAIN):
        return repr(value)
    if depth > 8:
        return "..."
    if isinstance(value, (tuple, frozenset)):  # a list, dict or set may be a cache that fills up: its kind only
        items = [_code_only(item, depth + 1) for item in value]
        return sorted(items, key=repr) if isinstance(value, frozenset) else items
    if isinstance(value, types.CodeType):
        return {
            "bytecode": hashlib.sha256(value.co_code).hexdigest(),
            "consts": [_code_only(const, depth + 1) for const in value.co_consts],
            "names": list(value.co_names),
        }
    function = getattr(value, "__func__", value)  # a method, staticmethod or classmethod
    if isinstance(function, types.FunctionType):
        cells = [_cell(cell) for cell in function.__closure__ or ()]
        return {
            "function": function.__qualname__,
            "code": _code_only(function.__code__, depth + 1),
            "defaults": _code_only([function.__defaults__, function.__kwdefaults__], depth + 1),
            "closure": [_code_only(cell, depth + 1) if _carries_code(cell) else _kind(cell) for cell in cells],
            "wrapped": _code_only(function.__wrapped__, depth + 1) if hasattr(function, "__wrapped__") else None,
        }
    if isinstance(value, type):
        return {"class": value.__qualname__}
    return _kind(value)


def _carries_code(value: Any) -> bool:
    return isinstance(value, (*_PLAIN, tuple, frozenset, type, types.FunctionType, types.MethodType))


def _kind(value: Any) -> dict[str, str]:
    return {"object": type(value).__qualname__}


def program_code_identity(program: Any) -> dict[str, Any]:
    """What the program's own code computes, for resuming a run directory: ``{"python": "3.11", "classes": {...}}``
    where each module class of the program that is not dspy's own (``Predict``, ``ChainOfThought``) has, under its
    ``__qualname__``, a digest of the functions it and its non-dspy bases define (``forward``, helpers) as
    :func:`_code_only` describes them. Bytecode differs between Python versions, hence the version. Functions
    outside the classes that the code calls are not part of it."""
    classes: dict[str, list[str]] = {}
    for _, module in program.named_sub_modules():
        cls = type(module)
        own = [base for base in cls.__mro__ if base is not object and not base.__module__.startswith("dspy.")]
        if not own:
            continue
        try:
            described = [
                [base.__qualname__, name, _code_only(value)]
                for base in own
                for name, value in sorted(vars(base).items())
                if isinstance(getattr(value, "__func__", value), types.FunctionType)
            ]
            digest = sha256_json(described)[:16]
        except Exception:  # noqa: BLE001 (code that cannot be described is not recognised by its code)
            digest = "unknown"
        classes.setdefault(cls.__qualname__, [])
        if digest not in classes[cls.__qualname__]:
            classes[cls.__qualname__].append(digest)
    for _, module in program.named_sub_modules():  # the functions a module holds: a ReAct's tools, a reward_fn
        held = _held_code(module)
        if held:
            name = f"{type(module).__qualname__}{HELD}"
            classes.setdefault(name, [])
            if held not in classes[name]:
                classes[name].append(held)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    classes_digest = {name: "+".join(sorted(digests)) for name, digests in classes.items()}
    return {"python": version, "classes": classes_digest, "held": True}  # (held: the functions modules hold count)


HELD = " (the functions it holds)"
"""The end of the name under which :func:`program_code_identity` records the functions a module holds."""


def _dspys_own(function: types.FunctionType) -> bool:
    """Whether ``function`` is dspy's (a ReAct's ``finish`` tool): it changes with dspy, not with the program."""
    module = function.__module__ or ""
    return module == "dspy" or module.startswith("dspy.")


def _held_code(module: Any) -> str | None:
    """A digest of the functions ``module`` holds in its own attributes, directly or in a list, tuple or dict
    (``dspy.ReAct``'s tools, as ``dspy.Tool``'s ``func``; ``dspy.Refine``'s ``reward_fn``): what they compute decides
    the program's answers as its methods do. None when it holds none."""
    found = []
    for attribute, value in sorted(vars(module).items()):
        items = (
            value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
        )
        for key, item in [(None, value)] if not items else list(items):
            function = getattr(item, "func", item) if type(item).__name__ == "Tool" else item
            plain = getattr(function, "__func__", function)
            if not isinstance(plain, types.FunctionType):
                continue
            if not _dspys_own(plain):
                found.append([attribute, repr(key), _code_only(function)])
                continue
            for cell in plain.__closure__ or ():  # dspy's wrapper of the user's function (BestOfN's reward_fn)
                inner = _cell(cell)
                if isinstance(inner, types.FunctionType) and not _dspys_own(inner):
                    found.append([attribute, repr(key), _code_only(inner)])
    if not found:
        return None
    try:
        return sha256_json(found)[:16]
    except Exception:  # noqa: BLE001 (code that cannot be described is not recognised by its code)
        return "unknown"


# -- comparing -----------------------------------------------------------------------------------
def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    text = repr(text) if isinstance(value, str) else text
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _field_diff(step: str, side: str, old: list[dict], new: list[dict]) -> list[str]:
    lines = []
    old_by_name = {f["name"]: f for f in old}
    new_by_name = {f["name"]: f for f in new}
    for name in old_by_name:
        if name not in new_by_name:
            lines.append(f"step {step!r}: {side} field {name!r} removed")
    for name in new_by_name:
        if name not in old_by_name:
            lines.append(f"step {step!r}: {side} field {name!r} added")
    for name, before in old_by_name.items():
        after = new_by_name.get(name)
        if after is None:
            continue
        for key in ("type", "prefix", "desc"):
            if before.get(key) != after.get(key):
                lines.append(
                    f"step {step!r}: {side} field {name!r} {key} changed from "
                    f"{_short(before.get(key))} to {_short(after.get(key))}"
                )
    common_old = [f["name"] for f in old if f["name"] in new_by_name]
    common_new = [f["name"] for f in new if f["name"] in old_by_name]
    if common_old != common_new:
        lines.append(f"step {step!r}: {side} fields reordered from {common_old} to {common_new}")
    return lines


def _demo_diff(step: str, old: list, new: list) -> list[str]:
    if old == new:
        return []
    if len(old) != len(new):
        return [f"step {step!r}: demos changed from {len(old)} to {len(new)}"]
    changed = [i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b]
    return [f"step {step!r}: demo {i} changed from {_short(old[i])} to {_short(new[i])}" for i in changed]


def diff_fingerprints(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Each structural difference between two fingerprints, in words; empty when they are equal."""
    lines: list[str] = []
    old_steps = {p["name"]: p for p in expected.get("predictors", [])}
    new_steps = {p["name"]: p for p in actual.get("predictors", [])}
    lines += [f"step {name!r} removed" for name in old_steps if name not in new_steps]
    lines += [f"step {name!r} added" for name in new_steps if name not in old_steps]
    for name, before in old_steps.items():
        after = new_steps.get(name)
        if after is None:
            continue
        if before.get("class") != after.get("class"):
            lines.append(f"step {name!r}: class changed from {before.get('class')} to {after.get('class')}")
        lines += _field_diff(name, "input", before.get("inputs", []), after.get("inputs", []))
        lines += _field_diff(name, "output", before.get("outputs", []), after.get("outputs", []))
        lines += _demo_diff(name, before.get("demos", []), after.get("demos", []))
    old_order = [n for n in old_steps if n in new_steps]
    new_order = [n for n in new_steps if n in old_steps]
    if old_order != new_order:
        lines.append(f"steps reordered from {old_order} to {new_order}")

    old_modules = {m["path"]: m["class"] for m in expected.get("modules", [])}
    new_modules = {m["path"]: m["class"] for m in actual.get("modules", [])}
    lines += [f"module {p!r} ({c}) removed" for p, c in old_modules.items() if p not in new_modules]
    lines += [f"module {p!r} ({c}) added" for p, c in new_modules.items() if p not in old_modules]
    lines += [
        f"module {p!r}: class changed from {c} to {new_modules[p]}"
        for p, c in old_modules.items()
        if p in new_modules and new_modules[p] != c
    ]
    if not lines and canonical_json(expected) != canonical_json(actual):
        lines.append("the fingerprint changed (format version or an unrecognised detail)")
    return lines


def without_demos(fp: dict[str, Any]) -> dict[str, Any]:
    """``fp`` with every predictor's demos left out: what :func:`check_structure` compares."""
    return {**fp, "predictors": [{k: v for k, v in p.items() if k != "demos"} for p in fp.get("predictors", [])]}


def check_structure(expected_fp: dict[str, Any], program: Any) -> None:
    """Raise :class:`StructureChangedError` listing every difference if ``program`` no longer matches (demos
    aside: they change through the prompt map, :func:`apply_instructions`)."""
    actual = without_demos(structural_fingerprint(program))
    expected_fp = without_demos(expected_fp)
    if canonical_json(actual) == canonical_json(expected_fp):
        return
    lines = diff_fingerprints(expected_fp, actual)
    raise StructureChangedError(
        "the program's structure changed; only instructions and demos may change:\n"
        + "\n".join(f"  - {line}" for line in lines)
    )


# -- examples ------------------------------------------------------------------------------------
EXAMPLES_DIGEST_VERSION = 2
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _content(value: Any, path: tuple[int, ...] = ()) -> Any:
    """A JSON-friendly description of ``value`` by content: equal for equal data in any process (no
    ``id()``, no memory addresses, no hash-seed-dependent order). Tagged by type so that ``1``, ``"1"``
    and ``b"1"`` differ."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return ["int", str(value)]
    if isinstance(value, float):
        return ["float", repr(value)]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return [type(value).__name__, hashlib.sha256(bytes(value)).hexdigest()]
    if id(value) in path:
        return ["cycle"]
    inner = (*path, id(value))
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if isinstance(value, dict):
        items = [[_content(k, inner), _content(v, inner)] for k, v in value.items()]
        return ["dict", sorted(items, key=canonical_json)]
    if isinstance(value, (list, tuple)):
        return [kind, [_content(v, inner) for v in value]]
    if isinstance(value, (set, frozenset)):
        return [kind, sorted((_content(v, inner) for v in value), key=canonical_json)]
    if isinstance(value, enum.Enum):
        return [kind, value.name]
    if isinstance(value, (datetime.date, datetime.time)):
        return [kind, value.isoformat()]
    if isinstance(value, (decimal.Decimal, uuid.UUID, pathlib.PurePath, complex, fractions.Fraction)):
        return [kind, str(value)]
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):  # pydantic models, dspy.Image and other dspy types
        try:
            return [kind, _content(model_dump(), inner)]
        except Exception:
            pass
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [kind, {f.name: _content(getattr(value, f.name, None), inner) for f in dataclasses.fields(value)}]
    tobytes = getattr(value, "tobytes", None)  # numpy arrays, PIL images
    if callable(tobytes):
        try:
            shape = getattr(value, "shape", None) or getattr(value, "size", None)
            extra = [str(getattr(value, "dtype", "")), str(getattr(value, "mode", "")), _content(shape, inner)]
            return [kind, extra, hashlib.sha256(tobytes()).hexdigest()]
        except Exception:
            pass
    state: Any = getattr(value, "__dict__", None)
    slots = [s for cls in type(value).__mro__ for s in getattr(cls, "__slots__", ()) if isinstance(s, str)]
    if slots:
        state = {**(state or {}), **{s: getattr(value, s) for s in slots if hasattr(value, s)}}
    if isinstance(state, dict) and (state or type(value).__repr__ is object.__repr__):
        return [kind, _content({k: v for k, v in state.items() if not callable(v)}, inner)]
    return [kind, _ADDRESS.sub("", repr(value))]


def examples_digest(examples: list[Any]) -> str:
    """sha256 of a list of ``dspy.Example`` by content (fields and which of them are inputs), stable across
    processes: an example holding a ``dspy.Image``, bytes, a datetime or an instance of the user's own class
    gives the same digest in a new process as long as its data is the same."""
    described = []
    for example in examples:
        fields = dict(example.items())  # without dspy_* bookkeeping (e.g. a dataset's random dspy_uuid)
        inputs = sorted(str(k) for k in (getattr(example, "_input_keys", None) or ()))
        described.append({"fields": _content(fields), "inputs": inputs})
    return sha256_json({"version": EXAMPLES_DIGEST_VERSION, "examples": described})
