"""``tuner serve``'s runner, supervised: started beside the API, restarted when it dies, and told to go
when the server goes.

The runner is a child process (``tuner worker --watch-parent``) in its own session, so a Ctrl-C of the
server reaches it only through the server's graceful stop. A runner that dies (a SIGKILL, an OOM kill,
a crash) is started again after a backoff that doubles from 1 s to 30 s and resets once a runner has
stayed up for a minute; its study's lease lapses and the new runner takes the study over. What a dead
runner leaves behind in its session (its local Ray's agents and worker actors, which would otherwise
live on for a minute or more, a trial still running on a GPU among them) is killed as soon as it is
reaped. A runner whose server died notices its parent is gone and stops (``watch_parent``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("tuner.run.supervisor")
BACKOFF_S = (1.0, 30.0)  # first and largest wait before a restart
STABLE_S = 60.0  # a runner up this long resets the backoff
#: Variables the runner, its local Ray and every trial process go without: the API's bearer token (trial
#: code is the workloads' and the user's; none of it talks to the API).
SECRET_ENV = ("TUNER_API_TOKEN",)


def without_secrets(env: dict[str, str]) -> dict[str, str]:
    """``env`` less :data:`SECRET_ENV`."""
    return {k: v for k, v in env.items() if k not in SECRET_ENV}


class RunnerSupervisor:
    """Keeps one runner process alive until :meth:`stop`. ``state``: ``running``, ``restarting`` or
    ``stopped``; ``restarts``: how many times a dead runner was started again."""

    def __init__(self, command: Sequence[str], *, stop_timeout_s: float = 60.0) -> None:
        self.command = list(command)
        self.stop_timeout_s = stop_timeout_s
        self.state = "stopped"
        self.restarts = 0
        self.process: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.process = self._spawn()
        self._thread = threading.Thread(target=self._watch, name="runner-supervisor", daemon=True)
        self._thread.start()

    def _spawn(self) -> subprocess.Popen:
        process = subprocess.Popen(self.command, start_new_session=True, env=without_secrets(dict(os.environ)))
        self.state = "running"
        log.info("runner started (pid %s)", process.pid)
        return process

    def _watch(self) -> None:
        wait_s = BACKOFF_S[0]
        while not self._stopping.is_set():
            assert self.process is not None
            started = time.monotonic()
            code = self.process.wait()  # also reaps it: no <defunct> runner
            left = kill_session(self.process.pid)
            if self._stopping.is_set():
                break
            if time.monotonic() - started >= STABLE_S:
                wait_s = BACKOFF_S[0]
            self.state = "restarting"
            log.warning(
                "runner (pid %s) exited with status %s; starting another in %.0f s", self.process.pid, code, wait_s
            )
            if left:
                log.warning("killed %d process(es) the runner (pid %s) left behind", left, self.process.pid)
            if self._stopping.wait(wait_s):
                break
            self.restarts += 1
            self.process = self._spawn()
            wait_s = min(wait_s * 2, BACKOFF_S[1])
        self.state = "stopped"

    def stop(self) -> None:
        """Stop the runner gracefully (SIGTERM: its trials in flight finish, its study is queued again);
        after ``stop_timeout_s`` its whole process group is killed."""
        self._stopping.set()
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if process is not None:
            kill_session(process.pid)
        self.state = "stopped"


def kill_session(leader: int) -> int:
    """SIGKILL every process still in the session (and process group) that the exited process ``leader``
    led; returns how many were signalled. The runner starts its session, so everything its local Ray
    started is in it (Ray's workers get process groups of their own, hence the session). A pid stays
    reserved while a session or group of that id has members, so nothing else is hit."""
    victims = set()
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, session, ...
        if fields[0] != "Z" and leader in (int(fields[2]), int(fields[3])):
            victims.add(int(entry.name))
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:  # where there is no /proc: the process group at least
        os.killpg(leader, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return len(victims)


def watch_parent(parent: int, on_orphaned: Callable[[], None], every_s: float = 1.0) -> threading.Thread:
    """Call ``on_orphaned`` once this process's parent, ``parent`` (a pid), is no longer its parent (it
    died and this process was re-parented), from a daemon thread polling every ``every_s`` seconds. For
    a runner a server started: the server's death ends it, even one that came before this call."""

    def poll() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        log.warning("the server that started this runner (pid %s) is gone; stopping", parent)
        on_orphaned()

    thread = threading.Thread(target=poll, name="parent-watch", daemon=True)
    thread.start()
    return thread


@dataclass(frozen=True)
class Served:
    """What ``tuner serve`` hands the app it serves in its own process (uvicorn builds that app from an
    import string, so tuner never imports the API): the bound host, the database and the supervised runner."""

    host: str
    db_url: str
    runner: RunnerSupervisor | None = None


_served: list[Served] = []


def hand_to_app(served: Served) -> None:
    """Keep what ``tuner serve`` hands the app it is about to build (:func:`served`)."""
    _served[:] = [served]


def served() -> Served:
    """What ``tuner serve`` handed over in this process; LookupError outside the command."""
    if not _served:
        raise LookupError("no `tuner serve` in this process")
    return _served[0]
