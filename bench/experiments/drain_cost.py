"""Scratch: what the drain's statements and triggers cost Postgres per job.

    uv run --group bench python bench/experiments/drain_cost.py [--database-url URL]
        [--jobs 20000] [--batch 100] [--rounds 3] [--only VARIANT...]

Each variant: jobs bulk-inserted (untimed), then one connection claims ``--batch`` at a
time with jobsd's ``jobs_claim_batch`` and writes their outcomes with
``jobs_finish_batch`` until none is left: the daemon's two statements without the
daemon. The figure is that backend's CPU per job (from /proc), the WAL per job, and
the heap updates that were HOT.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import psycopg
from common import DEFAULT_URL, backend_cpu, lsn, median, scratch
from insert_cost import _many_params

from jobsd.store.sqlfiles import load_queries

VARIANTS: dict[str, str] = {
    "base": "",
    "no history trigger": "DROP TRIGGER jobs_history_row ON jobsd.jobs;",
    "no notify_done trigger": "DROP TRIGGER jobs_notify_done ON jobsd.jobs;",
    "no jobs_running_idx": "DROP INDEX jobsd.jobs_running_idx;",
    "no jobs_created_idx": "DROP INDEX jobsd.jobs_created_idx;",
    "no jobs_org_created_idx": "DROP INDEX jobsd.jobs_org_created_idx;",
    "no jobs_open_by_queue_org_idx": "DROP INDEX jobsd.jobs_open_by_queue_org_idx;",
    "no jobs_finished_idx": "DROP INDEX jobsd.jobs_finished_idx;",
    "no history, no notify_done, no running/created/open indexes": (
        "DROP TRIGGER jobs_history_row ON jobsd.jobs;"
        "DROP TRIGGER jobs_notify_done ON jobsd.jobs;"
        "DROP INDEX jobsd.jobs_running_idx; DROP INDEX jobsd.jobs_created_idx;"
        "DROP INDEX jobsd.jobs_open_by_queue_org_idx;"
    ),
}


_HOT = (
    "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'jobsd.jobs'::regclass"
)


def _finish_json(rows: list[tuple[Any, ...]]) -> str:
    return json.dumps(
        [
            {
                "id": str(r[0]),
                "lease_id": str(r[1]),
                "status": "succeeded",
                "error": None,
                "reason": None,
                "progress": None,
                "run_after": None,
                "delay_s": None,
                "report": None,
            }
            for r in rows
        ]
    )


def run(url: str, jobs: int, batch: int) -> dict[str, float]:
    q = load_queries()
    claim = q["jobs_claim_batch"]
    finish = q["jobs_finish_batch"]
    with psycopg.connect(url, autocommit=True) as conn:
        for lo in range(0, jobs, 1000):
            conn.execute(q["jobs_insert_many"], _many_params(lo, min(1000, jobs - lo)))
        conn.execute("VACUUM ANALYZE jobsd.jobs")
        conn.execute("SELECT pg_stat_clear_snapshot()")
        hot0 = conn.execute(_HOT).fetchone()
        params = {
            "limit": batch,
            "worker_id": "exp",
            "queues": None,
            "keep_dedup_types": [],
            "limit_types": [],
            "limit_values": [],
            "types": None,
            "free": None,
            "at_most_once_types": [],
            "relaxed_commit": True,
            "reserve_s": 30.0,
        }
        c0, w0 = backend_cpu(conn), lsn(conn)
        done = 0
        while True:
            rows = conn.execute(claim, params, prepare=True).fetchall()
            if not rows:
                break
            done += len(rows)
            lease_pos = _lease_pos(conn)
            conn.execute(
                finish,
                {
                    "results": _finish_json([(r[0], r[lease_pos]) for r in rows]),
                    "confirm": False,
                    "errors_kept": 10,
                },
                prepare=True,
            ).fetchall()
        c1, w1 = backend_cpu(conn), lsn(conn)
        import time

        time.sleep(0.7)  # stats are flushed at most every 500 ms
        conn.execute("SELECT pg_stat_clear_snapshot()")
        hot1 = conn.execute(_HOT).fetchone()
    assert done == jobs, (done, jobs)
    upd = hot1[0] - hot0[0]
    return {
        "cpu_us": (c1 - c0) / jobs * 1e6,
        "wal": (w1 - w0) / jobs,
        "hot": (hot1[1] - hot0[1]) / upd if upd else 0.0,
    }


_LEASE: dict[str, int] = {}


def _lease_pos(conn: psycopg.Connection[Any]) -> int:
    if "pos" not in _LEASE:
        cols = [
            r[0]
            for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = 'jobsd.jobs'::regclass"
                " AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
            ).fetchall()
        ]
        _LEASE["pos"] = cols.index("lease_id")
    return _LEASE["pos"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="+")
    args = parser.parse_args()
    variants = {k: v for k, v in VARIANTS.items() if not args.only or k in args.only}
    results: dict[str, list[dict[str, float]]] = {k: [] for k in variants}
    with scratch(args.database_url) as s:
        for r in range(args.rounds):
            for k, ddl in variants.items():
                url = s.clone(f"d{r}", ddl)
                results[k].append(run(url, args.jobs, args.batch))
                s.drop(url)
                print(f"round {r} {k}: {results[k][-1]}", flush=True)
    print()
    print(
        f"| variant (claim {args.batch} + finish {args.batch}) | µs backend CPU/job |"
        " WAL B/job | HOT share of updates |"
    )
    print("|---|---|---|---|")
    for k, xs in results.items():
        if xs:
            print(
                f"| {k} | {median([x['cpu_us'] for x in xs]):.0f} | "
                f"{median([x['wal'] for x in xs]):,.0f} | {median([x['hot'] for x in xs]):.0%} |"
            )


if __name__ == "__main__":
    main()
