"""Worker for the API server crash test: forks embedded API servers on one data file.

``python -m tests.reliability._apiserver_worker DATA_FILE COMPACT_BYTES`` imports the
server once, then for every ``spawn`` line on stdin forks a child that serves like
``drahealth apiserver --data DATA_FILE`` (with a small compaction threshold, so kills
also land in snapshot writes and log rotations) and prints ``ready <pid> <url>``. The
parent kills that child with SIGKILL and sends ``reap <pid>``; ``dead <pid>`` comes back
once it is gone. Forking from a warm process keeps each of the hundreds of restarts
cheap; each child is still a separate process with its own descriptors and memory.
"""

from __future__ import annotations

import asyncio
import os
import sys

from drahealth.controlplane import APIServer


async def serve(data: str, compact_bytes: int) -> None:
    server = APIServer(data_file=data)
    server.persist_compact_bytes = compact_bytes
    await server.start()
    print(f"ready {os.getpid()} {server.url}", flush=True)
    await asyncio.Event().wait()


def main(data: str, compact_bytes: int) -> None:
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "spawn":
            pid = os.fork()
            if pid == 0:
                try:
                    asyncio.run(serve(data, compact_bytes))
                except BaseException as e:  # report, then leave at once
                    print(f"failed {os.getpid()} {type(e).__name__}: {e}", flush=True)
                finally:
                    os._exit(1)
        elif cmd == "reap":
            os.waitpid(int(args[0]), 0)
            print(f"dead {args[0]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
