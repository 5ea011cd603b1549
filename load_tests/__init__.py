"""Workloads and benchmarks: every figure of docs/results.md and the command that reproduces it.

Each bench is one module with two functions in the CLI's table (streamrag/cli.py), run as
`streamrag bench NAME ...`: its flags, and what it measures. What benches share is written once in
`runner.py`: the CPU lock every bench holds (/tmp/streamrag-cpu.lock), `--seeds` and the median
and min-max spread over them, flag types, `--json` and plots. Beside them: the trace synthesizer
(`synth/`, `trace_synth.py`), the replay driver (`replay.py`, `replay_run.py`, several seeds in
`replay_seeds.py`, the paper's steps in `paper.py`), the soak under faults (`chaos/`), sessions
(`sessions/`), locust load tests (`locustfile.py`, `locust_gateway.py`), and the results page
(`results_page.py`; the sections in `results_sections.py`, `results_serving.py`, `results_engine.py`;
`results_summary.py`, `results_plots.py`: `streamrag bench report` regenerates it from
`docs/results/*.json`).
"""
