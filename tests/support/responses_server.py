"""A fake OpenAI Responses API on 127.0.0.1 that plays a scripted optimizer agent and records every request.

``POST /v1/responses`` answers in the Responses shape (``id``, ``output`` with one ``message`` of
``output_text``, ``usage`` with ``input_tokens``/``output_tokens``), the way dspy's native engine reads it
(``{api_base}/responses``, ``Authorization: Bearer <api_key>``). Like OpenAI it keeps each response's whole
conversation, so a request naming ``previous_response_id`` continues it; usage counts that context as input.

The reply is the scripted turn for the number of REPL steps the conversation has shown (``=== Step `` markers
in user messages, as ``rlmoptimizer.testing.scripted_agent`` counts them): a retried or re-sent turn gets the
same reply, and after the last turn the last one repeats. Tokens are counted as characters / 4, rounded up.

Faults on demand: ``reject_ids`` (those ids are "not found", HTTP 400 or ``reject_status``),
``reject_previous`` (every ``previous_response_id`` is an unsupported parameter), ``ignore_previous`` (the id
is accepted and silently ignored), ``fail_requests={n: status}`` (the n-th request, 1-based, fails).
"""

from __future__ import annotations

import itertools
import json
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import dspy

ERRORS = {
    "not_found": (
        "Previous response with id '{id}' not found.",
        "invalid_request_error",
        "previous_response_not_found",
    ),
    "unsupported": ("Unsupported parameter: 'previous_response_id'.", "invalid_request_error", "unsupported_parameter"),
    401: ("Incorrect API key provided: test.", "invalid_request_error", "invalid_api_key"),
}


def tokens(text: str) -> int:
    """The token count used here and in the benchmark: characters / 4, rounded up."""
    return math.ceil(len(text) / 4)


def agent_reply(turn: dict[str, str] | str) -> str:
    """A scripted turn in ChatAdapter's format (a raw string is sent as is)."""
    if isinstance(turn, str):
        return turn
    return (
        f"[[ ## reasoning ## ]]\n{turn['reasoning']}\n\n[[ ## code ## ]]\n```python\n{turn['code']}\n```\n\n"
        "[[ ## completed ## ]]\n"
    )


def _item_text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


@dataclass
class Recorded:
    """One request as the server received it, and what it answered."""

    body: dict[str, Any]
    status: int = 200
    response_id: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    context_tokens: int = 0  # the input the model read (stored context included), as reported in usage

    @property
    def previous_response_id(self) -> str | None:
        return self.body.get("previous_response_id")

    @property
    def items(self) -> list[tuple[str, str]]:
        """(role, text) of each input item."""
        return [(item.get("role", item.get("type", "")), _item_text(item)) for item in self.body.get("input", [])]

    @property
    def roles(self) -> list[str]:
        return [role for role, _ in self.items]

    @property
    def text(self) -> str:
        """Everything sent as input: the instructions and every input item."""
        return "\n".join([self.body.get("instructions") or "", *(text for _, text in self.items)])

    @property
    def sent_tokens(self) -> int:
        return tokens(self.text)


class ResponsesServer:
    """``with ResponsesServer(turns) as server: lm = server.lm()``; ``server.requests`` records every request."""

    def __init__(
        self,
        turns: list[dict[str, str] | str],
        *,
        reject_ids: Iterable[str] = (),
        reject_status: int = 400,
        reject_previous: bool = False,
        ignore_previous: bool = False,
        fail_requests: dict[int, int] | None = None,
    ) -> None:
        self.turns = list(turns)
        self.reject_ids = set(reject_ids)
        self.reject_status = reject_status
        self.reject_previous = reject_previous
        self.ignore_previous = ignore_previous
        self.fail_requests = dict(fail_requests or {})
        self.requests: list[Recorded] = []
        self._conversations: dict[str, list[tuple[str, str]]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------------
    def __enter__(self) -> ResponsesServer:
        self._thread = threading.Thread(target=self._http.serve_forever, name="fake-responses", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._http.shutdown()
        self._http.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}/v1"

    def lm(self, **kwargs: Any) -> dspy.LM:
        """The root LM for this server: the Responses API through dspy's native engine, no cache."""
        kwargs.setdefault("cache", False)
        return dspy.LM("openai/test-model", model_type="responses", api_base=self.url, api_key="test", **kwargs)

    # -- answering ----------------------------------------------------------------------------------------
    def answer(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            record = Recorded(body=body, headers=headers)
            self.requests.append(record)
            number = len(self.requests)
            previous = body.get("previous_response_id")
            if number in self.fail_requests:
                record.status = self.fail_requests[number]
                return record.status, _error(ERRORS.get(record.status, ("Server error.", "server_error", None)))
            if previous is not None and self.reject_previous:
                record.status = 400
                return 400, _error(ERRORS["unsupported"], param="previous_response_id")
            if (
                previous is not None
                and not self.ignore_previous
                and (previous in self.reject_ids or previous not in self._conversations)
            ):
                record.status = self.reject_status
                return record.status, _error(ERRORS["not_found"], previous, param="previous_response_id")
            context = [] if previous is None or self.ignore_previous else self._conversations[previous]
            conversation = [*context, *record.items]
            seen = sum(text.count("=== Step ") for role, text in conversation if role == "user")
            reply = agent_reply(self.turns[min(seen, len(self.turns) - 1)])
            record.response_id = f"resp_{next(self._ids):04d}"
            self._conversations[record.response_id] = [*conversation, ("assistant", reply)]
            instructions = body.get("instructions") or ""
            input_tokens = tokens("\n".join([instructions, *(text for _, text in conversation)]))
            record.context_tokens = input_tokens
            return 200, {
                "id": record.response_id,
                "object": "response",
                "status": "completed",
                "model": body.get("model", "test-model"),
                "output": [
                    {
                        "type": "message",
                        "id": f"msg_{record.response_id}",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": reply, "annotations": []}],
                    }
                ],
                "usage": {
                    "input_tokens": input_tokens,
                    "output_tokens": tokens(reply),
                    "total_tokens": input_tokens + tokens(reply),
                },
            }


def _error(spec: tuple[str, str, str | None], response_id: str = "", *, param: str | None = None) -> dict[str, Any]:
    message, kind, code = spec
    return {"error": {"message": message.format(id=response_id), "type": kind, "param": param, "code": code}}


def _handler(server: ResponsesServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's spelling)
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                body = {}
            if self.path.rstrip("/") != "/v1/responses":
                status, payload = 404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}}
            else:
                status, payload = server.answer(body, dict(self.headers))
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    return Handler
