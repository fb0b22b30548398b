"""``tuner worker``: the study runner process (what ``tuner serve`` starts beside the API, or one run on
another machine): it claims queued studies from the database and runs them, and stops gracefully (trials
in flight finish, the study is queued again) on SIGTERM, Ctrl-C or the end of its parent."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn


def writable_db(url: str | None) -> Any:
    """The study database for a command that writes: migrated to the newest schema first (retrying a
    database that is restarting)."""
    from tuner.store.storage import RUNNER_RETRY_S, StudyDB

    db = StudyDB(url, retry_s=RUNNER_RETRY_S)
    db.create_tables()
    return db


def cmd_worker(args: argparse.Namespace) -> int:
    """Claim queued studies from the database and run them (what ``tuner serve`` starts beside the API)."""
    import logging
    import signal
    import threading

    from tuner.run.orchestrator import ensure_ray
    from tuner.run.service import StudyRunner

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    runner = StudyRunner(
        writable_db(args.db),
        ray_address=args.ray_address,
        workers=args.workers,
        recheck_every_s=args.recheck_every,
        max_studies=args.max_studies,
    )
    ensure_ray(args.ray_address, min_cpus=args.workers or 2)
    finishing = threading.Event()
    watcher = threading.Thread(target=_watch_ray, args=(runner, finishing), name="ray-watch", daemon=True)

    def stop(*_: object) -> None:
        # A graceful stop: trials in flight finish, and the study is queued again for the next runner.
        runner.stop()
        if watcher.ident is None:  # started once, by the first stop
            watcher.start()

    if args.watch_parent:  # started by `tuner serve`: a server that dies takes its runner with it
        from tuner.run.supervisor import watch_parent

        watch_parent(args.watch_parent, stop)
    # After Ray's own handler: SIGTERM stops the runner instead of exiting in the middle of the loop.
    signal.signal(signal.SIGTERM, stop)
    try:
        runner.run_forever()
    except KeyboardInterrupt:
        stop()
    finishing.set()
    runner.db.dispose()
    _exit_after_ray_shutdown(RAY_SHUTDOWN_S)


def _watch_ray(runner: Any, finishing: Any, every_s: float = 0.5) -> None:
    """While a runner stops, hand its study back and exit if Ray's control store goes away.

    A signal sent to the runner's whole process group (Ctrl-C, a service manager) reaches its local
    Ray's processes too. Without the control store every Ray call blocks, and after 60 s Ray aborts
    the process; the study would stay leased to a dead runner until the lease lapses.
    """
    import logging
    import socket

    import ray

    host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
    while not finishing.wait(every_s):
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
        except OSError:
            if finishing.is_set():
                return
            logging.getLogger("tuner.run.service").warning("Ray's control store is gone; not waiting for trials")
            runner.hand_back()
            _exit_now()


def _exit_now() -> NoReturn:
    import logging
    import os

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


#: How long a stopping runner waits for Ray's shutdown before it exits anyway.
RAY_SHUTDOWN_S = 15.0


def _exit_after_ray_shutdown(timeout_s: float) -> NoReturn:
    """Shut Ray down within ``timeout_s`` seconds, then exit with status 0.

    A runner stopped with its whole process group (Ctrl-C) loses its local Ray's processes at the
    same moment; Ray's shutdown, and its exit hook, may then wait on them, and after 60 s without
    its control store Ray aborts the process with status 1. By now every result and the study's
    state are in the database, so nothing is lost by not waiting.
    """
    import threading

    import ray

    done = threading.Thread(target=ray.shutdown, daemon=True)
    done.start()
    done.join(timeout_s)
    _exit_now()
