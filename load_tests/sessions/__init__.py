"""The parts of `streamrag bench sessions` (the command and what it measures: load_tests/sessions_bench.py).

- `workload`: the session's instructions, the questions, the Flash question and the synthetic server log;
- `client`: the gRPC calls the benchmark makes (session queries, Generate, ingest), timed as a client sees them;
- `flash_watcher`: a Subscribe on a thread, for the Flash answer of each data version;
- `seed_run`: one seed's session grown through the points, measured at each;
- `vllm_baseline`: the same warm Generates against a `--backend vllm` service;
- `summary`: rows into points (median and spread over seeds), same-seed ratios and the printed tables;
- `plot`: TTFT against context size.
"""
