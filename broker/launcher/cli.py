"""`tandem`: the launcher- and operator-side command line over the client: submit, get, list, watch, cancel,
clusters, cordon; usage (and its GPU-hour export as CSV), requeue, priority, hold, release."""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import grpc

from broker.launcher.client import BrokerClient, SubmitItem, status_details
from broker.launcher.jobfile import default_key, load_job_file, parse_duration, to_spec
from tandem.v1 import cluster_service_pb2 as cs
from tandem.v1 import job_pb2
from tandem.v1 import job_service_pb2 as svc

__all__ = ["main", "build_parser", "parse_time"]


def _connection_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """Where and how to reach the broker. Accepted before or after the subcommand
    (`tandem --broker X clusters` and `tandem clusters --broker X`); the subcommand's copy
    has no defaults, so it only overrides what it is given."""

    def default(value: str | None) -> str | None:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--broker",
        default=default(os.environ.get("TANDEM_BROKER", "127.0.0.1:50051")),
        help="broker HOST:PORT (env TANDEM_BROKER)",
    )
    parser.add_argument(
        "--token", default=default(os.environ.get("TANDEM_TOKEN")), help="bearer token (env TANDEM_TOKEN)"
    )
    parser.add_argument("--ca", default=default(os.environ.get("TANDEM_CA")), help="CA certificate (PEM) to use TLS")
    parser.add_argument("--server-name", default=default(None), help="TLS server name override")


def parse_time(text: str, now: float | None = None) -> float:
    """A point in time for --since / --until: seconds since the epoch ("1767225600"), an ISO 8601 date or time
    ("2026-01-01", "2026-01-01T12:00:00Z"; UTC unless it names an offset), or a duration ago ("24h", "7d")."""
    t = text.strip()
    try:
        return float(t)
    except ValueError:
        pass
    try:
        return (time.time() if now is None else now) - parse_duration(t)
    except ValueError:
        pass
    try:
        when = datetime.datetime.fromisoformat(t[:-1] + "+00:00" if t[-1:] in ("Z", "z") else t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (use epoch seconds, an ISO 8601 date/time, or a duration ago such as 24h)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tandem", description="Submit and follow GPU jobs on a Tandem broker.")
    _connection_options(p, defaults=True)
    connection = argparse.ArgumentParser(add_help=False)
    _connection_options(connection, defaults=False)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("submit", parents=[connection], help="submit a job file")
    s.add_argument("-f", "--file", required=True, help="YAML job file")
    s.add_argument("--dry-run", action="store_true", help="validate only (nothing is stored)")
    s.add_argument("--key", help="idempotency key (default: derived from the file)")
    g = sub.add_parser("get", parents=[connection], help="one job: attempts, queue position, why it waits")
    g.add_argument("job_id")
    ls = sub.add_parser("list", parents=[connection], help="jobs")
    ls.add_argument("--job-set", default="")
    ls.add_argument("--state", action="append", default=[], help="e.g. QUEUED (repeatable)")
    ls.add_argument("--cluster", default="", help="only jobs whose current attempt is on this cluster")
    ls.add_argument("--gpu-model", default="", help="only jobs that got or accept this GPU model")
    ls.add_argument("--limit", type=int, default=100)
    w = sub.add_parser("watch", parents=[connection], help="follow job events")
    w.add_argument("--from-revision", type=int, default=0)
    w.add_argument("--job-set", default="")
    w.add_argument("--max-events", type=int, default=0, help="stop after this many job events (0 = forever)")
    c = sub.add_parser("cancel", parents=[connection], help="cancel a job (or a job set)")
    c.add_argument("job_id", nargs="?")
    c.add_argument("--job-set", default="")
    c.add_argument("--reason", default="cancelled from the command line")
    sub.add_parser("clusters", parents=[connection], help="catalog: GPUs by model, domains, freshness")
    for name in ("cordon", "uncordon"):
        x = sub.add_parser(name, parents=[connection], help=f"{name} a cluster (admin)")
        x.add_argument("cluster")
        x.add_argument("--reason", required=True)
    u = sub.add_parser(
        "usage",
        parents=[connection],
        help="GPUs held per tenant against quota and fair share; --csv: GPU-hours over a window",
    )
    u.add_argument("--tenant", default="", help="one tenant (admins; tenants always see only their own)")
    shape = u.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="print the usage rows as JSON")
    shape.add_argument(
        "--csv", action="store_true", help="print GPU-hours per tenant, GPU model and cluster as CSV (ExportUsage)"
    )
    u.add_argument(
        "--since",
        type=parse_time,
        default=None,
        help="with --csv: window start (epoch seconds, ISO 8601, or a duration ago like 7d; default: all)",
    )
    u.add_argument("--until", type=parse_time, default=None, help="with --csv: window end (default: now)")
    r = sub.add_parser(
        "requeue", parents=[connection], help="end a job's current attempt and queue it again (no retry spent)"
    )
    r.add_argument("job_id")
    r.add_argument("--reason", default="requeued from the command line")
    pr = sub.add_parser("priority", parents=[connection], help="change a job's priority and / or priority band")
    pr.add_argument("job_id")
    pr.add_argument("--priority", type=int, default=None, help="-1000..1000")
    pr.add_argument("--band", default="", help="a priority band the job's tenant may use")
    pr.add_argument("--reason", default="")
    for name, what in (("hold", "keep a job from being placed until it is released"), ("release", "lift a hold")):
        h = sub.add_parser(name, parents=[connection], help=what)
        h.add_argument("job_id")
        h.add_argument("--reason", default="")
    return p


def _state(v: int) -> str:
    return job_pb2.JobState.Name(v).removeprefix("JOB_STATE_")  # type: ignore[arg-type]


def _ts(t: Any) -> str:
    if not t.seconds:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t.seconds))


def _table(rows: list[list[str]], out: TextIO) -> None:
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")


def _print_job(job: job_pb2.Job, out: TextIO) -> None:
    st = job.status
    out.write(f"job:      {job.job_id}\nstate:    {_state(st.state)}\n")
    out.write(f"tenant:   {job.spec.tenant}   queue: {job.spec.queue}   job set: {job.spec.job_set_id}\n")
    out.write(f"created:  {_ts(st.create_time)}   attempt: {st.current_attempt}   infra retries: {st.infra_retries}\n")
    out.write(
        f"priority: {job.spec.priority}   band: {job.spec.priority_band or 'default'}"
        f"{'   HELD by ' + st.held_by if st.held else ''}\n"
    )
    if st.state == job_pb2.JOB_STATE_QUEUED and st.HasField("queue_info"):
        qi = st.queue_info
        pos = qi.position if qi.HasField("position") else "?"
        why = job_pb2.WaitReason.Name(qi.reason).removeprefix("WAIT_REASON_")
        out.write(f"position: {pos} (jobs of your tenant ahead)\nwaiting:  {why}: {qi.message}\n")
        for v in qi.clusters:
            verdict = job_pb2.ClusterVerdictReason.Name(v.reason).removeprefix("CLUSTER_VERDICT_REASON_")
            out.write(f"  cluster {v.cluster}: {verdict}: {v.message}\n")
    if st.message:
        out.write(f"message:  {st.message}\n")
    if st.attempts:
        out.write("attempts:\n")
        rows = [["#", "CLUSTER", "DOMAIN", "NODES", "OUTCOME", "RESERVED", "MESSAGE"]]
        for a in st.attempts:
            nodes = sorted({p.node for p in a.assignments})
            outcome = job_pb2.AttemptOutcome.Name(a.outcome).removeprefix("ATTEMPT_OUTCOME_") if a.outcome else "active"
            rows.append(
                [
                    str(a.number),
                    a.cluster,
                    "/".join(s.value for s in a.domain.segments) or "-",
                    ",".join(nodes[:4]) + ("..." if len(nodes) > 4 else ""),
                    outcome,
                    _ts(a.reserve_time),
                    a.outcome_message or a.rejection.message,
                ]
            )
        _table(rows, out)


def _print_clusters(clusters: Sequence[cs.ClusterSummary], out: TextIO) -> None:
    rows = [["CLUSTER", "REGION", "STATE", "NODES", "GPUS (free/total by model)", "REPORT AGE", "ACTIVE"]]
    for c in clusters:
        state = "cordoned" if c.cordoned else ("stale" if c.stale else ("ready" if c.connected else "disconnected"))
        gpus = ", ".join(f"{g.model}: {g.free}/{g.total}" for g in c.gpus) or "-"
        age = f"{c.last_report_age.seconds}s" if c.HasField("last_report_age") else "-"
        rows.append([c.name, c.region or "-", state, str(c.nodes), gpus, age, str(c.active_attempts)])
    _table(rows, out)


def _print_domains(c: cs.ClusterSummary, out: TextIO) -> None:
    if not c.domains:
        return
    rows = [["  LEVEL", "DOMAIN", "NODES", "GPUS (free/total)"]]
    for d in c.domains:
        rows.append(
            [
                "  " + d.level,
                "/".join(s.value for s in d.path.segments),
                str(d.nodes),
                ", ".join(f"{g.model}: {g.free}/{g.total}" for g in d.gpus) or "-",
            ]
        )
    out.write(f"{c.name} domains:\n")
    _table(rows, out)


def _num(x: float) -> str:
    return f"{round(x, 3):g}"


def _per_model(m: Mapping[str, float]) -> str:
    return ", ".join(f"{k}: {_num(v)}" for k, v in sorted(m.items())) or "-"


def _print_usage(resp: svc.GetUsageResponse, out: TextIO) -> None:
    rows = [["TENANT", "WEIGHT", "GPUS (held by model)", "QUOTA", "BORROWED", "USAGE", "FAIR SHARE", "DEMAND"]]
    for t in resp.tenants:
        rows.append(
            [
                t.tenant,
                _num(t.weight),
                _per_model(t.gpus),
                _per_model(t.quotas),
                _per_model(t.borrowed),
                _num(t.usage_cost),
                _num(t.fair_share_cost),
                _num(t.demand_cost),
            ]
        )
    _table(rows, out)
    out.write(
        f"(usage, fair share and demand in cost units: GPUs x model weight; fleet capacity "
        f"{_num(resp.capacity_cost)})\n"
    )


def _usage_json(resp: svc.GetUsageResponse) -> str:
    doc = {
        "evaluate_time": _ts(resp.evaluate_time),
        "capacity_cost": resp.capacity_cost,
        "tenants": [
            {
                "tenant": t.tenant,
                "weight": t.weight,
                "gpus": dict(t.gpus),
                "quotas": dict(t.quotas),
                "borrowed": dict(t.borrowed),
                "usage_cost": t.usage_cost,
                "fair_share_cost": t.fair_share_cost,
                "demand_cost": t.demand_cost,
            }
            for t in resp.tenants
        ],
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _usage_csv(resp: svc.ExportUsageResponse, out: TextIO) -> None:
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["tenant", "gpu_model", "cluster", "gpu_hours"])
    for r in resp.records:
        w.writerow([r.tenant, r.gpu_model, r.cluster, repr(r.gpu_hours)])


def _held(job: job_pb2.Job) -> str:
    return f"held by {job.status.held_by}" if job.status.held else "not held"


async def _run(args: argparse.Namespace, out: TextIO) -> int:
    ca = Path(args.ca).read_bytes() if args.ca else None
    async with BrokerClient(args.broker, token=args.token, ca_pem=ca, server_name=args.server_name) as c:
        if args.cmd == "submit":
            jf = load_job_file(args.file)
            key = args.key or jf.key or default_key(jf)
            [r] = await c.submit(jf.jobSet, [SubmitItem(key, to_spec(jf))], validate_only=args.dry_run)
            if r.error_code:
                out.write(
                    f"refused: {grpc.StatusCode(next(s for s in grpc.StatusCode if s.value[0] == r.error_code)).name}: "
                    f"{r.error_message}\n"
                )
                return 1
            if r.valid:
                out.write("valid (dry run: nothing stored)\n")
            else:
                out.write(f"{r.job_id}{'  (already submitted with this key)' if r.duplicate else ''}\n")
            return 0
        if args.cmd == "get":
            _print_job(await c.get(args.job_id), out)
            return 0
        if args.cmd == "list":
            states = [job_pb2.JobState.Value(f"JOB_STATE_{s.upper()}") for s in args.state]
            resp = await c.list(
                job_set_id=args.job_set,
                states=states,
                page_size=args.limit,
                cluster=args.cluster,
                gpu_model=args.gpu_model,
            )
            rows = [["JOB", "STATE", "QUEUE", "JOB SET", "ATTEMPT", "WAITING"]]
            for j in resp.jobs:
                qi = j.status.queue_info
                why = job_pb2.WaitReason.Name(qi.reason).removeprefix("WAIT_REASON_") if qi.reason else ""
                rows.append(
                    [
                        j.job_id,
                        _state(j.status.state),
                        j.spec.queue,
                        j.spec.job_set_id,
                        str(j.status.current_attempt),
                        why,
                    ]
                )
            _table(rows, out)
            return 0
        if args.cmd == "watch":
            n = 0
            async for ev in c.watch(from_revision=args.from_revision, job_set_id=args.job_set):
                if not ev.job_id:
                    continue
                t = ev.transition
                out.write(
                    f"{ev.revision}  {ev.job_id}  {_state(t.from_state) if t.from_state else '-'} -> "
                    f"{_state(t.to_state)}  {t.reason}  {t.message}\n"
                )
                out.flush()
                n += 1
                if args.max_events and n >= args.max_events:
                    break
            return 0
        if args.cmd == "cancel":
            if args.job_set:
                done = await c.cancel_set(args.job_set, args.reason)
                out.write(
                    f"cancelled {len(done.cancelled_job_ids)} jobs ({done.already_terminal_count} already done)\n"
                )
            elif args.job_id:
                one = await c.cancel(args.job_id, args.reason)
                out.write(
                    f"{args.job_id}: {_state(one.state)}{' (already finished)' if one.already_terminal else ''}\n"
                )
            else:
                out.write("name a job id or --job-set\n")
                return 2
            return 0
        if args.cmd == "clusters":
            listed = await c.list_clusters()
            _print_clusters(listed.clusters, out)
            for summary in listed.clusters:
                _print_domains((await c.get_cluster(summary.name)).cluster, out)
            return 0
        if args.cmd in ("cordon", "uncordon"):
            summary = await c.cordon(args.cluster, args.reason, on=args.cmd == "cordon")
            _print_clusters([summary], out)
            return 0
        if args.cmd == "usage":
            if args.csv:
                _usage_csv(await c.export_usage(since=args.since, until=args.until, tenant=args.tenant), out)
            elif args.since is not None or args.until is not None:
                out.write("--since / --until go with --csv (GPU-hours over a window)\n")
                return 2
            elif args.json:
                out.write(_usage_json(await c.usage(args.tenant)))
            else:
                _print_usage(await c.usage(args.tenant), out)
            return 0
        if args.cmd == "requeue":
            requeued = await c.requeue(args.job_id, args.reason)
            out.write(f"{args.job_id}: {_state(requeued.state)}\n")
            return 0
        if args.cmd == "priority":
            job = await c.set_priority(args.job_id, priority=args.priority, band=args.band, reason=args.reason)
            out.write(f"{job.job_id}: priority {job.spec.priority}, band {job.spec.priority_band or 'default'}\n")
            return 0
        if args.cmd == "hold":
            held = await c.hold(args.job_id, args.reason)
            note = " (already held)" if held.already_held else ""
            out.write(f"{held.job.job_id}: {_state(held.job.status.state)}, {_held(held.job)}{note}\n")
            return 0
        if args.cmd == "release":
            released = await c.release(args.job_id, args.reason)
            note = " (was not held)" if released.was_not_held else ""
            out.write(f"{released.job.job_id}: {_state(released.job.status.state)}, {_held(released.job)}{note}\n")
            return 0
    return 2


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    stream = out or sys.stdout
    try:
        return asyncio.run(_run(args, stream))
    except grpc.aio.AioRpcError as exc:
        stream.write(f"error: {exc.code().name}: {exc.details()}\n")
        for d in status_details(exc):
            for v in getattr(d, "field_violations", ()):
                stream.write(f"  {v.field}: {v.description}\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
