"""Plumbing every streamrag service and client shares, standard and small.

`config` (ports, the common flags, `run_command`), `server` (a gRPC server with health, reflection,
metrics and undecodable requests refused), `health` (probes), `auth` and `tls` (API keys,
certificates), `channels` (the client channel every caller dials), `ask_resume` (an Ask that
survives its orchestrator), `hardware` (the fast number format here), `pids` (a process known by pid
and start time), `progress` (progress lines) and `stats` (the one `percentile`).
"""
