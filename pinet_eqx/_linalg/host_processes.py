"""Worker processes for host solves whose Python work holds the GIL.

The host pool's threads (`host_solve.pool`) share the cores only while the
factorisations run: much of a sparse polish's work is many small numpy and
scipy steps, each holding the GIL, so two threads do little more than one
(measured: `benchmarks/dcopf/RESULTS.md`). Here each of `pool_size()` workers
is a Python process of its own, started once (`python -c`, not
`multiprocessing`: its spawn re-runs the user's main script unless guarded,
and forking a process that runs JAX can deadlock) and fed through two pipes.

A batch sends each worker its shared data once per content (a `context`, built
there by a module-level function), then one task per instance: a module-level
function (pickled by reference, as its module imports) applied to the
context and the instance's arguments. Instances start in the order given as
soon as the caller says they may (`ready`), so a task that waits on another's
result delays no other.

Where processes cannot run (no POSIX pipes, a worker that dies), the caller's
threads take over: `run` returns `False` and the workers are not tried again.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from .host_solve import FACTORISATIONS, pool_size

# Set to "0" to keep host solves in threads.
ENVIRONMENT = "PINET_EQX_HOST_PROCESSES"
# Contents kept per worker (a training run and its evaluation: two sets).
_KEPT = 4


class _Worker:
    """One worker process and its two pipes; the contents it holds."""

    def __init__(self):
        from_parent, to_child = os.pipe()  # (read end, write end)
        from_child, to_parent = os.pipe()
        package = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
        env = dict(os.environ, JAX_PLATFORMS="cpu")
        # One core each: the workers are the parallelism.
        for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[name] = "1"
        # This very package first, before `python -c`'s working directory (which
        # may hold another copy of it).
        code = (
            f"import sys; sys.path.insert(0, {package!r}); "
            f"from {__name__} import serve; serve({from_parent}, {to_parent})"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", code],
            pass_fds=(from_parent, to_parent),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        os.close(from_parent)
        os.close(to_parent)
        self.send = Connection(to_child, readable=False)
        self.receive = Connection(from_child, writable=False)
        self.held: list[bytes] = []

    def hold(self, key: bytes, build: Callable, arguments: tuple) -> None:
        """Sends `build(*arguments)`'s recipe under `key`, unless held."""
        if key in self.held:
            return
        self.send.send(("context", key, build, arguments))
        self.held.append(key)
        del self.held[:-_KEPT]

    def close(self) -> None:
        try:
            self.send.send(None)
        except OSError:
            pass
        self.process.wait(timeout=5)


_LOCK = threading.Lock()
_WORKERS: list[_Worker] = []
_BROKEN = False


def wanted(n: int) -> bool:
    """Whether a batch of `n` tasks runs on the workers: more than one core,
    POSIX, not switched off, and at least two tasks per worker (below that,
    threads lose little)."""
    workers = pool_size()
    return (
        not _BROKEN
        and workers > 1
        and os.name == "posix"
        and os.environ.get(ENVIRONMENT, "1") != "0"
        and n >= 2 * workers
    )


def run(
    n: int,
    key: bytes,
    context: tuple[Callable, tuple],
    task: Callable[[int], tuple[Callable, tuple]],
    ready: Callable[[int], bool],
    done: Callable[[int, Any], None],
) -> bool:
    """Runs tasks `0, ..., n - 1` on the workers; `False` (nothing done) where
    they cannot run or another batch holds them.

    **Arguments:**

    - `key`, `context`: the shared data's content key and `(build, arguments)`,
        built once per worker and key; each task's function receives it first.
    - `task(i)`: `(function, arguments)`, module-level and picklable.
    - `ready(i)`: whether task `i` may start (the tasks it needs are done).
    - `done(i, result)`: called in this thread as each result comes, in the
        order they come.

    An exception in a task is raised here.
    """
    global _BROKEN
    if not _LOCK.acquire(blocking=False):
        return False
    try:
        if not _WORKERS:
            _WORKERS.extend(_Worker() for _ in range(pool_size()))
            atexit.register(_shutdown)
        _schedule(n, key, context, task, ready, done)
        return True
    except (OSError, EOFError):
        # A worker died (or never started): threads from here on.
        _BROKEN = True
        _shutdown()
        return False
    except BaseException:
        _shutdown()  # the other workers' answers are not waited for
        raise
    finally:
        _LOCK.release()


def _schedule(n, key, context, task, ready, done) -> None:
    """Feeds the workers, the lowest ready task first, until all are done."""
    waiting = list(range(n))
    busy: dict[Connection, tuple[_Worker, int]] = {}
    free = list(_WORKERS)
    while waiting or busy:
        while free and waiting:
            i = next((i for i in waiting if ready(i)), None)
            if i is None:
                break
            waiting.remove(i)
            worker = free.pop()
            worker.hold(key, *context)
            function, arguments = task(i)
            worker.send.send(("task", key, function, arguments))
            busy[worker.receive] = (worker, i)
        if not busy:
            raise RuntimeError("A task waits on one that never runs.")
        for connection in wait(list(busy)):
            assert isinstance(connection, Connection)
            worker, i = busy.pop(connection)
            free.append(worker)
            failed, result, factorisations = connection.recv()
            FACTORISATIONS.add(factorisations)
            if failed:
                raise RuntimeError(f"Host worker failed on instance {i}:\n{result}")
            done(i, result)


def _shutdown() -> None:
    while _WORKERS:
        try:
            _WORKERS.pop().close()
        except (OSError, subprocess.TimeoutExpired):
            pass


def serve(read: int, write: int) -> None:
    """A worker's loop: contents kept by key, tasks answered in turn."""
    # Ctrl-C is the caller's to handle; the worker ends when its pipe closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    receive = Connection(read, writable=False)
    send = Connection(write, readable=False)
    held: dict[bytes, Any] = {}
    while True:
        try:
            message = receive.recv()
        except EOFError:
            return
        if message is None:
            return
        kind, key, function, arguments = message
        if kind == "context":
            held[key] = function(*arguments)
            while len(held) > _KEPT:
                held.pop(next(iter(held)))
            continue
        # The task's factorisations, added to the caller's count.
        FACTORISATIONS.reset()
        try:
            result = False, function(held[key], *arguments)
        except Exception:  # returned, and raised by the caller
            result = True, traceback.format_exc()
        send.send(result + (FACTORISATIONS.reset(),))
