"""The root-LM calls: what the root LM is sent on each agent turn, multi-turn rendering and the stateful
Responses chain (:class:`TurnSender` sends a turn; the chain is the server-side conversation).

dspy's ``RLM`` renders every turn as one user message that repeats the whole REPL history, so turn k
re-sends turns 1..k-1 and a run's input grows with the square of its length. Two options change that:

``rlm_multiturn_history`` (:class:`TurnRenderer`)
    The history becomes alternating turns: the agent's own reply (reasoning and code) as the assistant, the
    output of that code as the next user message. Turn k's messages are turn k-1's plus two, so a provider's
    prompt cache can reuse the whole prefix.

``root_stateful_session`` (:class:`ResponsesChain`)
    With an OpenAI Responses-API root LM (``dspy.LM(..., model_type="responses")``), each turn names the
    previous turn's response as ``previous_response_id`` and sends only what the server does not hold yet:
    normally the output of the last code cell and the iteration state. The system prompt goes into the
    chain's first request as a ``developer`` input item (the Responses API carries input items over, but not
    ``instructions``), so a chained request sends no system prompt at all.

The messages of a turn, built with the adapter in use (``dspy.settings.adapter`` or ``ChatAdapter``), so a
reply is parsed exactly as dspy would parse it (``adapter.parse(signature, text)``)::

    one message (dspy's default)  [system, user(variables_info, repl_history=every step, iteration)]
    multi-turn                    [system, U0, A0, U1, A1, ..., A(n-1), Un]
        U0 = user(variables_info, repl_history="You have not interacted ...", iteration="1/N")
        Ai = assistant(reasoning and code of step i+1)
        Uk = user(repl_history="=== Step k ===" and the output of step k, iteration="k+1/N")
    chained                       the multi-turn messages the server does not hold (normally just Un)

Whether the first request of a chain was one message or multi-turn, what follows it is multi-turn: the server
holds the agent's replies as assistant turns.

Fallbacks, each said once in the log: a root LM that cannot chain (not a Responses-API ``dspy.LM``) runs
statelessly (logged at INFO: it is the common case with the default settings); a request whose ``previous_response_id`` the server refuses (an HTTP 400/404
such as ``previous_response_not_found``, an expired or unstored id, an unsupported parameter) or evidently
ignores (its reported input is smaller than the previous turn's) is sent again in full without it, and the
chain restarts from that response; a second refusal switches chaining off for the rest of the run (both
logged at WARNING). No turn is lost to a fallback.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import dspy
from dspy import AdapterParseError, ChatAdapter, LMError, Prediction

from rlmoptimizer.agent._dspy import (
    CLIENT_KEYS,
    Message,
    REPLEntry,
    REPLHistory,
    Request,
    Response,
    request_from_openai_chat,
)

logger = logging.getLogger(__name__)

__all__ = ["ResponsesChain", "TurnRenderer", "TurnSender", "chain_unsupported_reason", "is_chain_rejection"]

MULTITURN_HISTORY_DESC = (
    "The output of your latest REPL code execution. Your earlier code and its outputs are the previous turns "
    "of this conversation."
)
# LM settings that are not generation options of a Request (connection settings, dspy-only knobs).
_NOT_REQUEST_OPTIONS = frozenset(CLIENT_KEYS) | {"n", "rollout_id", "num_generations", "prompt_cache", "cache"}
# HTTP statuses with which a server refuses a request it could serve without the previous_response_id.
_REJECTION_STATUSES = frozenset({400, 404, 409, 422})


class TurnRenderer:
    """Builds the chat messages of one agent turn from the action signature, its inputs and the REPL history.

    ``multiturn=False`` gives exactly what dspy's adapter makes of the turn (one user message); ``True``
    gives alternating turns (see the module docstring), with the ``repl_history`` field described as "the
    output of your latest execution". :meth:`turns` always renders multi-turn: it is also what a chained
    request sends.
    """

    def __init__(self, *, multiturn: bool, max_iters: int) -> None:
        self.multiturn = multiturn
        self.max_iters = max_iters

    def signature(self, action_signature: type[dspy.Signature]) -> type[dspy.Signature]:
        if not self.multiturn:
            return action_signature
        return action_signature.with_updated_fields("repl_history", type_=str, desc=MULTITURN_HISTORY_DESC)

    def messages(self, adapter, signature, *, variables_info, history: REPLHistory, iteration: str) -> list[dict]:
        """The whole turn: the system message and every user/assistant message."""
        if not self.multiturn:
            inputs = {"variables_info": variables_info, "repl_history": history, "iteration": iteration}
            return adapter.format(signature, demos=[], inputs=inputs)
        system = {"role": "system", "content": adapter.format_system_message(signature)}
        return [
            system,
            *self.turns(
                adapter, signature, variables_info=variables_info, history=history, iteration=iteration, start=0
            ),
        ]

    def turns(
        self, adapter, signature, *, variables_info, history: REPLHistory, iteration: str, start: int
    ) -> list[dict]:
        """The multi-turn messages from user turn ``start`` on: ``U(start), A(start), ..., A(n-1), U(n)``."""
        entries = list(history)
        # a bounded context's view (rlmoptimizer.context) starts at a later step, after a header for the earlier
        offset = getattr(history, "first_step", 1) - 1
        messages: list[dict] = []
        for k in range(start, len(entries) + 1):
            step = iteration if k == len(entries) else f"{k + offset + 1}/{self.max_iters}"
            if k == 0:
                shown = getattr(history, "folded", "") or REPLHistory().format()
                inputs = {"variables_info": variables_info, "repl_history": shown, "iteration": step}
            else:
                output = REPLEntry.format_output(entries[k - 1].output, history.max_output_chars)
                inputs = {"repl_history": f"=== Step {k + offset} ===\n{output}", "iteration": step}
            messages.append(
                {"role": "user", "content": adapter.format_user_message_content(signature, inputs, main_request=True)}
            )
            if k < len(entries):
                entry = entries[k]
                outputs = {"reasoning": entry.reasoning, "code": f"```python\n{entry.code}\n```"}
                messages.append(
                    {"role": "assistant", "content": adapter.format_assistant_message_content(signature, outputs)}
                )
        return messages


class ResponsesChain:
    """The server-side conversation of a run: the last response's id and the REPL steps it holds.

    Invariant: ``response_id`` is None (no chain: the next request is sent in full), or the server holds, under
    ``response_id``, the system prompt ``system``, every step of ``held`` with its output, and the reply that
    became the step after them. A history that does not start with ``held`` (a new or resumed run), or another
    system prompt, gets no delta: the turn starts a fresh chain.
    """

    def __init__(self) -> None:
        self.response_id: str | None = None
        self._system: str | None = None
        self._held: tuple[REPLEntry, ...] = ()

    def resume_point(self, history: REPLHistory, system: str) -> int | None:
        """The first user turn the server does not hold, or None when the turn must be sent in full."""
        if self.response_id is None or system != self._system:
            return None
        held = len(self._held)
        entries = tuple(history)
        if len(entries) <= held or entries[:held] != self._held:
            return None
        return held + 1

    def advance(self, response_id: str, history: REPLHistory, system: str) -> None:
        """The reply to a request built from ``history`` parsed; the next turn chains from it."""
        self.response_id = response_id
        self._system = system
        self._held = tuple(history)

    def reset(self) -> None:
        self.response_id = None
        self._system = None
        self._held = ()


def chain_unsupported_reason(lm: Any) -> str | None:
    """Why ``lm`` cannot chain turns with ``previous_response_id``, or None when it can."""
    if not isinstance(lm, dspy.LM):
        return f"the root LM is a {type(lm).__name__}, not a dspy.LM"
    if lm.model_type != "responses":
        return f"the root LM {lm.model!r} uses model_type={lm.model_type!r}, not the Responses API ('responses')"
    if not isinstance(lm.engine, str) or lm.engine == "litellm":
        return f"the root LM {lm.model!r} does not use dspy's native engine (engine={lm.engine!r})"
    return None


def is_chain_rejection(exc: BaseException) -> bool:
    """Whether a failed chained request should be sent again in full, without ``previous_response_id``.

    True for OpenAI's ``previous_response_not_found`` and for any 400/404/409/422 refusal that names the
    previous response. A refusal for another reason fails again when the turn is resent in full, and that
    second error propagates, so a generous reading loses nothing.
    """
    if not isinstance(exc, LMError):
        return False
    if (getattr(exc, "provider_code", None) or "") == "previous_response_not_found":
        return True
    message = str(exc).lower()
    names_it = "previous_response" in message or "previous response" in message
    return names_it and (exc.status is None or exc.status in _REJECTION_STATUSES)


class TurnSender:
    """Takes the agent's turns when ``rlm_multiturn_history`` or ``root_stateful_session`` is on.

    One instance per agent. The chain checks on every turn that the history extends what the server holds,
    so a second or resumed run through the same agent starts a fresh chain. Each fallback is logged once
    per instance.
    """

    def __init__(self, *, stateful: bool, multiturn: bool, max_iters: int) -> None:
        self.stateful = stateful
        self.renderer = TurnRenderer(multiturn=multiturn, max_iters=max_iters)
        self.chain = ResponsesChain()
        self._rejections = 0
        self._chain_off = False
        self._last_input_tokens: int | None = None
        self._logged: set[str] = set()
        self.last_cut_off = False  # the last reply ran into the root LM's output limit (it may not have parsed)

    def takes_turn(self, lm: Any) -> bool:
        """False when the turn is dspy's usual one (one user message, no chain): the agent keeps its own path."""
        if lm is None:
            return False
        return self.renderer.multiturn or self._can_chain(lm)

    def act(
        self,
        lm,
        action_signature,
        *,
        variables_info,
        history: REPLHistory,
        iteration: str,
        options: dict[str, Any] | None = None,
        fresh: bool = False,
    ) -> Prediction:
        """One turn: render, send (chained where possible), parse. ``fresh`` bypasses dspy's cache (a retry).

        Raises AdapterParseError for a reply that does not parse; the chain then stays where it was, so a
        retry is the same request and the next turn re-sends the failed step.
        """
        adapter = dspy.settings.adapter or ChatAdapter()
        signature = self.renderer.signature(action_signature)
        inputs = {"variables_info": variables_info, "history": history, "iteration": iteration}
        options = dict(options or {})
        chained = self._can_chain(lm)
        if chained:
            response = self._send_chained(lm, adapter, signature, inputs, options, fresh)
        else:
            response = _send(lm, self.renderer.messages(adapter, signature, **inputs), options, fresh=fresh)
        self.last_cut_off = cut_off = response.finish_reason == "length"  # the reply ran into its max_tokens
        outputs = _parse(adapter, signature, response.text)
        if chained and not self._chain_off:
            if response.id:
                self.chain.advance(response.id, history, adapter.format_system_message(signature))
            else:
                self.chain.reset()
                self._warn_once(
                    "no-id",
                    "root_stateful_session: the root LM's response carries no id to chain "
                    "from; the next turn is sent in full.",
                )
        prediction = Prediction(**outputs)
        prediction._cut_off = cut_off  # (not a field: the agent adds a note to the turn's output)
        return prediction

    # -- internals -------------------------------------------------------------------------------------
    def _can_chain(self, lm: Any) -> bool:
        if not self.stateful or self._chain_off or lm is None:
            return False
        reason = chain_unsupported_reason(lm)
        if reason is not None:
            self._warn_once(
                "unsupported",
                level=logging.INFO,
                message=f"root_stateful_session is on, but {reason}; every turn sends the whole REPL history (stateless). "
                "Use dspy.LM(..., model_type='responses') to chain turns with previous_response_id.",
            )
            return False
        return True

    def _send_chained(self, lm, adapter, signature, inputs, options, fresh) -> Response:
        start = self.chain.resume_point(inputs["history"], adapter.format_system_message(signature))
        if start is not None:
            previous = self.chain.response_id
            delta = self.renderer.turns(adapter, signature, start=start, **inputs)
            try:
                response = _send(lm, delta, options, fresh=fresh, previous_response_id=previous)
            except LMError as exc:
                if not is_chain_rejection(exc):
                    raise
                self._fall_back(f"the server refused previous_response_id {previous!r} ({exc})")
            else:
                if not _context_dropped(response, self._last_input_tokens):
                    self._last_input_tokens = _input_tokens(response)
                    return response
                self._fall_back(
                    f"the server ignored previous_response_id {previous!r} (the input it reports shrank from "
                    f"{self._last_input_tokens} to {_input_tokens(response)} tokens)"
                )
        self.chain.reset()
        messages = self.renderer.messages(adapter, signature, **inputs)
        response = _send(lm, messages, options, fresh=fresh, system_as_input=True)
        self._last_input_tokens = _input_tokens(response)
        return response

    def _fall_back(self, what: str) -> None:
        self.chain.reset()
        self._rejections += 1
        if self._rejections == 1:
            self._warn_once(
                "rejected",
                f"root_stateful_session: {what}; this turn is sent again in full, "
                "without it, and the chain restarts from its response.",
            )
        else:
            self._chain_off = True
            self._warn_once(
                "off",
                f"root_stateful_session: {what}, a second time; chaining is off for the rest "
                "of this run (every turn sends the whole REPL history).",
            )

    def _warn_once(self, key: str, message: str, level: int = logging.WARNING) -> None:
        if key not in self._logged:
            self._logged.add(key)
            logger.log(level, message)


def _send(
    lm,
    messages: list[dict],
    options: dict[str, Any],
    *,
    fresh: bool,
    previous_response_id: str | None = None,
    system_as_input: bool = False,
) -> Response:
    """One explicit ``dspy.lm15.Request`` (the native path, which returns a Response whose id can be chained).

    The generation options are the LM's own plus the predictor's, converted as dspy converts an ordinary
    messages call. The system message becomes the Request's system prompt (``instructions``), or with
    ``system_as_input`` the first input item (a ``developer`` message, which a chain carries over)."""
    settings = {**lm.kwargs, **options}
    body: dict[str, Any] = {"model": lm.model, "messages": messages}
    body.update(
        {key: value for key, value in settings.items() if key not in _NOT_REQUEST_OPTIONS and value is not None}
    )
    request = request_from_openai_chat(body)
    config = request.config
    if previous_response_id is not None:
        config = replace(config, extensions={**(config.extensions or {}), "previous_response_id": previous_response_id})
    if settings.get("prompt_cache") is not None and config.cache is None:
        config = replace(config, cache=settings["prompt_cache"])
    request: Request = replace(request, config=config)
    if system_as_input and request.system is not None:
        system = request.system if isinstance(request.system, str) else "".join(p.text for p in request.system)
        request = replace(request, system=None, messages=(Message.developer(system), *request.messages))
    call_kwargs: dict[str, Any] = {}
    if fresh or options.get("cache") is False:
        call_kwargs["cache"] = False
    if settings.get("rollout_id") is not None:
        call_kwargs["rollout_id"] = settings["rollout_id"]
    response = lm(request, **call_kwargs)
    if not isinstance(response, Response):
        raise TypeError(f"the root LM answered an explicit Request with {type(response).__name__}, not a Response")
    return response


def _parse(adapter, signature, text: str | None) -> dict[str, Any]:
    if not text:
        raise AdapterParseError(
            adapter_name=type(adapter).__name__,
            signature=signature,
            lm_response=str(text),
            message="The LM returned an empty or null response.",
        )
    return adapter.parse(signature, text)


def _input_tokens(response: Response) -> int | None:
    usage = getattr(response, "usage", None)
    return getattr(usage, "input_tokens", None)


def _context_dropped(response: Response, previous_input_tokens: int | None) -> bool:
    """A server that holds the chain counts the previous context as input (OpenAI does), so the input of a
    chained turn is never smaller than its predecessor's. When it is, the server dropped the context."""
    current = _input_tokens(response)
    return previous_input_tokens is not None and current is not None and current < previous_input_tokens


def history_mark(lm: Any) -> Any:
    """What ``lm``'s history (dspy's, per LM) holds last now: :func:`cut_off_since` tells a reply recorded after it."""
    history = getattr(lm, "history", None)
    return history[-1].get("uuid") if isinstance(history, list) and history and isinstance(history[-1], dict) else None


def calls_since(lm: Any, mark: Any) -> int:
    """How many calls ``lm`` recorded in its history after ``mark`` (:func:`history_mark`); 0 when dspy recorded
    none (history switched off) or ``mark`` is no longer in it."""
    history = getattr(lm, "history", None)
    if not isinstance(history, list):
        return 0
    ids = [entry.get("uuid") if isinstance(entry, dict) else None for entry in history]
    if mark is None:
        return len(ids)
    return len(ids) - 1 - ids.index(mark) if mark in ids else 0


def cut_off_since(lm: Any, mark: Any) -> bool:
    """Whether the reply ``lm`` recorded in its history after ``mark`` (:func:`history_mark`) ran into its output
    limit (``max_tokens``): its finish reason is ``"length"``. False when dspy recorded none (history switched off)."""
    history = getattr(lm, "history", None)
    if not isinstance(history, list) or not history or not isinstance(history[-1], dict):
        return False
    entry = history[-1]
    return entry.get("uuid") != mark and getattr(entry.get("response"), "finish_reason", None) == "length"


def for_attempt(lm: dspy.BaseLM, attempt: int) -> dspy.BaseLM:
    """``lm`` itself for attempt 0, else a copy whose requests carry dspy's ``rollout_id=attempt``: they miss the
    cache entries of every other attempt (an identical compile() otherwise replays the whole agent from dspy's
    cache)."""
    return lm if attempt == 0 else lm.copy(rollout_id=attempt)
