"""What a stored score depends on besides the instructions: the evaluation LM's identity, and the words for
what changed between two of them.

May import: the standard library and ``rlmoptimizer.records``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from rlmoptimizer.records import jsonable

# -- what a stored score depends on -----------------------------------------------------------------
# Settings of an LM that say where and how to connect, not what it answers: left out of its identity (and
# never written to disk: some are secrets).
_CONNECTION_KWARGS = frozenset(
    {
        "api_key",
        "api_base",
        "base_url",
        "api_version",
        "organization",
        "headers",
        "extra_headers",
        "timeout",
        "request_timeout",
        "num_retries",
        "max_retries",
        "azure_ad_token",
        "vertex_credentials",
        "vertex_project",
        "vertex_location",
        "aws_region_name",
        "region_name",
    }
)
_SECRET_WORDS = ("key", "secret", "password", "credential", "auth")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def lm_identity(lm: Any) -> dict[str, Any]:
    """What an LM answers depends on: its class, model name and sampling settings (temperature, max_tokens,
    ...), without connection settings or secrets."""
    kwargs = getattr(lm, "kwargs", None)
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    kept = {
        str(k): v
        for k, v in kwargs.items()
        if k not in _CONNECTION_KWARGS and not any(word in str(k).lower() for word in _SECRET_WORDS)
    }
    identity = {
        "class": f"{type(lm).__module__}.{type(lm).__qualname__}",
        "model": getattr(lm, "model", None),
        "model_type": getattr(lm, "model_type", None),
        "kwargs": kept,
    }
    return json.loads(_ADDRESS.sub("", json.dumps(jsonable(identity), sort_keys=True)))


def adapter_identity(adapter: Any) -> dict[str, Any]:
    """What an adapter's prompts and parsing depend on: its class and its plain settings (JSON or chat format,
    native function calling, the fallback to JSON)."""
    settings = {
        str(k): v
        for k, v in (vars(adapter) if hasattr(adapter, "__dict__") else {}).items()
        if not str(k).startswith("_") and isinstance(v, (bool, int, float, str, type(None)))
    }
    return {"class": f"{type(adapter).__module__}.{type(adapter).__qualname__}", "settings": settings}


def eval_lm_identity(lm: Any, program: Any, adapter: Any = None, default_adapter: Any = None) -> dict[str, Any]:
    """The identity of the LM that runs the program (``lm``), and of every LM pinned to one predictor
    (``predictor.lm``, which the program uses instead of ``lm`` for that step); and of the adapter in effect
    (``adapter``: ``dspy.settings.adapter``) when it is not dspy's default one (``default_adapter``), which formats
    the prompts and parses the answers: a stored score under another one is not this program's."""
    per_step = {
        name: lm_identity(predictor.lm)
        for name, predictor in program.named_predictors()
        if getattr(predictor, "lm", None) is not None
    }
    identity: dict[str, Any] = {"lm": lm_identity(lm), "per_step": per_step, "adapter": None}  # None: dspy's default
    if adapter is not None and (
        default_adapter is None or adapter_identity(adapter) != adapter_identity(default_adapter)
    ):
        identity["adapter"] = json.loads(
            _ADDRESS.sub("", json.dumps(jsonable(adapter_identity(adapter)), sort_keys=True))
        )
    return identity


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def describe_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``"setting: old -> new"`` for every setting that differs between two nested dicts."""
    before, after = _flatten(old), _flatten(new)
    lines = []
    for key in sorted(set(before) | set(after)):
        if before.get(key, "<not set>") != after.get(key, "<not set>"):
            lines.append(
                f"{key}: {json.dumps(before.get(key, '<not set>'))} (stored) -> {json.dumps(after.get(key, '<not set>'))} (now)"
            )
    return lines


# -- one live compile per directory -----------------------------------------------------------------
