"""Workload traces, replay benchmarks and locust load tests (the workloads issue fills this in)."""
