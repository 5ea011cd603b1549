"""The soak's report: failures attributed to fault windows, one row per fault, the targets, JSON.

Times in the report are seconds since the soak started. Per fault:
- `failed` / `hung`: failed asks (and those among them that ran out of their deadline) whose
  time overlaps the fault's window (signal -> back and healthy); one that overlaps several is
  charged to the latest fault that started before it ended;
- `failed_after_healthy`: failed asks that started after the service was healthy again and before
  the next fault, outside every window (the target is 0);
- `recovery_s`: from the signal to the answer of the first probe ask answered with the service's
  part (a retriever: its chunks arrived; anything else: any answer): "kill to the first successful
  ask" (workload.RecoveryProbe asks one short question after another from the signal on, each
  waiting for an orchestrator it cannot reach yet, so it includes one ask's own time);
  `probe_start_s` to that ask's start; `users_recovery_s` to the start of the first user ask that
  succeeded (it also waits for a user to be free); for a replica also `reused_s`, to the start of
  the first successful ask served by that replica;
- `degraded`: asks answered in the window without the context of a retriever they asked for;
- `lost_events`: shortfalls of acknowledged asks that ended in the window or up to 5 s before it;
- `session_failed`: the ingesting session's calls that failed in the window;
- `failed_10s_after`: failed asks that started 10 s or more after the signal and before the next
  fault (the target is 0, whether or not the service is back);
- `crossed`: answered asks in flight at the signal or re-issued in the window, `crossed_differ`
  those whose answer differs from the fault-free pass's (same question and documents),
  `crossed_not_comparable` those with other documents, and `out_of_order` asks whose tokens did
  not arrive once each, in order (a token repeated or lost);
- resumes: `reissues` (the client's: its stream broke and ResumableAsk sent the Ask again;
  `reissue_to_token_s`, from the re-issue to the next new token, and `stall_s`, the wait the user
  saw between two tokens across it) and `continued` (the store's CONTINUED events: an answer
  continued after a break, by the orchestrator after a replica failed or by the one the client
  re-issued to; `continued_first_token_s` from the break to the continuation's first token,
  `tokens_recomputed`: the KV computed again for them, the prompt plus the tokens delivered less
  prefix-cache hits); each is charged to the latest fault that started before it.
Answers: every answered ask whose question and final documents match a reference ask of the
fault-free pass must have its answer (greedy fp32); asks whose documents differ (a retriever was
down, a deadline cut retrieval) are not comparable and are counted as such.
"""

from __future__ import annotations

import hashlib
import statistics
from collections import defaultdict

from load_tests.chaos.faults import FaultRecord
from load_tests.chaos.observers import LostEvents
from load_tests.chaos.workload import AskOutcome, CallOutcome, needs

LOSS_LEAD_S = 5.0             # an ask acknowledged this long before a fault may still lose writes to it
SETTLE_S = 10.0               # asks that start this long after a fault must succeed

TARGETS = {
    "failed_after_healthy": ("==", 0),
    "hung": ("==", 0),
    "max_recovery_s": ("<=", 15.0),
    "success_rate": (">=", 0.995),
    "failed_10s_after": ("==", 0),
    "crossed_differ": ("==", 0),
    "out_of_order": ("==", 0),
    "failures_outside_windows": ("==", 0),
    "lost_events": ("==", 0),
    "leaked_blocks": ("==", 0),
    "answers_differ": ("==", 0),
}


def overlaps(start: float, end: float, window: tuple[float, float | None], until: float) -> bool:
    lo, hi = window
    return start <= (hi if hi is not None else until) and end >= lo


def window_of(record: FaultRecord, until: float) -> tuple[float, float]:
    lo, hi = record.window
    return lo, hi if hi is not None else until


def blame(ask: AskOutcome, faults: list[FaultRecord], until: float) -> FaultRecord | None:
    """The fault a failed ask is charged to: of those whose window it overlaps, the latest to start
    before the ask ended (None: it overlaps none)."""
    overlapping = [f for f in faults if f.started is not None and f.started <= ask.end
                   and overlaps(ask.start, ask.end, window_of(f, until), until)]
    return max(overlapping, key=lambda f: f.started, default=None)


def degraded(ask: AskOutcome) -> bool:
    """Answered, but without the context of a retriever it asked for."""
    return ask.ok and not set(needs(ask.spec)) <= set(ask.retrieved_from)


def uses(ask: AskOutcome, target: str, replica_address: str | None) -> bool:
    if target in ("anns", "crawler"):
        return target in ask.retrieved_from
    return True


def expected_answers(reference: list[AskOutcome]) -> dict[tuple, set[str]]:
    """(question, documents) -> the fault-free pass's answers."""
    expected: dict[tuple, set[str]] = defaultdict(set)
    for ask in reference:
        if ask.ok:
            expected[(ask.spec.question, ask.sources)].add(ask.answer)
    return expected


def compare_answers(reference: list[AskOutcome], asks: list[AskOutcome]) -> dict:
    expected = expected_answers(reference)
    compared = differ = 0
    examples = []
    for ask in asks:
        key = (ask.spec.question, ask.sources)
        if not ask.ok or key not in expected:
            continue
        compared += 1
        if ask.answer not in expected[key]:
            differ += 1
            if len(examples) < 5:
                examples.append({"request_id": ask.request_id, "question": ask.spec.question,
                                 "retriever": ask.spec.retriever, "streamed": ask.spec.streamed,
                                 "answer": ask.answer, "reference": sorted(expected[key])})
    answered = sum(a.ok for a in asks)
    return {"compared": compared, "differ": differ, "not_comparable": answered - compared,
            "reference_asks": len(reference), "reference_failed": sum(not a.ok for a in reference),
            "reference_keys_with_several_answers": sum(len(v) > 1 for v in expected.values()),
            "examples": examples}


def charged_to(at: float, faults: list[FaultRecord]) -> FaultRecord | None:
    """The latest fault signalled at or before monotonic `at`."""
    return max((f for f in faults if f.started is not None and f.started <= at), key=lambda f: f.started,
               default=None)


def spread_s(values: list[float]) -> dict | None:
    return {"median": round(statistics.median(values), 2), "max": round(max(values), 2)} if values else None


def resume_figures(fault: FaultRecord, faults: list[FaultRecord], asks: list[AskOutcome],
                   continued: list[dict]) -> dict:
    """The fault's resumes: the clients' re-issues and the store's continuations charged to it."""
    reissues = [(a, r) for a in asks for r in a.reissues if charged_to(r.at, faults) is fault]
    mine = [c for c in continued if c["kind"] == "CONTINUED" and charged_to(c["at"], faults) is fault]
    waits = [float(c["first_token_s"]) for c in mine if "first_token_s" in c]
    recomputed = [int(c.get("tokens_computed", 0)) for c in mine]
    return {
        "reissues": len(reissues),
        "reissued_asks": len({a.request_id for a, _ in reissues}),
        "reissued_with_tokens": sum(r.tokens > 0 for _, r in reissues),
        "reissue_to_token_s": spread_s([r.token_after_s for _, r in reissues if r.token_after_s is not None]),
        "stall_s": spread_s([r.broke_after_s + r.token_after_s for _, r in reissues
                             if r.token_after_s is not None]),
        "continued": len(mine),
        "continued_after_tokens": sum(int(c.get("tokens", 0)) for c in mine),
        "continued_first_token_s": spread_s(waits),
        "tokens_recomputed": sum(recomputed),
        "tokens_recomputed_max": max(recomputed, default=0),
    }


def crossing(fault: FaultRecord, faults: list[FaultRecord], asks: list[AskOutcome],
             expected: dict[tuple, set[str]]) -> dict:
    """Answered asks the fault crossed (in flight at its signal, or re-issued because of it): equal to the
    fault-free pass's answer, other documents, and their tokens once each, in order."""
    lo = fault.started
    crossed = [a for a in asks if a.ok and (a.start <= lo <= a.end
                                           or any(charged_to(r.at, faults) is fault for r in a.reissues))]
    comparable = [a for a in crossed if (a.spec.question, a.sources) in expected]
    differ = [a for a in comparable if a.answer not in expected[(a.spec.question, a.sources)]]
    return {"crossed": len(crossed), "crossed_equal": len(comparable) - len(differ), "crossed_differ": len(differ),
            "crossed_not_comparable": len(crossed) - len(comparable),
            "out_of_order": sum(not a.tokens_in_order for a in crossed),
            "crossed_differ_examples": [a.request_id for a in differ[:3]]}


def fault_rows(faults: list[FaultRecord], asks: list[AskOutcome], calls: list[CallOutcome],
               lost: list[LostEvents], addresses: dict[str, str], t0: float, t_end: float,
               continued: list[dict] = (), reference: list[AskOutcome] = ()) -> list[dict]:
    rows = []
    windows = [window_of(f, t_end) for f in faults if f.started is not None]
    expected = expected_answers(list(reference))
    for i, fault in enumerate(faults):
        plan = fault.plan
        row = {"index": i, "action": plan.action, "target": plan.target, "at_s": round(plan.at_s, 1),
               "hit": fault.hit, "error": fault.error}
        if fault.started is not None:
            row["at_s"] = round(fault.started - t0, 1)          # later than planned after a slow recovery
        if fault.started is None:
            rows.append(row)
            continue
        lo, hi = window_of(fault, t_end)
        next_start = next((f.started for f in faults[i + 1:] if f.started is not None), t_end)
        mine = [a for a in asks if overlaps(a.start, a.end, (lo, hi), t_end)]
        failed = [a for a in mine if not a.ok and blame(a, faults, t_end) is fault]
        after = [a for a in asks if not a.ok and hi <= a.start < next_start
                 and not any(overlaps(a.start, a.end, w, t_end) for w in windows)]
        settled = [a for a in asks if not a.ok and lo + SETTLE_S <= a.start < next_start]
        replica = addresses.get(plan.target) if plan.target.startswith("inference") else None
        later = sorted((a for a in asks if a.ok and a.start >= lo), key=lambda a: a.start)
        first = next((a for a in later if uses(a, plan.target, replica)), None)
        reused = next((a for a in later if replica and a.replica == replica), None)
        row |= {
            "down_s": round(hi - lo, 2) if fault.healthy else None,
            "in_flight_at_signal": sum(a.start <= lo <= a.end for a in asks),
            "asks_in_window": len(mine),
            "failed": len(failed),
            "hung": sum(a.hung for a in failed),
            "failure_codes": dict(sorted(_count(a.code for a in failed).items())),
            "failed_after_healthy": len(after),
            "failed_10s_after": len(settled),
            "recovery_s": round(fault.probe_answered - lo, 2) if fault.probe_answered else None,
            "probe_start_s": round(fault.probe_ok - lo, 2) if fault.probe_ok else None,
            "users_recovery_s": round(first.start - lo, 2) if first else None,
            "degraded": sum(degraded(a) for a in mine),
            "lost_events": sum(x.count for x in lost if lo - LOSS_LEAD_S <= x.t_end <= hi),
            "session_failed": sum(not c.ok for c in calls if overlaps(c.start, c.end, (lo, hi), t_end)),
        }
        if replica:
            row["reused_s"] = round(reused.start - lo, 2) if reused else None
        row |= crossing(fault, faults, asks, expected) | resume_figures(fault, faults, asks, list(continued))
        row["examples"] = [{"at_s": round(a.start - t0, 1), "end_s": round(a.end - t0, 1), "code": a.code,
                            "retriever": a.spec.retriever, "streamed": a.spec.streamed, "tokens": a.tokens,
                            "reissues": len(a.reissues), "request_id": a.request_id, "detail": a.detail[:160]}
                           for a in {id(a): a for a in failed + after + settled}.values()][:6]
        rows.append(row)
    return rows


def _count(items) -> dict:
    counts: dict = defaultdict(int)
    for item in items:
        counts[item] += 1
    return counts


def summarize(asks: list[AskOutcome], calls: list[CallOutcome], faults: list[FaultRecord], lost: list[LostEvents],
              leaked: dict[str, dict[str, int]], answers: dict, addresses: dict[str, str], t0: float,
              t_end: float, settings: dict, continued: list[dict] = (), reference: list[AskOutcome] = ()) -> dict:
    rows = fault_rows(faults, asks, calls, lost, addresses, t0, t_end, continued, reference)
    windows = [window_of(f, t_end) for f in faults if f.started is not None]
    failed = [a for a in asks if not a.ok]
    outside = [a for a in failed if not any(overlaps(a.start, a.end, w, t_end) for w in windows)]
    recoveries = [r["recovery_s"] for r in rows if r.get("recovery_s") is not None]
    unrecovered = [r for r in rows if "failed" in r and r.get("recovery_s") is None]
    latencies = sorted(a.end - a.start for a in asks if a.ok)
    totals = {
        "asks": len(asks),
        "answered": len(asks) - len(failed),
        "failed": len(failed),
        "success_rate": round((len(asks) - len(failed)) / len(asks), 4) if asks else 0.0,
        "hung": sum(a.hung for a in failed),
        "failures_outside_windows": len(outside),
        "failed_after_healthy": sum(r.get("failed_after_healthy", 0) for r in rows),
        "failed_10s_after": sum(r.get("failed_10s_after", 0) for r in rows),
        "crossed": sum(r.get("crossed", 0) for r in rows),
        "crossed_differ": sum(r.get("crossed_differ", 0) for r in rows),
        "crossed_not_comparable": sum(r.get("crossed_not_comparable", 0) for r in rows),
        "out_of_order": sum(not a.tokens_in_order for a in asks),
        "reissues": sum(len(a.reissues) for a in asks),
        "continued": sum(c["kind"] == "CONTINUED" for c in continued),
        "tokens_recomputed": sum(int(c.get("tokens_computed", 0)) for c in continued if c["kind"] == "CONTINUED"),
        "max_recovery_s": None if unrecovered else max(recoveries, default=0.0),   # None: a fault never recovered
        "lost_events": sum(x.count for x in lost),
        "asks_with_lost_events": sum(x.count > 0 for x in lost),
        "records_unreadable": sum("unreadable" in x.missing for x in lost),
        "leaked_blocks": sum(max(0, n) for r in leaked.values() for n in r["held"].values())
        + sum(1 for r in leaked.values() if r["held"].get("unreadable") == -1),
        "answers_differ": answers["differ"],
        "degraded": sum(degraded(a) for a in asks),
        "session_calls": len(calls),
        "session_failed": sum(not c.ok for c in calls),
        "ask_latency_s": {"p50": round(statistics.median(latencies), 2) if latencies else None,
                          "max": round(latencies[-1], 2) if latencies else None},
    }
    targets = {name: {"value": totals[name], "target": f"{op} {bound}", "met": _met(totals[name], op, bound)}
               for name, (op, bound) in TARGETS.items()}
    return {"settings": settings, "totals": totals, "targets": targets, "faults": rows, "answers": answers,
            "leaked": leaked,
            "outside_windows": [{"at_s": round(a.start - t0, 1), "end_s": round(a.end - t0, 1), "code": a.code,
                                 "retriever": a.spec.retriever, "streamed": a.spec.streamed,
                                 "detail": a.detail[:200]} for a in outside[:20]],
            "asks": [ask_row(a, t0) for a in asks],
            "lost": [{"request_id": x.request_id, "end_s": round(x.t_end - t0, 1), "missing": x.missing,
                      "code": x.code}
                     for x in lost[:20]]}


def ask_row(a: AskOutcome, t0: float) -> dict:
    """One ask, for the raw rows (what was asked, when, how it ended, a digest of its documents and answer)."""
    return {"user": a.user, "start_s": round(a.start - t0, 2), "end_s": round(a.end - t0, 2), "ok": a.ok,
            "code": a.code, "question": a.spec.question[:40], "retriever": a.spec.retriever,
            "streamed": a.spec.streamed, "replica": a.replica, "retrieved_from": list(a.retrieved_from),
            "docs": digest("|".join(a.sources)), "answer": digest(a.answer), "request_id": a.request_id}


def digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def _met(value: float | None, op: str, bound: float) -> bool:
    if value is None:
        return False
    return {"==": value == bound, "<=": value <= bound, ">=": value >= bound}[op]


def print_report(report: dict, say=print) -> None:
    t = report["totals"]
    say(f"asks {t['asks']}: answered {t['answered']}, failed {t['failed']} (hung {t['hung']}, outside any fault "
        f"window {t['failures_outside_windows']}); success {t['success_rate']:.2%}; ask latency p50 "
        f"{t['ask_latency_s']['p50']} s, max {t['ask_latency_s']['max']} s")
    say(f"{'#':>2} {'fault':<20} {'at s':>6} {'down s':>7} {'in flight':>9} {'failed':>6} {'hung':>4} "
        f"{'after ok':>8} {'recovery s':>10} {'degraded':>8} {'lost ev':>7} {'session':>7}")
    for r in report["faults"]:
        if "failed" not in r:
            say(f"{r['index']:>2} {r['action'] + ' ' + r['target']:<20} {r['at_s']:>6} not inflicted: {r['error']}")
            continue
        say(f"{r['index']:>2} {r['action'] + ' ' + r['target']:<20} {r['at_s']:>6} {_s(r['down_s']):>7} "
            f"{r['in_flight_at_signal']:>9} {r['failed']:>6} {r['hung']:>4} {r['failed_after_healthy']:>8} "
            f"{_s(r['recovery_s']):>10} {r['degraded']:>8} {r['lost_events']:>7} {r['session_failed']:>7}")
    say(f"{'#':>2} {'fault':<20} {'failed 10s+':>11} {'crossed':>7} {'equal':>5} {'differ':>6} {'other docs':>10} "
        f"{'out of order':>12} {'re-issues':>9} {'to token s':>10} {'continued':>9} {'1st token s':>11} "
        f"{'recomputed':>10}")
    for r in report["faults"]:
        if "failed" in r:
            say(f"{r['index']:>2} {r['action'] + ' ' + r['target']:<20} {r['failed_10s_after']:>11} "
                f"{r['crossed']:>7} {r['crossed_equal']:>5} {r['crossed_differ']:>6} {r['crossed_not_comparable']:>10} "
                f"{r['out_of_order']:>12} {r['reissues']:>9} {_spread(r['reissue_to_token_s']):>10} "
                f"{r['continued']:>9} {_spread(r['continued_first_token_s']):>11} {r['tokens_recomputed']:>10}")
    a = report["answers"]
    say(f"answers: {a['compared']} compared with the fault-free pass, {a['differ']} differ, "
        f"{a['not_comparable']} not comparable (other documents)")
    say(f"answered without a retriever they asked for: {t['degraded']} asks")
    say(f"lost lifecycle events {t['lost_events']} (in {t['asks_with_lost_events']} asks); leaked blocks "
        f"{t['leaked_blocks']}; session calls {t['session_calls']}, failed {t['session_failed']}")
    for name, target in report["targets"].items():
        say(f"  {'met ' if target['met'] else 'MISS'} {name}: {target['value']} (target {target['target']})")


def _spread(value: dict | None) -> str:
    return "-" if value is None else f"{value['median']:.1f}/{value['max']:.1f}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
