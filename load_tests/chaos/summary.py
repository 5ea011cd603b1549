"""The small summary of one or more soak reports for docs/results/chaos.json: the command, the
machine, per fault the figures the results page shows, and the targets in the page's form
(each measured value as median, min and max over the runs, which `load_tests.results_summary`
reads)."""

from __future__ import annotations

import statistics

FAULT_FIELDS = ("action", "target", "at_s", "down_s", "in_flight_at_signal", "asks_in_window", "failed", "hung",
                "failed_after_healthy", "recovery_s", "probe_start_s", "users_recovery_s", "reused_s", "degraded",
                "lost_events", "session_failed", "failure_codes", "error", "failed_10s_after", "crossed",
                "crossed_equal", "crossed_differ", "crossed_not_comparable", "out_of_order", "reissues",
                "reissued_with_tokens", "reissue_to_token_s", "stall_s", "continued", "continued_after_tokens",
                "continued_first_token_s", "tokens_recomputed", "tokens_recomputed_max")
TOTAL_FIELDS = ("asks", "answered", "failed", "success_rate", "hung", "failures_outside_windows",
                "failed_after_healthy", "max_recovery_s", "lost_events", "leaked_blocks", "answers_differ",
                "degraded", "session_calls", "session_failed", "ask_latency_s", "failed_10s_after", "crossed",
                "crossed_differ", "crossed_not_comparable", "out_of_order", "reissues", "continued",
                "tokens_recomputed")
# what, target, unit, at_most, the totals field it reads, why a miss matters
TARGETS = (
    ("Failed asks once the restarted service is healthy", 0, "", True, "failed_after_healthy",
     "a user sees errors while `status` says all is well"),
    ("Asks hung past their deadline", 0, "", True, "hung",
     "an ask in flight at a fault must fail over or fail clearly"),
    ("Recovery (fault to the first successful ask), worst fault", 15, "s", True, "max_recovery_s",
     "asks fail for longer than a restart should take"),
    ("Asks answered under a fault every period", 0.995, "", False, "success_rate", "more than 0.5% of asks failed"),
    ("Failed asks that started 10 s or more after a fault", 0, "", True, "failed_10s_after",
     "a fault's effect outlasts the restart"),
    ("Answers a fault crossed that differ from the fault-free pass", 0, "", True, "crossed_differ",
     "a resumed answer is not the one the user would have got"),
    ("Answers with a token repeated or lost", 0, "", True, "out_of_order", "the user saw a broken answer"),
    ("Failures outside every fault window", 0, "", True, "failures_outside_windows",
     "a failure no fault explains"),
    ("Acknowledged lifecycle events lost", 0, "", True, "lost_events", "the store dropped what a client was shown"),
    ("KV blocks leaked", 0, "", True, "leaked_blocks", "blocks held after every request ended"),
    ("Answers that differ from the fault-free pass", 0, "", True, "answers_differ",
     "a fault changed a greedy fp32 answer"),
)


def spread(values: list) -> dict:
    numbers = [v for v in values if v is not None]
    if len(numbers) < len(values) or not numbers:
        return {"median": None, "min": None, "max": None}
    return {"median": round(statistics.median(numbers), 4), "min": min(numbers), "max": max(numbers)}


def summarize_runs(reports: list[dict], command: str, machine: str) -> dict:
    first = reports[0]
    settings = {k: first["settings"].get(k) for k in ("duration_s", "users", "fault_every_s", "stop_s", "questions",
                                                     "max_tokens", "deadline_s", "dtype", "replicas", "orchestrators",
                                                     "soak_s")}
    runs = [{"totals": {k: r["totals"][k] for k in TOTAL_FIELDS},
             "faults": [{k: f.get(k) for k in FAULT_FIELDS} for f in r["faults"]],
             "answers": {k: r["answers"][k] for k in ("compared", "differ", "not_comparable")}} for r in reports]
    totals = {field: spread([r["totals"][field] for r in reports]) for _, _, _, _, field, _ in TARGETS}
    return {
        "chaos": {"command": command, "machine": machine, "seeds": len(reports), "settings": settings,
                  "targets_measured": totals, "runs": runs},
        "targets": [{"what": what, "target": target, "unit": unit, "at_most": at_most,
                     "measured": f"@chaos/targets_measured/{field}", "reason": reason}
                    for what, target, unit, at_most, field, reason in TARGETS],
        "not_measured": [],
        "refresh": "`streamrag bench chaos --json OUT` per seed; load_tests.chaos.summary.summarize_runs",
    }
