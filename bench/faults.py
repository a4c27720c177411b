"""Run jobsd's fault campaign and write its figures: stdout and docs/reliability.md.

    uv run python bench/faults.py                      # the whole campaign, once
    uv run python bench/faults.py --only T1,T4 --repeat 5 --seed 7 --no-write
    uv run python bench/faults.py --quick              # the CI subset
    uv run python bench/faults.py --save run.jsonl     # keep the raw figures...
    uv run python bench/faults.py --render run.jsonl   # ...and render them again later

Each repetition is one ``pytest tests/faults`` run (the scenarios live there; see
tests/faults/README.md) with ``JOBSD_FAULTS_REPORT`` pointing at a file the tests append
one JSON line per scenario to, and ``JOBSD_FAULTS_SEED`` set to seed + repetition (the
injection timings are drawn from it). The table gives, per scenario, the audit's figures
(lost, ghost, double runs, illegal transitions, recovery) and its result against the
plan's criteria; with several repetitions, a figure that varied reads ``p50 / max``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
SAVED_ARGS = ("only", "repeat", "seed", "quick")
STANDARD = ("lost", "ghost", "double_runs", "illegal")
HIDDEN = {
    "by_status",
    "problems",
    "wall_s",
    "jobs",
    "runs",
    "checks",
    "stuck",
    "amo_reruns",
    "phantom_runs",
    "overlaps",
    "runs_over_limit",
    "fenced",
    "recovery_s",
    "producer_errors",
    "command",
    "refused",
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- running -----------------------------------------------------------------------------


def run_campaign(
    only: str, repeat: int, seed: int, quick: bool
) -> tuple[list[dict[str, Any]], float]:
    """Run pytest ``repeat`` times; return every scenario line and the wall time."""
    lines: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for n in range(repeat):
        with tempfile.NamedTemporaryFile(prefix="jobsd-faults-", suffix=".jsonl") as report:
            env = {
                **os.environ,
                "JOBSD_FAULTS_REPORT": report.name,
                "JOBSD_FAULTS_SEED": str(seed + n),
            }
            if not quick:
                env["JOBSD_TEST_FAULTS"] = "all"
            if only:
                env["JOBSD_FAULTS_ONLY"] = only
            cmd = [
                sys.executable,
                "-m",
                "pytest",
                "tests/faults",
                "-q",
                "-p",
                "no:cacheprovider",
                "-o",
                "addopts=",
                "-rfEX",
            ]
            log(f"== repetition {n + 1}/{repeat} (seed {seed + n}): {' '.join(cmd[2:])}")
            result = subprocess.run(
                cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            tail = [
                ln
                for ln in result.stdout.splitlines()
                if ln and not ln.startswith(("INFO", "WARNING"))
            ]
            log("\n".join(tail[-12:]))
            for raw in Path(report.name).read_text().splitlines():
                if raw.strip():
                    lines.append({**json.loads(raw), "repetition": n})
    return lines, time.monotonic() - t0


# -- figures -----------------------------------------------------------------------------


def _num(values: list[Any]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if all(isinstance(v, bool) for v in values):
        return (
            "yes"
            if all(values)
            else ("no" if not any(values) else f"{sum(values)}/{len(values)} yes")
        )
    if all(isinstance(v, int | float) for v in values):
        if len(set(values)) == 1:
            return _fmt(values[0])
        return f"{_fmt(statistics.median(values))} / {_fmt(max(values))}"
    shown = {json.dumps(v, ensure_ascii=False, default=str) for v in values}
    return " | ".join(sorted(shown))[:120]


def _fmt(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}".replace(",", " ") if abs(value) >= 10_000 else str(int(value))
    return f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"


def _result(runs: list[dict[str, Any]]) -> str:
    outcomes = [r["outcome"] for r in runs]
    n = len(outcomes)
    if all(o == "passed" for o in outcomes):
        return f"passed {n}/{n}" if n > 1 else "passed"
    if all(o == "xfailed" for o in outcomes):
        return "xfail"
    if all(o == "skipped" for o in outcomes):
        return "skipped"
    counts = defaultdict(int)
    for o in outcomes:
        counts[o] += 1
    return "**" + ", ".join(f"{o} {c}/{n}" for o, c in sorted(counts.items())) + "**"


def _figures(runs: list[dict[str, Any]]) -> str:
    checks: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        for check in run.get("checks", []):
            checks[check["name"]].append(check)
    parts = []
    for name, seen in checks.items():
        if name in STANDARD or name in HIDDEN:
            continue
        bad = "" if all(c["ok"] for c in seen) else " ✗"
        bound = seen[0]["bound"]
        shown = (
            _fmt(bound) if isinstance(bound, int | float) and not isinstance(bound, bool) else bound
        )
        criterion = f"{seen[0]['op']} {shown}"
        parts.append(f"{name} {_num([c['value'] for c in seen])} ({criterion}){bad}")
    recorded: dict[str, list[Any]] = defaultdict(list)
    for run in runs:
        for key, value in run.get("figures", {}).items():
            if key not in HIDDEN and key not in checks and key not in STANDARD:
                recorded[key].append(value)
    parts += [f"{k} {_num(v)}" for k, v in recorded.items()]
    return "; ".join(parts).replace("|", "/")


def _double(runs: list[dict[str, Any]]) -> str:
    figs = [r.get("figures", {}) for r in runs]
    if any("runs_over_limit" in f for f in figs):
        over = _num([f.get("runs_over_limit") for f in figs])
        return f"{over} (+{_num([f.get('overlaps') for f in figs])} zombie overlaps)"
    return _num([f.get("double_runs") for f in figs])


def _recovery(runs: list[dict[str, Any]]) -> str:
    values = [r.get("figures", {}).get("recovery_s") for r in runs]
    return _num(values)


def rows_by_scenario(lines: list[dict[str, Any]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Group lines: scenario id -> test id -> runs, in campaign order."""
    grouped: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for line in lines:
        grouped.setdefault(line["id"], {}).setdefault(line["test"], []).append(line)
    return dict(sorted(grouped.items(), key=lambda kv: _order(kv[0])))


def _order(sid: str) -> tuple[int, str]:
    digits = "".join(ch for ch in sid[1:] if ch.isdigit()) or "0"
    num = int(digits[:2]) if sid[1:3].isdigit() else int(digits[:1])
    return num, sid


def table(lines: list[dict[str, Any]]) -> list[str]:
    out = [
        "| ID | Fault | Result | Jobs | Lost | Ghost | Double runs | Illegal | recovery_s "
        "| Figures (criterion; ✗ unmet) |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | ---: | --- | --- |",
    ]
    for sid, tests in rows_by_scenario(lines).items():
        if len(tests) > 2:  # a parametrized matrix: one row
            runs = [r for rs in tests.values() for r in rs]
            by_outcome: dict[str, list[str]] = defaultdict(list)
            for test, rs in tests.items():
                by_outcome[rs[-1]["outcome"]].append(test.rsplit("[", 1)[-1].rstrip("]"))
            summary = "; ".join(f"{o}: {', '.join(v)}" for o, v in sorted(by_outcome.items()))
            passed = len(by_outcome.get("passed", []))
            out.append(
                f"| {sid} | {runs[0]['title']} | {passed}/{len(tests)} passed | | | | | | "
                f"| {summary} |"
            )
            continue
        for test, runs in tests.items():
            label = sid + (f" [{test.rsplit('[', 1)[-1]}" if "[" in test else "")
            figs = [r.get("figures", {}) for r in runs]
            cells = [
                label,
                runs[0]["title"],
                _result(runs),
                _num([f.get("jobs") for f in figs]),
                _num([f.get("lost") for f in figs]),
                _num([f.get("ghost") for f in figs]),
                _double(runs),
                _num([f.get("illegal") for f in figs]),
                _recovery(runs),
                _figures(runs),
            ]
            out.append("| " + " | ".join(c.replace("\n", " ") for c in cells) + " |")
    return out


def notes(lines: list[dict[str, Any]]) -> tuple[list[str], list[str], list[str]]:
    """Return the findings, the waiting-for-a-feature xfails and the skips, one line each."""
    findings, waiting, skipped, failed = {}, {}, {}, {}
    for line in lines:
        key = f"{line['id']} ({line['test'].split('::')[-1]})"
        if line["outcome"] == "xfailed" and line["reason"].startswith("finding:"):
            findings[key] = line["reason"].removeprefix("finding:").strip()
        elif line["outcome"] == "xfailed":
            waiting[line["id"]] = line["reason"]
        elif line["outcome"] == "skipped":
            skipped[line["id"]] = line["reason"]
        elif line["outcome"] in ("failed", "error", "xpassed"):
            failed[key] = f"{line['outcome']}: {line['reason']}"
    return (
        [f"- **{k}**: {v}" for k, v in sorted({**failed, **findings}.items())],
        [f"- {k}: {v}" for k, v in sorted(waiting.items())],
        [f"- {k}: {v}" for k, v in sorted(skipped.items())],
    )


def headline(lines: list[dict[str, Any]]) -> list[str]:
    def total(key: str) -> int:
        return sum(
            int(line.get("figures", {}).get(key) or 0)
            for line in lines
            if line["outcome"] == "passed"
        )

    def fig(sid: str, key: str) -> str:
        return _num([ln.get("figures", {}).get(key) for ln in lines if ln["id"] == sid])

    jobs = total("jobs")
    return [
        f"- **Loss and duplication** (passing scenarios, {jobs:,} jobs): lost {total('lost')}, "
        f"ghost {total('ghost')}, at-most-once reruns {total('amo_reruns')}, runs over the "
        f"allowed count {total('double_runs') - total('overlaps')}, illegal or unrecorded "
        f"transitions {total('illegal')}; double claims in the claim race (T13): "
        f"{fig('T13', 'double_claims')}.",
        f"- **Recovery after kill -9** (T1): {fig('T1', 'recovery_s')} s (bound: L + 2 s = 5 s); "
        f"after a Postgres restart (T4): {fig('T4', 'recovery_s')} s after it accepts connections "
        f"(bound 5 s); after a network cut heals (T7a/T7b): {fig('T7a', 'recovery_s')} / "
        f"{fig('T7b', 'recovery_s')} s.",
        f"- **Partition detection** (T7, bound 5 s): noticed during the cut: T7a "
        f"{fig('T7a', 'detected_during_outage')}, T7b {fig('T7b', 'detected_during_outage')} "
        f"(the cut daemon's first warning: {fig('T7a', 'detection_s')} / "
        f"{fig('T7b', 'detection_s')} s after the cut; '-': none at all, its statements "
        f"simply waited for the link); a blackhole alone (T7-detect): "
        f"{fig('T7-detect', 'detection_s')} s.",
        f"- **Pickup latency with NOTIFY lost** (T8, 2 s poll): p99 "
        f"{fig('T8', 'pickup_p99_after_kill_s')} s after the LISTEN session was killed, "
        f"{fig('T8', 'pickup_p99_notify_off_s')} s with NOTIFY off.",
        f"- **Bad input** (T16): {fig('T16', 'requests')} requests, server errors "
        f"{fig('T16', 'server_errors')}, rows from refused requests "
        f"{fig('T16', 'rows_from_refused_requests')}.",
        f"- **Security** (T18, T19): cross-tenant rows visible "
        f"{fig('T18', 'cross_org_rows_visible')}; weak DSNs refused "
        f"{fig('T19', 'refused_share')} (share).",
        f"- **Throughput baselines** (T13, 2 cores, not SLOs): claim statement "
        f"{fig('T13', 'statement_claims_per_s')}/s with 8 claimers; two daemons x 8 slots drain "
        f"{fig('T13', 'daemon_claims_per_s')} jobs/s (each run writes the ledger).",
    ]


def failover(lines: list[dict[str, Any]]) -> list[str]:
    """The failover figures (T25 in each replication mode, T26 through the API)."""
    out = [
        "A primary and a streaming standby on loopback; the primary is killed (SIGKILL) under",
        "load, the standby promoted 0.5 s later (an orchestrator's delay) and a new standby",
        "built on the dead primary's port, so the processes keep one multi-host URL",
        "(`target_session_attrs=read-write`) and are never restarted. Two daemons x 6 slots,",
        "producers of short (20 ms) and long (1.5 s) jobs of both deliveries. *To first end*:",
        "from the promotion to the first job finished on the new primary.",
        "",
        "| mode | failovers | acked | lost | at-most-once run twice | overlapping runs "
        "| at-least-once reruns | to first end, median / max (s) | unshipped WAL at the kill "
        "(bytes) | daemons restarted |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |",
    ]
    for line in lines:
        f = line.get("figures", {})
        if line["id"] != "T25" or "mode" not in f:
            continue
        alive = f.get("daemons_alive_throughout")
        out.append(
            f"| {f['mode']} ({line['outcome']}) | {f.get('failovers')} | {f.get('acked')} "
            f"| {f.get('lost_acked', f.get('lost'))} | {f.get('amo_reruns')} "
            f"| {f.get('overlapping_runs')} | {f.get('reruns_at_least_once')} "
            f"| {f.get('promotion_to_first_end_median_s')} / "
            f"{f.get('promotion_to_first_end_max_s')} "
            f"| {max(f.get('lag_bytes_at_kill') or [0])} (max) "
            f"| {2 - alive if alive is not None else '-'} |"
        )
    for line in lines:
        f = line.get("figures", {})
        if line["id"] == "T26":
            out += [
                "",
                f"Through `jobsd api` (T26, {line['outcome']}): {f.get('acknowledged')} "
                f"`POST /jobs` acknowledged over two failovers (answers {f.get('answers')}; a "
                f"503 is retried by the client with the same id), lost {f.get('lost')}, "
                f"long-poll waits that saw their job's end {f.get('waits_that_saw_the_end')}, "
                f"the API and the daemon never restarted.",
            ]
    return out


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    pg = "?"
    postgres = shutil.which("postgres") or shutil.which("pg_ctl")
    if postgres:
        pg = subprocess.run([postgres, "--version"], capture_output=True, text=True).stdout.strip()
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{platform.system()} {platform.release()} {platform.machine()}, {os.cpu_count()} CPUs "
        f"({cpu}), {mem}; {pg}; Python {platform.python_version()}; load average at the end {load}"
    )


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()

    sha = git("rev-parse", "--short", "HEAD") or "?"
    return sha + (
        " (with uncommitted changes)" if git("status", "--porcelain", "--", "jobsd", "sql") else ""
    )


def render(lines: list[dict[str, Any]], args: argparse.Namespace, wall_s: float) -> str:
    findings, waiting, skipped = notes(lines)
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    scope = "the quick subset" if args.quick else "the full campaign"
    if args.only:
        scope += f", scenarios {args.only}"
    parts = [
        "# Reliability: what jobsd survives, measured",
        "",
        "The fault campaign: every scenario of the campaign (T1-T26) this machine can",
        "run, each driving real `jobsd run` daemons (and `jobsd api`) against a real",
        "throwaway Postgres, each ending with an audit against a ground-truth ledger kept",
        "outside jobsd's tables. How it works, how to run it and what each figure means:",
        "[tests/faults/README.md](https://github.com/jobsd/jobsd/blob/main/tests/faults/README.md).",
        "This page is written by",
        "`uv run python bench/faults.py`; edit that script, not this page.",
        "",
        f"**This run:** {when}; commit {commit()}; {scope}; {args.repeat} repetition(s), "
        f"injection timings of `--seed={args.seed}`; {wall_s / 60:.1f} min.  ",
        f"**Machine:** {machine()}.  ",
        "Timings on this shared 2-core machine swing with other load; the bounds have margins.",
        "",
        "## Headline figures",
        "",
        *headline(lines),
        "",
        "## Failover",
        "",
        *failover(lines),
        "",
        "## Scenarios",
        "",
        "Lease L = 3 s (each daemon's `JOBSD_WORKER_LEASE`, and `JOBSD_STALE_AFTER`; checks",
        "of held jobs, sweeps and death checks every 1 s). *Lost*: jobs",
        "jobsd confirmed that are not in `jobsd.jobs`. *Ghost*: jobs that exist although",
        "their submission was refused. *Double runs*: jobs the ledger shows run more often",
        "than their delivery allows (at-most-once: once; retryable: `max_attempts`) or in",
        "overlapping runs; in the zombie scenario (T3) the overlaps of a paused owner",
        "are reported apart (it cannot run its fence while frozen: resumed past its lease",
        "it exits at once, its results are fenced, a moment of its side effects is not).",
        "*Illegal*: histories that are not chains of the state machine's edges, states",
        "without their event, events out of time order. *recovery_s*: from the end of the",
        "fault to the first claim or completion it concerns.",
        "",
        *table(lines),
        "",
        "## Findings",
        "",
        "Each is a strict xfail in tests/faults: a regression test that flips (and fails,",
        "XPASS) when the bug is fixed. Each names where in jobsd the cause lies.",
        "",
        *(findings or ["- none"]),
        "",
        "## Waiting for a feature",
        "",
        "Written against interfaces not built yet; strict xfails until they land.",
        "",
        *(waiting or ["- none"]),
        "",
        "## Not run on this machine",
        "",
        *(skipped or ["- none"]),
        "",
        "## Where jobsd's design differs from the scenarios' generic expectations",
        "",
        "- T1: the rescue event says `owner died` (dead owner, proven by its lock) or",
        "  `worker lost` (at-most-once), not `lost_worker`.",
        "- T2: an interrupted retryable job is written back `queued` with its attempt",
        "  counted (not refunded), reason `shutdown`; at-most-once ones `failed(shutdown)`.",
        "- T5: `/healthz` is liveness only (200 while the process runs); `/readyz` and",
        "  `/health` report the database down (503).",
        "- T6: the API fixes the job id before the first attempt, so its own retry (and a",
        "  client's) finds a committed job by id or dedup key; no `pg_xact_status` needed.",
        "- T8: jobsd jitters each poll wait to 2/3..4/3 of `JOBSD_POLL_INTERVAL`, so the",
        "  pickup bound is 4/3 x poll + 0.5 s (3.17 s at a 2 s poll), not poll + 0.5 s.",
        "- T17: the API has no handler registry (submitters do not import handlers): an",
        "  unknown type is accepted (202); at run time a daemon without its handler leaves",
        "  it queued and reports it (the default, `JOBSD_UNKNOWN_TYPES=leave`), or fails it",
        "  `unknown type` with `JOBSD_UNKNOWN_TYPES=fail`; never silently dropped.",
        "- T20: Postgres 15 has no `max_notify_queue_pages`; only the usage gauge is checked.",
        "- T21: the model-based machine of tests/db/test_db_stateful.py, plus Postgres",
        "  restarts (fast and immediate) between steps.",
        "",
    ]
    return "\n".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", default="", help="comma-separated scenario ids (T2 selects T2a, T2b)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="repetitions, each with its own seed")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 10_000)
    parser.add_argument("--quick", action="store_true", help="only the CI subset")
    parser.add_argument(
        "--no-write", action="store_true", help=f"do not rewrite {DOC.relative_to(ROOT)}"
    )
    parser.add_argument("--save", type=Path, help="also keep the scenarios' JSON lines here")
    parser.add_argument(
        "--render", type=Path, help="render saved JSON lines (--save) instead of running"
    )
    args = parser.parse_args()
    if args.render:
        saved = [json.loads(ln) for ln in args.render.read_text().splitlines() if ln.strip()]
        lines, wall_s = saved[1:], float(saved[0]["wall_s"])
        args.__dict__.update(saved[0]["args"])
    else:
        lines, wall_s = run_campaign(args.only, args.repeat, args.seed, args.quick)
    if args.save:
        head = {"wall_s": wall_s, "args": {k: getattr(args, k) for k in SAVED_ARGS}}
        rows = [json.dumps(x, default=str) for x in [head, *lines]]
        args.save.write_text("\n".join(rows) + "\n")
    if not lines:
        log("no scenario ran")
        return 1
    text = render(lines, args, wall_s)
    print(text)
    if not args.no_write:
        DOC.write_text(text)
        log(f"wrote {DOC.relative_to(ROOT)}")
    bad = [ln for ln in lines if ln["outcome"] in ("failed", "error", "xpassed")]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
