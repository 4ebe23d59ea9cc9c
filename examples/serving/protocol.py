"""The OpenAI wire format of the example server: request bodies, SSE chunks, replies.

Streamed chunks are compact JSON (as vLLM and SGLang send them), one output token each:

    data: {"id":"cmpl-r1","object":"text_completion","created":1732233000,"model":"tiny-llm",
           "choices":[{"index":0,"text":" kava","logprobs":null,"finish_reason":null}]}

then a chunk with the ``finish_reason`` (``length`` or ``stop``), then, with
``stream_options.include_usage``, a chunk with ``"choices":[]`` and ``usage``, then
``data: [DONE]``. Chat completions send ``chat.completion.chunk`` objects whose first chunk
carries ``delta.role`` and the others ``delta.content``.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # OpenAI clients send more than we use

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = Field(1.0, ge=0)
    n: int = Field(1, ge=1, le=1)
    ignore_eos: bool = False  # vLLM's extension: always generate max_tokens
    # Vigil's extension, for trace replay: a synthetic prompt of this many tokens.
    prompt_tokens: int | None = Field(None, ge=1)


class CompletionRequest(_Common):
    prompt: str | list[int] | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


Kind = Literal["completion", "chat"]


def chat_text(messages: list[ChatMessage]) -> str:
    """The words of every message (text parts of multi-part contents included)."""
    parts: list[str] = []
    for m in messages:
        if isinstance(m.content, str):
            parts.append(m.content)
        elif m.content:
            parts.extend(str(p.get("text", "")) for p in m.content if p.get("type") == "text")
    return " ".join(parts)


def error_body(message: str, kind: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _dump(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


class Chunks:
    """Formats one response's SSE chunks (templates built once per response)."""

    def __init__(self, kind: Kind, rid: str, model: str, created: int) -> None:
        self.kind, self.rid, self.model, self.created = kind, rid, model, created
        obj = "text_completion" if kind == "completion" else "chat.completion.chunk"
        head = f'{{"id":{_dump(rid)},"object":"{obj}","created":{created},"model":{_dump(model)}'
        self._head = head
        if kind == "completion":
            self._pre = head + ',"choices":[{"index":0,"text":'
            self._post = ',"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            self._pre = head + ',"choices":[{"index":0,"delta":{"content":'
            self._post = '},"logprobs":null,"finish_reason":null}]}\n\n'

    def role(self) -> str:
        return (
            f"data: {self._head}"
            ',"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            '"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def token(self, text: str) -> str:
        return "data: " + self._pre + _dump(text) + self._post

    def finish(self, reason: str) -> str:
        body = '"text":""' if self.kind == "completion" else '"delta":{}'
        return (
            f'data: {self._head},"choices":[{{"index":0,{body},"logprobs":null,'
            f'"finish_reason":{_dump(reason)}}}]}}\n\n'
        )

    def usage(self, prompt_tokens: int, completion_tokens: int) -> str:
        usage = _usage(prompt_tokens, completion_tokens)
        return f'data: {self._head},"choices":[],"usage":{_dump(usage)}}}\n\n'

    def error(self, message: str) -> str:
        return f"data: {_dump(error_body(message, 'server_error', 500))}\n\n"

    done = "data: [DONE]\n\n"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def reply(
    kind: Kind,
    *,
    rid: str,
    model: str,
    created: int,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """The body of a non-streamed response."""
    if kind == "completion":
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None}
        obj = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None}
        obj = "chat.completion"
    choice["finish_reason"] = finish_reason
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": _usage(prompt_tokens, completion_tokens),
    }
