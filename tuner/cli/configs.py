"""The registry's commands: ``tuner publish``, ``tuner lookup``, ``tuner recheck`` (tuner/best_configs/registry.py)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

console = Console()
err = Console(stderr=True)


def _pairs(items: list[str], what: str) -> dict[str, Any]:
    """``["m=8192", "precision=fp16"]`` -> ``{"m": 8192, "precision": "fp16"}``; SystemExit(2) on a bad item."""
    from tuner.best_configs.registry import parse_value

    out: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            err.print(f"[red]{what} are NAME=VALUE, got {item!r}[/red]")
            raise SystemExit(2)
        out[name] = parse_value(value)
    return out


def _print_answer(answer: dict[str, Any]) -> None:
    kind = "exact" if answer["exact"] else "nearest"
    console.print(
        f"{kind} entry {answer['id']}: {answer['workload']} {answer['shape']} {answer['fixed']} on {answer['gpu']} "
        f"({answer['status']}): {answer['objective']}={answer['value']:.4g} "
        f"[{answer['interval']['low']:.4g}, {answer['interval']['high']:.4g}] from {answer['study']} "
        f"trial {answer['trial']}"
    )
    if answer.get("function"):
        console.print(f"call: {answer['function']}(..., **{json.dumps(answer.get('kwargs') or {})})", soft_wrap=True)
    table = Table("entry", "distance", "shape", "status", answer["objective"], "config")
    for match in answer["matches"]:
        table.add_row(
            str(match["id"]),
            f"{match['distance']:.3g}",
            json.dumps(match["shape"]),
            match["status"],
            f"{match['value']:.4g}",
            json.dumps(match["config"]),
        )
    console.print(table)


def cmd_lookup(args: argparse.Namespace, open_db: Callable[..., Any]) -> int:
    from tuner.best_configs import answers
    from tuner.best_configs import registry as configs

    query = _pairs(args.shape, "shape args")
    if args.url:
        from tuner.client import ANY_GPU, ConfigNotFound, RegistryClient

        # as the local lookup below: no --gpu is any GPU's entries (the client's default is this machine's)
        client = RegistryClient(args.url, token=args.token, gpu=args.gpu or ANY_GPU)
        try:
            answer = client.lookup(args.workload, top=args.top, **query)
        except ConfigNotFound as exc:
            err.print(f"[red]{exc}[/red]")
            return 2
    else:
        from tuner.workloads.registry import UnknownWorkload, workload_class

        try:
            cls = workload_class(args.workload)
        except UnknownWorkload as exc:
            err.print(f"[red]{exc}[/red]")
            return 2
        shape = {name: query.pop(name) for name in cls.shape_args if name in query}
        db = open_db(args)
        try:
            found = configs.lookup(db, args.workload, shape, gpu=args.gpu, fixed=query or None, k=args.top)
        except configs.RegistryError as exc:
            err.print(f"[red]{exc}[/red]")
            return 2
        answer = answers.lookup_dict(found)
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        _print_answer(answer)
    return 0


def cmd_publish(args: argparse.Namespace, open_db: Callable[..., Any]) -> int:
    from tuner.best_configs import registry as configs

    db = open_db(args, write=True)
    try:
        done = configs.publish(db, args.study, args.trial)
    except configs.RegistryError as exc:
        err.print(f"[red]{exc}[/red]")
        return 2
    console.print(done.message)
    if done.unverified:
        console.print(f"entries {done.unverified} measured on other software are now unverified")
    return 0


def cmd_recheck(args: argparse.Namespace, open_db: Callable[..., Any]) -> int:
    from tuner.best_configs.recheck import recheck

    db = open_db(args, write=True)
    try:
        results = recheck(
            db,
            workload=args.workload,
            entry_ids=args.entry or None,
            rounds=args.rounds,
            args_override=_pairs(args.arg, "--arg values"),
        )
    except ValueError as exc:
        err.print(f"[red]{exc}[/red]")
        return 2
    table = Table("entry", "verdict", "was", "now", "note")
    for r in results:
        was = f"[{r.previous['low']:.4g}, {r.previous['high']:.4g}]" if r.previous else "-"
        now = f"[{r.interval['low']:.4g}, {r.interval['high']:.4g}]" if r.interval else "-"
        verdict = f"[red]{r.verdict}[/red]" if r.verdict == "regressed" else r.verdict
        table.add_row(str(r.entry_id), verdict, was, now, r.message)
    console.print(table if results else "no registry entry on this machine's device")
    return 1 if any(r.verdict == "regressed" for r in results) else 0


def add_parsers(sub: Any, add_db: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the registry's subcommands to the ``tuner`` parser (each sets ``registry_func``)."""
    publish = sub.add_parser("publish", help="publish a study's pick (or --trial N) to the best-config registry")
    publish.add_argument("study", help="name or id")
    publish.add_argument("--trial", type=int, default=None)
    add_db(publish)
    publish.set_defaults(registry_func=cmd_publish)

    lookup = sub.add_parser("lookup", help="the registry's best config at or near a shape")
    lookup.add_argument("workload")
    lookup.add_argument("shape", nargs="*", help="shape and fixed args as NAME=VALUE, e.g. m=8192 n=8192 k=4096")
    lookup.add_argument("--gpu", default=None, help="e.g. 'NVIDIA H200'; cpu; default: any GPU")
    lookup.add_argument("--top", type=int, default=1, help="nearest entries to list")
    lookup.add_argument("--json", action="store_true")
    lookup.add_argument("--url", default=None, help="ask a running server instead of the database")
    lookup.add_argument("--token", default=None)
    add_db(lookup)
    lookup.set_defaults(registry_func=cmd_lookup)

    check = sub.add_parser(
        "recheck", help="measure the registry's winners again on this machine; exit 1 when one regressed"
    )
    check.add_argument("--workload", default=None)
    check.add_argument("--entry", type=int, action="append", default=[], help="entry id (repeatable)")
    check.add_argument("--rounds", type=int, default=3)
    check.add_argument(
        "--arg", action="append", default=[], help="run-setting arg NAME=VALUE to measure with (e.g. noop's drift)"
    )
    add_db(check)
    check.set_defaults(registry_func=cmd_recheck)


def add_recheck_option(parser: argparse.ArgumentParser) -> None:
    """``--recheck-every`` of ``tuner serve`` and ``tuner worker``: the runner's scheduled recheck."""
    from tuner.run.jobs import parse_duration

    def duration(text: str) -> float:
        try:
            return parse_duration(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parser.add_argument(
        "--recheck-every",
        type=duration,
        default=None,
        metavar="DURATION",
        help="the runner measures the registry's winners again this often (e.g. 24h, 30m), between studies; "
        "default: never (run `tuner recheck` yourself)",
    )
