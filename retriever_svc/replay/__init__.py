"""The replay retriever: streams a recorded or synthesized trace's chunks with their timing, scaled.

- `trace`: the trace format (docs/trace-format.md): its dataclasses, reading, writing and validation.
  The load tests' synthesizer and replay benchmark read and write traces through it.
- `backend`: the `--kind replay` backend `retriever_svc.server` loads by name (`build_backend`).
- `record`: `streamrag trace record`, a live retriever's stream written as a trace.
"""
