"""``tuner serve``: the API (named for uvicorn as an import string: tuner never imports the API) with its supervised
study runner, and the report of what a stopped server stopped."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console

console = Console()
err = Console(stderr=True)


#: How long ``tuner serve`` lets its runner finish the trials in flight before it kills it.
RUNNER_STOP_S = 60.0
#: How long ``tuner serve`` keeps an idle HTTP connection open. Longer than clients keep theirs (httpx,
#: browsers: 5-60 s; proxies such as a load balancer's 60 s idle timeout): at uvicorn's 5 s, equal to
#: httpx's expiry, a client reusing a connection just as the server closed it got a reset or an empty
#: answer, the more often the more loaded the machine.
KEEP_ALIVE_S = 75


#: The app ``tuner serve`` serves, named for uvicorn as an import string (a factory): tuner never imports the API.
APP_FACTORY = "api.main:served_app"


def cmd_serve(args: argparse.Namespace) -> int:
    import os
    import signal

    import uvicorn

    from tuner.run.supervisor import RunnerSupervisor, Served, hand_to_app
    from tuner.store.storage import StudyDB, resolve_url

    db_url = resolve_url(args.db)
    supervisor = None
    if not args.no_runner:
        cmd = [sys.executable, "-m", "tuner.cli", "worker", "--db", db_url, "--watch-parent", str(os.getpid())]
        if args.ray_address:
            cmd += ["--ray-address", args.ray_address]
        if args.workers:
            cmd += ["--workers", str(args.workers)]
        if args.max_studies:
            cmd += ["--max-studies", str(args.max_studies)]
        if args.recheck_every:
            cmd += ["--recheck-every", f"{args.recheck_every:g}"]
        supervisor = RunnerSupervisor(cmd, stop_timeout_s=RUNNER_STOP_S)
    hand_to_app(Served(host=args.host, db_url=db_url, runner=supervisor))  # /healthz reports the runner's state
    config = uvicorn.Config(
        APP_FACTORY,
        factory=True,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_keep_alive=args.keep_alive_s,
    )
    config.load()  # the app now: the settings' refusals and the migrations come before the runner starts
    if supervisor is not None:
        supervisor.start()
    console.print(f"dashboard: http://{args.host}:{args.port}/   API docs: http://{args.host}:{args.port}/docs")
    # uvicorn re-raises the SIGTERM it caught once it has shut down; exit through `finally` then, so the
    # runner is stopped too rather than left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = uvicorn.Server(config)
    try:
        try:
            server.run()
        except KeyboardInterrupt:
            pass
        if not server.started:
            raise SystemExit(3)  # as uvicorn.run: the server did not start (the port taken, ...)
    finally:
        report_db = StudyDB(db_url)  # the served app's database, opened here: tuner never imports the API
        running = _running_studies(report_db)
        if supervisor is not None:
            # The runner alone: it lets its trials in flight finish, then shuts its Ray down itself.
            supervisor.stop()
        for line in shutdown_report(report_db, running, f"http://{args.host}:{args.port}/", supervisor is not None):
            err.print(line, markup=False, highlight=False, soft_wrap=True)
    return 0


def _running_studies(db: Any) -> list[int]:
    return [row.id for row in _listed(db) if row.status == "running"]


def shutdown_report(db: Any, running: list[int], url: str, had_runner: bool) -> list[str]:
    """What a stopped ``tuner serve`` stopped, and where each study it was running went (back to the queue,
    with its trials measured so far), for the terminal it ran in."""
    from tuner.store.schema import measured_count

    lines = [f"stopped: the service on {url}" + (" and its study runner" if had_runner else "")]
    for study_id in running:
        try:
            row = db.get_study(study_id)
            measured = measured_count(db.status_counts(study_id))
        except Exception as exc:  # the database is gone: say so rather than nothing
            lines.append(f"  study {study_id}: its state could not be read ({exc})")
            continue
        if row is None:
            continue
        budget = (row.spec or {}).get("budget", {}).get("trials")
        progress = f"{measured}/{budget}" if budget else f"{measured}"
        where = "went back to the queue" if row.status == "queued" else f"is {row.status}"
        lines.append(f"  study {row.name} (id {row.id}) {where} at {progress} trials")
    queued = [row for row in _listed(db) if row.status == "queued"]
    if queued:
        names = ", ".join(row.name for row in queued[:5]) + (", ..." if len(queued) > 5 else "")
        lines.append(f"  queued: {len(queued)} ({names}); the next `tuner serve` on this database resumes them")
    elif not running:
        lines.append("  no study was running or queued")
    return lines


def _listed(db: Any) -> list[Any]:
    try:
        return db.list_studies()
    except Exception:  # the database is gone: the report says nothing of its studies then
        return []
