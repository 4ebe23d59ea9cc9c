"""Trace readers on slices of the real Azure 2023 and Mooncake traces (tests/data/serving),
and on a small BurstGPT-shaped file."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.serving.traces import TraceError, detect_format, read_trace

DATA = Path(__file__).resolve().parents[2] / "data" / "serving"
AZURE = DATA / "AzureLLMInferenceTrace_conv_first300.csv"
MOONCAKE = DATA / "conversation_trace_first300.jsonl"


def test_azure_2023():
    raw = AZURE.read_bytes()
    assert not raw.endswith(b"\n") and b"\r\n" in raw  # as published: CRLF, no final newline
    trace = read_trace(AZURE)
    assert trace.format == "azure" and len(trace.requests) == 300
    first, second, last = trace.requests[0], trace.requests[1], trace.requests[-1]
    # 2023-11-16 18:15:46.6805900,374,44 / 18:15:50.9951690,396,109 / 18:17:10.7096920,212,183
    assert (first.arrival_s, first.prompt_tokens, first.output_tokens) == (0.0, 374, 44)
    assert second.arrival_s == pytest.approx(4.314579, abs=1e-6)
    assert (second.prompt_tokens, second.output_tokens) == (396, 109)
    assert last.arrival_s == pytest.approx(84.029102, abs=1e-6)
    assert (last.prompt_tokens, last.output_tokens) == (212, 183)
    arrivals = [r.arrival_s for r in trace.requests]
    assert arrivals == sorted(arrivals)
    assert [r.index for r in trace.requests] == list(range(300))
    assert sum(r.output_tokens for r in trace.requests) == sum(
        int(line.rsplit(",", 1)[1]) for line in raw.decode().splitlines()[1:]
    )


def test_mooncake_conversation():
    trace = read_trace(MOONCAKE)
    assert trace.format == "mooncake" and len(trace.requests) == 300
    first, last = trace.requests[0], trace.requests[-1]
    assert (first.arrival_s, first.prompt_tokens, first.output_tokens) == (0.0, 6758, 500)
    assert (last.arrival_s, last.prompt_tokens, last.output_tokens) == (102.0, 979, 140)
    # The trace starts with five requests at 0 ms: ties keep the file's order.
    assert [r.prompt_tokens for r in trace.requests[:5]] == [6758, 7322, 7236, 2290, 6760]
    assert trace.duration_s == 102.0


def test_limit_takes_the_first_requests():
    trace = read_trace(MOONCAKE, limit=10)
    assert len(trace.requests) == 10 and trace.requests[-1].index == 9
    assert read_trace(AZURE, "azure", limit=1).requests[0].prompt_tokens == 374


def test_burstgpt(tmp_path: Path):
    path = tmp_path / "burst.csv"
    path.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "12,ChatGPT,300,20,320,Conversation log\n"
        "15,GPT-4,120,0,120,Conversation log\n"  # failed in the service: skipped
        "19.5,GPT-4,800,64,864,API log\n"
    )
    trace = read_trace(path)
    assert trace.format == "burstgpt" and trace.skipped == 1
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.model) for r in trace.requests] == [
        (0.0, 300, 20, "ChatGPT"),
        (7.5, 800, 64, "GPT-4"),
    ]


def test_format_detection_and_errors(tmp_path: Path):
    assert detect_format(AZURE) == "azure"
    assert detect_format(MOONCAKE) == "mooncake"
    junk = tmp_path / "junk.csv"
    junk.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match="cannot tell the trace format"):
        read_trace(junk)
    with pytest.raises(TraceError, match="missing column"):
        read_trace(junk, "azure")
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,12,x\n")
    with pytest.raises(TraceError, match=r"bad.csv:2: GeneratedTokens must be a whole number"):
        read_trace(bad)
    stamp = tmp_path / "stamp.csv"
    stamp.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,12,3\n")
    with pytest.raises(TraceError, match="bad TIMESTAMP"):
        read_trace(stamp)
    lines = tmp_path / "m.jsonl"
    lines.write_text('{"timestamp": 0, "input_length": 5, "output_length": 2}\n{"oops": 1}\n')
    with pytest.raises(TraceError, match=r"m.jsonl:2: not a Mooncake request"):
        read_trace(lines)
    with pytest.raises(TraceError, match="unknown trace format"):
        read_trace(AZURE, "sharegpt")
