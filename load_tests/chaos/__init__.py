"""`streamrag bench chaos`: a soak of asks and faults together.

Users ask questions against a running stack (mixed retrievers, streamed and not) while a session
ingests, and a schedule kills or freezes one service at a time and lets the supervisor (or
compose's restart policy) bring it back. The report says, per fault, which asks failed, which
hung past their deadline, how long until asks succeeded again, and, after the load drains,
whether the lifecycle store lost acknowledged events, whether any KV block leaked, and whether
the answers equal those of a fault-free pass.

    workload    the question set, users (the load generator) and the ingesting session
    faults      the fault schedule and the two ways to inflict it (local processes, compose)
    stacks      where the stack's services are: `streamrag up`'s run directory, or compose
    observers   the checks after the load: leaked blocks, lost lifecycle events
    report      failures attributed to fault windows, per-fault rows, the targets, JSON
    run         the command: start or attach, reference pass, soak, drain, checks, report
"""
