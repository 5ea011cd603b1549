"""What the benchmark's sessions hold and are asked: the instructions, the questions, the Flash
question (with case and spacing variants that must hit its cache) and an endless synthetic server
log, deterministic per seed, cut into segments counted in the engine's tokens."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

INSTRUCTIONS = ("You are monitoring the server log in the data below. Answer the question about it "
                "briefly, quoting the host, time or status code that answers it.")
QUESTIONS = (
    "Which host logged the most errors?",
    "What was the last HTTP status code returned by web-2?",
    "Did the database report replication lag above 5 seconds?",
    "Which endpoint was the slowest request made to?",
    "When did cache-1 last restart?",
    "How many requests failed with status 503?",
    "Which user logged in most recently?",
    "Was any disk more than 90% full?",
    "Which deploy version is web-3 running?",
    "What is the first warning in the log?",
    "Did any host run out of memory?",
    "Which queue had the longest backlog?",
)
FLASH_QUESTION = "Is any host reporting errors right now?"
FLASH_VARIANTS = (FLASH_QUESTION, "is any host reporting errors right now?",
                  "  Is any host  reporting errors right now? ", "IS ANY HOST REPORTING ERRORS RIGHT NOW?")
SEGMENT_LINES = 4               # log lines per data segment (about 150 tokens)

HOSTS = ("web-1", "web-2", "web-3", "api-1", "api-2", "db-1", "db-2", "cache-1", "queue-1", "auth-1")
PATHS = ("/api/orders", "/api/orders/{n}", "/api/users/{n}", "/api/cart", "/api/search?q=item{n}", "/login",
         "/api/payments", "/static/app.{n}.js", "/healthz", "/api/inventory/{n}")
USERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy")


def log_lines(rng: random.Random) -> Iterator[str]:
    """An endless, deterministic (per `rng`) server log: requests, warnings, errors, events."""
    t = 9 * 3600 + rng.randrange(3600)
    while True:
        t += rng.randrange(1, 9)
        stamp = f"2026-11-23T{t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d}Z"
        host = rng.choice(HOSTS)
        roll = rng.random()
        if roll < 0.62:
            path = rng.choice(PATHS).format(n=rng.randrange(1, 5000))
            status = rng.choices((200, 201, 204, 301, 404, 500, 503), (60, 8, 5, 3, 8, 2, 2))[0]
            level = "INFO" if status < 500 else "ERROR"
            yield (f"{stamp} {host} {level} {rng.choice(('GET', 'GET', 'POST', 'PUT'))} {path} {status} "
                   f"{rng.randrange(2, 900)}ms")
        elif roll < 0.74:
            address = f"10.0.{rng.randrange(256)}.{rng.randrange(256)}"
            yield f"{stamp} {host} INFO user {rng.choice(USERS)} logged in from {address}"
        elif roll < 0.84:
            yield rng.choice((
                f"{stamp} {host} WARN disk /var usage {rng.randrange(60, 99)}%",
                f"{stamp} {host} WARN replication lag {rng.randrange(1, 12)} s",
                f"{stamp} {host} WARN queue jobs backlog {rng.randrange(10, 5000)}",
                f"{stamp} {host} WARN memory usage {rng.randrange(70, 99)}%",
            ))
        elif roll < 0.92:
            yield rng.choice((
                f"{stamp} {host} ERROR upstream timeout after {rng.randrange(1, 30)} s",
                f"{stamp} {host} ERROR connection refused to db-{rng.randrange(1, 3)}:5432",
                f"{stamp} {host} ERROR out of memory: killed worker {rng.randrange(1, 64)}",
            ))
        else:
            yield rng.choice((
                f"{stamp} {host} INFO deploy version 2.{rng.randrange(3, 9)}.{rng.randrange(20)} started",
                f"{stamp} {host} INFO service restarted",
                f"{stamp} {host} INFO health check ok",
                f"{stamp} {host} INFO config reloaded",
            ))


class LogFeed:
    """Segments of `SEGMENT_LINES` log lines, counted in the engine's tokens."""

    def __init__(self, seed: int, count_tokens: Callable[[str], int]) -> None:
        self.lines = log_lines(random.Random(seed))
        self.count_tokens = count_tokens

    def take(self, tokens: int) -> list[tuple[str, int]]:
        """Segments (text, tokens) adding up to about `tokens` (at least one)."""
        out: list[tuple[str, int]] = []
        total = 0
        while not out or total < tokens:
            text = "\n".join(next(self.lines) for _ in range(SEGMENT_LINES)) + "\n"
            n = self.count_tokens(text)
            if out and total + n > tokens + n // 2:      # the nearest total, not always above
                break
            out.append((text, n))
            total += n
        return out
