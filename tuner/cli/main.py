"""The ``tuner`` command line: run a study, look at studies and trials, export the winner."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tuner.cli.runner import cmd_worker, writable_db
from tuner.cli.serve import KEEP_ALIVE_S, cmd_serve

console = Console()
err = Console(stderr=True)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _shown(url: str) -> str:
    """A database URL as it may be printed: without its password."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: nothing to hide in it
        return url


def _db(args: argparse.Namespace, *, write: bool = False):
    """The study database. A command that writes migrates it to the newest schema first (and retries a
    database that is restarting); a read-only one changes nothing and says so when it cannot read."""
    from tuner.store.storage import StudyDB

    if write:
        return writable_db(args.db)
    db = StudyDB(args.db, retry_s=0.0)
    if db.url.startswith("sqlite:///") and not Path(db.url[len("sqlite:///") :]).exists():
        err.print(
            f"[red]no study database at {_shown(db.url)}[/red] (the default: $TUNER_DB_URL, else ./tuner.db in the "
            "current directory; another: --db URL)"
        )
        raise SystemExit(2)
    if not db.schema_is_current():
        err.print(f"[red]the study database {db.url} has an older schema: run `tuner db upgrade`[/red]")
        raise SystemExit(2)
    return db


def _find(db: Any, ref: str) -> Any:
    """The study ``ref`` names (name or id); otherwise exit 2 saying which database was searched and what it has."""
    row = db.find_study(ref)
    if row is None:
        rows = db.list_studies()
        names = ", ".join(f"{r.name} (id {r.id})" for r in rows[:20]) + (
            f", ... ({len(rows)} in all)" if len(rows) > 20 else ""
        )
        has = f"it has: {names}" if rows else "it has no study yet"
        err.print(
            f"[red]no study named or numbered {ref!r} in {_shown(db.url)}[/red]; {has}. "
            "Another database: --db URL or $TUNER_DB_URL"
        )
        raise SystemExit(2)
    return row


#: Seconds a `tuner run` lease lasts unrenewed: long enough for worker start-up (the orchestrator renews
#: it from its loop), short enough that a service runner resumes a crashed run's study soon after.
CLI_LEASE_S = 120.0


def cmd_run(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tuner.run.orchestrator import Orchestrator, StudyConflict, StudyFailed
    from tuner.store.storage import lease_owner_name

    compiled = _load_spec_or_say_why(args.spec)
    if compiled is None:
        return 2
    db = _db(args, write=True)
    spec = compiled.spec
    size = compiled.space.size()
    console.print(
        f"study [bold]{spec.name}[/bold]: workload {spec.workload}, {len(compiled.space.params)} params, "
        f"{size if size is not None else 'continuous'} points, budget {spec.budget.trials} trials, db {db.url}"
    )
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TextColumn("ETA {task.fields[eta]}"),
    )
    with Progress(*columns, console=console, transient=False, disable=args.quiet) as bar:
        task = bar.add_task(spec.name, total=spec.budget.trials, info="starting workers...", eta="-")

        def on_progress(p: Any) -> None:
            best = f"best {p.primary_metric} {_fmt(p.best_value)} (#{p.best_trial})" if p.best_value is not None else ""
            info = f"failed {p.failed}  statically infeasible {p.infeasible_static}  running {p.running}  {best}"
            eta = f"{p.eta_s:.0f}s" if p.eta_s is not None else "-"
            bar.update(task, completed=p.finished, info=info, eta=eta)

        orchestrator = Orchestrator(
            compiled,
            db,
            ray_address=args.ray_address,
            workers=args.workers,
            trials_per_worker=args.trials_per_worker,
            progress=on_progress,
            # Held while this command runs: a second `tuner run` or a service runner on the same
            # database is refused instead of running the same study twice.
            lease_owner=lease_owner_name("tuner run"),
            lease_s=CLI_LEASE_S,
        )
        try:
            summary = orchestrator.run()
        except StudyConflict as exc:
            err.print(f"[red]{exc}[/red]")
            return 2
        except StudyFailed as exc:
            err.print(f"[red]study failed: {exc}[/red]")
            return 1
    _print_run_summary(summary, compiled.objectives)
    return 0 if summary.status == "completed" else 1


def _load_spec_or_say_why(path: str) -> Any:
    """The compiled spec, or None after printing why it cannot be loaded."""
    from tuner.study.spec import SpecError, load_spec

    try:
        return load_spec(Path(path))
    except FileNotFoundError:
        err.print(f"[red]no such spec file: {path}[/red]")
    except SpecError as exc:
        _print_spec_errors(exc.errors)
    return None


def _print_spec_errors(errors: list[tuple[str, str]]) -> None:
    """``invalid spec:`` and one ``field: message`` line per error (never broken at the terminal's width)."""
    err.print("[red]invalid spec:[/red]")
    for field, message in errors:
        err.print(f"  {field or '(spec)'}: {message}", markup=False, highlight=False, soft_wrap=True)


def _answer_errors(response: Any) -> list[tuple[str, str]] | None:
    """A 422's ``detail`` as (field, message) pairs, the field without the ``body.`` of FastAPI's locations;
    None when the answer is not such a list."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return None
    if isinstance(detail, str):
        return [("", detail)]
    if not isinstance(detail, list) or not all(isinstance(e, dict) for e in detail):
        return None
    out = []
    for error in detail:
        loc = [str(part) for part in error.get("loc") or []]
        out.append((".".join(loc[1:] if loc[:1] == ["body"] else loc), str(error.get("msg", error))))
    return out


def _print_run_summary(summary: Any, objectives: list[tuple[str, str]]) -> None:
    counts = ", ".join(f"{k} {v}" for k, v in sorted(summary.counts.items()))
    console.print(f"study {summary.name} {summary.status} in {summary.elapsed_s:.1f} s: {counts}")
    if any(t.timing_comparable is False for t in summary.pareto):
        console.print(
            "[yellow]timings come from a CPU or the Triton interpreter: numerics are real, speeds are not "
            "comparable with GPU timings[/yellow]"
        )
    _print_front(summary.pareto, objectives, summary.best.number if summary.best else None)


def _print_front(front: list[Any], objectives: list[tuple[str, str]], chosen: int | None) -> None:
    if not front:
        console.print("[yellow]no feasible successful trial: no Pareto front[/yellow]")
        return
    table = Table(title="Pareto front" + (" (* = default pick)" if chosen is not None else ""))
    table.add_column("trial")
    for metric, direction in objectives:
        table.add_column(f"{metric} ({'max' if direction == 'maximize' else 'min'})", justify="right")
    table.add_column("params")
    for t in front:
        mark = "*" if t.number == chosen else ""
        params = " ".join(f"{k}={v}" for k, v in t.params.items())
        table.add_row(f"{t.number}{mark}", *[_fmt(t.metrics.get(m)) for m, _ in objectives], params)
    console.print(table)


def cmd_status(args: argparse.Namespace) -> int:
    from tuner.results.export import objectives_of
    from tuner.store.queries import study_view
    from tuner.store.storage import measured_count

    db = _db(args)
    table = Table(title=f"studies in {db.url}")
    for col in ("id", "name", "workload", "status", "trials", "failed", "best"):
        table.add_column(col)
    replaced: list[str] = []
    for row in db.list_studies():
        if row.proposal_counts:  # proposals the sampler replaced inside its proposal step (not trial rows)
            p = row.proposal_counts
            replaced.append(
                f"study {row.id} ({row.name}): {p.get('repeats_replaced', 0)} duplicate and "
                f"{p.get('static_rejected', 0)} statically infeasible proposals replaced before dispatch"
            )
        counts = db.status_counts(row.id)
        measured = measured_count(counts)
        failed = measured - counts.get("ok", 0)
        objectives = objectives_of(row)
        best = study_view(db, row).summary.best  # the pick the study's summary keeps
        best_text = "-"
        if best:
            best_text = f"{objectives[0][0]}={_fmt(best['metrics'].get(objectives[0][0]))} (#{best['trial']})"
        budget = row.spec.get("budget", {}).get("trials", "?")
        table.add_row(str(row.id), row.name, row.workload, row.status, f"{measured}/{budget}", str(failed), best_text)
    console.print(table)
    for line in replaced:
        console.print(line)
    return 0


def cmd_trials(args: argparse.Namespace) -> int:
    from tuner.results.export import objectives_of

    db = _db(args)
    row = _find(db, args.study)
    objectives = objectives_of(row)
    metric_names = [m for m, _ in objectives]
    table = Table(title=f"trials of {row.name}")
    for col in ("#", "status", *metric_names, "feasible", "worker", "params", "error"):
        table.add_column(col)
    for t in db.trials(row.id, status=args.status):
        error = (t.error or "").strip().splitlines()[-1:] if t.error else []
        table.add_row(
            str(t.number),
            t.status,
            *[_fmt(t.metrics.get(m)) for m in metric_names],
            _fmt(t.feasible),
            t.worker or "-",
            " ".join(f"{k}={v}" for k, v in t.params.items()),
            (error[0][:80] if error else ""),
        )
    console.print(table)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tuner.results.export import ExportError, export_document, render

    if args.url:
        with _client(args) as client:
            study = args.study
            if not study.isdigit():
                items = client.get("/api/studies", params={"limit": 500}).json()["items"]
                found = [s for s in items if s["name"] == study]
                if not found:
                    names = ", ".join(f"{s['name']} (id {s['id']})" for s in items[:20]) or "no study yet"
                    err.print(f"[red]no study named {study!r} on {args.url}[/red]; it has: {names}")
                    return 2
                study = str(found[0]["id"])
            params: dict[str, Any] = {"format": args.format}
            if args.trial is not None:
                params["trial"] = args.trial
            response = client.get(f"/api/studies/{study}/export", params=params)
            if response.status_code >= 400:
                err.print(f"[red]{response.status_code}[/red] {response.text}")
                return 2
            text = response.text
        return _emit(text, args.output)
    db = _db(args)
    row = _find(db, args.study)
    try:
        text = render(export_document(db, row, args.trial), args.format)
    except ExportError as exc:
        err.print(f"[red]{exc}[/red]")
        return 2
    return _emit(text, args.output)


def _emit(text: str, output: str | None) -> int:
    """Write an export to ``output`` (saying so on stderr) or to stdout; the command's exit code."""
    if output:
        Path(output).write_text(text)
        err.print(f"wrote {output}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_collective_table(args: argparse.Namespace) -> int:
    """The chosen NCCL setting per message-size range from several collective studies (one per size)."""
    from tuner.results.export import ExportError
    from tuner.workloads.registry import workload_class

    collective: Any = workload_class("collective")  # its table_from_db and render_table
    db = _db(args)
    try:
        rows = collective.table_from_db(db, args.studies or None)
    except ExportError as exc:
        err.print(f"[red]{exc}[/red]")
        return 2
    if not rows:
        err.print("[red]no collective study with a successful trial[/red]")
        return 2
    text = collective.render_table(rows, args.format)
    return _emit(text, args.output)


def cmd_workloads(args: argparse.Namespace) -> int:
    from tuner.study.space import compile_space, load_space_file
    from tuner.workloads.registry import workload_class, workload_names

    table = Table(title="workloads")
    for col in ("name", "metrics", "params", "space points", "description"):
        table.add_column(col)
    for name in workload_names():
        cls = workload_class(name)
        if not cls.space_file:  # replay: space and metrics come from the file its args name
            table.add_row(name, "from its file", "from its file", "-", cls.description)
            continue
        space = compile_space(load_space_file(cls.space_file))
        metrics = ", ".join(f"{m.name} ({m.direction[:3]})" for m in cls.metrics)
        table.add_row(name, metrics, ", ".join(space.params), _fmt(space.size()), cls.description)
    console.print(table)
    return 0


def add_max_studies(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-studies",
        type=_at_least_one,
        help="studies the runner runs at once, sharing its worker slots (default $TUNER_MAX_STUDIES, else 4)",
    )


def _at_least_one(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{raw!r}: expected a whole number >= 1")
    return value


def cmd_db(args: argparse.Namespace) -> int:
    """``tuner db upgrade``: migrate the study database to this version's schema (what writers do on start)."""
    from tuner.store.migrations import current, head
    from tuner.store.storage import StudyDB

    db = StudyDB(args.db)
    before = current(db.engine)
    db.create_tables()
    after = current(db.engine)
    if before == after:
        console.print(f"{db.url}: at revision {after} (the newest), nothing to do")
    else:
        console.print(f"{db.url}: upgraded from revision {before or '(none)'} to {after} (newest {head()})")
    db.dispose()
    return 0


def _client(args: argparse.Namespace):
    import os

    import httpx

    token = args.token or os.environ.get("TUNER_API_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=args.url.rstrip("/"), headers=headers, timeout=30)


def cmd_submit(args: argparse.Namespace) -> int:
    import time

    from tuner.study.spec import SpecError, parse_spec_text

    try:
        spec = parse_spec_text(Path(args.spec).read_text(), args.spec)
    except (FileNotFoundError, SpecError) as exc:
        err.print(f"[red]{exc}[/red]")
        return 2
    headers = {"Idempotency-Key": args.idempotency_key} if args.idempotency_key else {}
    with _client(args) as client:
        response = client.post("/api/studies", json=spec, headers=headers)
        errors = _answer_errors(response) if response.status_code == 422 else None
        if errors is not None:
            _print_spec_errors(errors)
            return 2
        if response.status_code >= 400:
            err.print(f"{response.status_code} {response.text}", markup=False, soft_wrap=True)
            return 2
        study = response.json()
        console.print(
            f"study {study['name']} (id {study['id']}) {study['status']}: {args.url.rstrip('/')}"
            f"{study['dashboard_url']}"
        )
        while args.wait:
            current = client.get(study["url"]).json()
            console.print(f"  {current['status']}: {current['measured']}/{current['budget_trials']} trials")
            if current["status"] in ("completed", "stopped", "failed"):
                return 0 if current["status"] == "completed" else 1
            time.sleep(2)
    return 0


def _trial_statuses() -> list[str]:
    from tuner.workloads.base import TrialStatus

    return [*(s.value for s in TrialStatus), "running"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuner", description="Autotune GPU performance knobs.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_study_commands(sub)
    _add_service_commands(sub)
    from tuner.cli.configs import add_parsers

    add_parsers(sub, _add_db)  # publish, lookup, recheck: the best-config registry
    return parser


def _add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help="database URL or SQLite path (default: $TUNER_DB_URL or ./tuner.db)")


def _add_study_commands(sub: Any) -> None:
    """``run``, ``status``, ``trials``, ``export``, ``collective-table``: one study database, no server."""
    add_db = _add_db
    run = sub.add_parser("run", help="run (or resume) a study from a YAML/JSON spec")
    run.add_argument("spec")
    add_db(run)
    run.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one")
    run.add_argument("--workers", type=int, help="number of worker actors (default: one per GPU, or 2 on CPU)")
    run.add_argument("--trials-per-worker", type=int, help="trials in flight per worker (default 2 on GPU)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=cmd_run)

    status = sub.add_parser("status", help="list studies")
    add_db(status)
    status.set_defaults(func=cmd_status)

    trials = sub.add_parser("trials", help="list a study's trials")
    trials.add_argument("study", help="study name or id")
    trials.add_argument("--status", choices=_trial_statuses(), help="only trials with this status")
    add_db(trials)
    trials.set_defaults(func=cmd_trials)

    export = sub.add_parser("export", help="export the chosen config")
    export.add_argument("study", help="study name or id")
    export.add_argument("--format", choices=["json", "yaml", "env", "python"], default="json")
    export.add_argument("--trial", type=int, help="export this trial instead of the default pick")
    export.add_argument("-o", "--output", help="write to a file instead of stdout")
    export.add_argument("--url", help="ask this running server instead of opening the database")
    export.add_argument("--token", help="bearer token (default: $TUNER_API_TOKEN)")
    add_db(export)
    export.set_defaults(func=cmd_export)

    table = sub.add_parser(
        "collective-table", help="NCCL settings per message-size range from collective studies (one per size)"
    )
    table.add_argument("studies", nargs="*", help="study names (default: every collective study in the database)")
    table.add_argument(
        "--format",
        choices=["json", "csv"],
        default="json",
        help="csv: the nccl_tuner.conf of NCCL's example tuner plugin",
    )
    table.add_argument("-o", "--output", help="write to a file instead of stdout")
    add_db(table)
    table.set_defaults(func=cmd_collective_table)


def _add_service_commands(sub: Any) -> None:
    """``serve``, ``worker``, ``db``, ``submit``, ``workloads``: the service, its database and its clients."""
    add_db = _add_db
    serve = sub.add_parser("serve", help="run the REST API and dashboard, with a study runner beside it")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    add_db(serve)
    serve.add_argument("--ray-address", help="the runner joins this Ray cluster")
    serve.add_argument("--workers", type=int, help="worker actors per study (default: one per GPU, 2 on CPU)")
    add_max_studies(serve)
    serve.add_argument("--no-runner", action="store_true", help="API only; run `tuner worker` elsewhere")
    serve.add_argument("--log-level", default="warning")
    serve.add_argument(
        "--keep-alive-s",
        type=int,
        default=KEEP_ALIVE_S,
        help=f"how long an idle HTTP connection is kept open (default {KEEP_ALIVE_S} s)",
    )
    from tuner.cli.configs import add_recheck_option

    add_recheck_option(serve)
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="claim queued studies from the database and run them")
    add_db(worker)
    worker.add_argument("--ray-address")
    worker.add_argument("--workers", type=int)
    add_max_studies(worker)
    worker.add_argument("--watch-parent", type=int, metavar="PID", help="stop when process PID (its parent) is gone")
    add_recheck_option(worker)
    worker.set_defaults(func=cmd_worker)

    database = sub.add_parser("db", help="the study database's schema")
    database.add_argument("action", choices=["upgrade"], help="upgrade: migrate to this version's schema")
    add_db(database)
    database.set_defaults(func=cmd_db)

    submit = sub.add_parser("submit", help="submit a spec to a running server")
    submit.add_argument("spec")
    submit.add_argument("--url", default="http://127.0.0.1:8000")
    submit.add_argument("--token", help="bearer token (default: $TUNER_API_TOKEN)")
    submit.add_argument("--idempotency-key", help="a retried submit with the same key returns the same study")
    submit.add_argument("--wait", action="store_true", help="follow the study until it ends")
    submit.set_defaults(func=cmd_submit)

    workloads = sub.add_parser("workloads", help="list workloads, their metrics and spaces")
    workloads.set_defaults(func=cmd_workloads)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "registry_func", None) is not None:
        return int(args.registry_func(args, _db) or 0)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
