"""The user's side of streamrag: the `streamrag` CLI, `ask`, `demo` and the local stack.

It may import every other package; none imports it.
"""
