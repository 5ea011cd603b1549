"""The registered Flash question's answers as they arrive: a Subscribe read on a thread, the latest
`flash_ready` kept per data version, so the benchmark can wait for the one it just ingested."""

from __future__ import annotations

import threading
from typing import Any

from load_tests.sessions.client import SessionsClient


class FlashWatcher:
    """Subscribe on a thread: the latest flash_ready per data version."""

    def __init__(self, client: SessionsClient, session_id: str) -> None:
        from protos import sessions_pb2

        self.versions: dict[int, Any] = {}
        self.changed = threading.Condition()
        self.call = client.sessions.Subscribe(sessions_pb2.SubscribeRequest(session_id=session_id), timeout=7200)
        self.thread = threading.Thread(target=self._read, name="bench-flash-watch", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        import grpc

        try:
            for response in self.call:
                event = response.event
                if event.WhichOneof("kind") == "flash_ready":
                    with self.changed:
                        self.versions[event.flash_ready.data_version] = event.flash_ready
                        self.changed.notify_all()
        except grpc.RpcError:
            pass            # cancelled at the end

    def wait(self, version: int, timeout_s: float = 600.0) -> Any:
        with self.changed:
            if not self.changed.wait_for(lambda: version in self.versions, timeout_s):
                raise TimeoutError(f"no flash_ready for data version {version} after {timeout_s:.0f}s")
            return self.versions[version]

    def stop(self) -> None:
        self.call.cancel()
        self.thread.join(timeout=30)
