"""LLM serving tools: trace readers (:mod:`backend.serving.traces`) and the trace replay
client behind ``vigil replay`` (:mod:`backend.serving.replay`, :mod:`backend.serving.report`)."""
