"""The local stack as processes: `plan` (what runs where), `processes` (start, watch, stop),
`state` (the run directory), `addresses` (where the other commands find its services),
`supervisor` (a service that dies is started again), `tls` (`--tls-dir`: the stack's certificates)
and `commands` (`up`, `status`, `down`).

`up(StackOptions(...))` starts it from Python; `read_stack()` finds a running one.
"""

from streamrag.stack.commands import up
from streamrag.stack.plan import StackOptions
from streamrag.stack.state import read_stack

__all__ = ["StackOptions", "read_stack", "up"]
