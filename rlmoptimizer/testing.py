"""Offline LMs for tests and demos: real DSPy adapters on top, scripted replies underneath, no network.

``FunctionLM(fn)`` answers ``fn(messages)``; ``ScriptedLM([...])`` answers from a list in order. Use them to
test a DSPy program, a metric or an optimization run without an API key.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from dspy.clients.engines.dummy_engine import AsyncDummyEngine, DummyEngine
from dspy.lm15 import Message, Response, TextPart, Usage
from dspy.utils.dummies import DummyLM

Reply = dict[str, Any] | str | BaseException
_ITERATION = re.compile(r"\[\[ ## iteration ## \]\]\s*(\d+)/")
_JSON_REQUEST = "Respond with a JSON object"  # how dspy's JSONAdapter ends a request


class _FunctionEngine(DummyEngine):
    def _complete_messages(self, messages):
        owner = self.owner
        with owner._lock:
            owner.calls.append(messages)
        if owner.latency:
            time.sleep(owner.latency)
        reply = owner.fn(messages, dict(owner.kwargs)) if owner.with_settings else owner.fn(messages)
        if isinstance(reply, BaseException):
            raise reply
        text = reply if isinstance(reply, str) else owner._answer(reply, messages)
        words = sum(len(str(m.get("content", "")).split()) for m in messages)
        usage = Usage(input_tokens=words, output_tokens=len(text.split()), total_tokens=words + len(text.split()))
        if owner.usage is not None:
            usage = owner.usage(messages, text)
        with owner._lock:
            owner.reported_usage.append(usage)
        return Response(
            id=None,
            model=owner.model,
            message=Message.assistant([TextPart(text)]),
            finish_reason=owner.finish_reason(messages, text) if owner.finish_reason is not None else "stop",
            usage=usage,
        )


class FunctionLM(DummyLM):
    """An LM whose reply is ``fn(messages)``: a dict of output fields (formatted for the adapter, or as JSON for a
    request that asks for a JSON object),
    a raw string (sent as is), or an exception instance (raised). Thread safe; records every call.

    With ``with_settings=True`` the reply is ``fn(messages, settings)``, where ``settings`` are the LM's
    request settings (``temperature``, ``rollout_id``, ...). ``lm.copy(...)`` (what dspy does for rollouts)
    answers with the same ``fn`` and records its calls in the same ``calls`` list.

    Each reply reports a ``dspy.lm15.Usage``: by default the words of the messages as input tokens and the
    words of the reply as output tokens, or ``usage(messages, text)`` when given (e.g. to report cached input
    tokens). ``reported_usage`` lists every usage reported, in order. ``finish_reason(messages, text)`` gives each
    reply's finish reason (``"stop"`` when not given; ``"length"`` plays a reply cut off at ``max_tokens``)."""

    def __init__(
        self,
        fn: Callable[..., Reply],
        *,
        latency: float = 0.0,
        adapter=None,
        name="fake",
        with_settings: bool = False,
        usage: Callable[[list[dict], str], Usage] | None = None,
        finish_reason: Callable[[list[dict], str], str] | None = None,
    ):
        super().__init__([], adapter=adapter)
        self.adapter_given = adapter is not None  # else the reply's format follows the request's
        self.model = name
        self.fn = fn
        self.with_settings = with_settings
        self.latency = latency
        self.usage = usage
        self.finish_reason = finish_reason
        self.reported_usage: list[Usage] = []
        self.calls: list[list[dict]] = []
        self._lock = threading.Lock()
        self._engine_spec = _FunctionEngine(self)
        self._async_engine_spec = AsyncDummyEngine(self._engine_spec)

    @classmethod
    def load_state(cls, state: dict[str, Any], **kwargs: Any) -> FunctionLM:
        """A saved program's fake LM cannot come back: the file holds its name, not its function."""
        raise TypeError(
            f"{cls.__name__} {state.get('model')!r} answers with a Python function, which a saved program does not "
            "hold: save the program with predictor.lm = None, and set it again after load"
        )

    def _answer(self, fields: dict[str, Any], messages: list[dict]) -> str:
        """``fields`` in the format the request asks for: a JSON object when it asks for one (dspy's JSONAdapter, as
        dspy's InstructionProposer uses), else the adapter's (ChatAdapter's ``[[ ## field ## ]]`` by default)."""
        if not self.adapter_given and _JSON_REQUEST in last_user_text(messages):
            return json.dumps(fields, default=str)
        return self._format_answer_fields(fields)

    def copy(self, **kwargs):
        """A copy as ``dspy.LM.copy`` makes it (``lm.copy(rollout_id=1, temperature=1.0)``, what Refine and
        BestOfN do): its own ``kwargs`` and history, the same ``fn`` (a ScriptedLM's copies share one script
        and continue it), the same ``calls`` log and lock, so every call of every copy is recorded once."""
        copied = super().copy(**kwargs)
        copied._engine_spec = _FunctionEngine(copied)
        copied._async_engine_spec = AsyncDummyEngine(copied._engine_spec)
        return copied

    def __deepcopy__(self, memo):
        # A deep copy (dspy's Module.deepcopy of a predictor holding this LM) is a copy(): the reply function,
        # the script position and the call log stay shared; a lock cannot be deep-copied anyway.
        copied = self.copy()
        memo[id(self)] = copied
        return copied

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` as this LM's usage counts them by default (its words), for cost estimates."""
        return len(str(text).split())

    def launch(self, launch_kwargs: dict[str, Any] | None = None) -> None:
        """Nothing to start (``dspy.LM.launch`` starts local models); present so code calling it works."""

    def kill(self, launch_kwargs: dict[str, Any] | None = None) -> None:
        """Nothing to stop; see :meth:`launch`."""


class ScriptedLM(FunctionLM):
    """Replies from a list, in order; raises AssertionError when the script runs out."""

    def __init__(self, replies: Iterable[Reply], **kwargs):
        self._replies = list(replies)
        self._index = 0
        super().__init__(self._next, **kwargs)

    def _next(self, messages):
        with self._lock:
            if self._index >= len(self._replies):
                raise AssertionError(f"ScriptedLM ran out of replies after {self._index} calls")
            reply = self._replies[self._index]
            self._index += 1
        return reply

    @property
    def remaining(self) -> int:
        return len(self._replies) - self._index


def last_user_text(messages: list[dict]) -> str:
    """The text of the last user message (where DSPy's adapters put the inputs)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else str(content)
    return ""


def system_text(messages: list[dict]) -> str:
    for message in messages:
        if message.get("role") == "system":
            content = message.get("content")
            return content if isinstance(content, str) else str(content)
    return ""


def scripted_agent(turns: list[dict[str, Any] | str], *, name: str = "scripted-agent") -> FunctionLM:
    """A root LM for ``dspy.RLM`` that plays ``turns`` in order, keyed by how many REPL steps it has seen.

    Each turn is ``{"reasoning": ..., "code": ...}`` or a raw string (sent as is, e.g. a reply that does not
    parse). Because the reply depends on the history shown, a retried turn gets the same reply again; after
    the last turn it keeps answering with the last one.
    """

    def reply(messages: list[dict]) -> Reply:
        users = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "user")
        iteration = _ITERATION.findall(users)  # the turn number, also when old steps are compacted out of view
        seen = int(iteration[-1]) - 1 if iteration else users.count("=== Step ")
        return turns[min(seen, len(turns) - 1)]

    return FunctionLM(reply, name=name)
