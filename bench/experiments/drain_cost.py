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
from insert_cost import DEDUP_PARTIAL, _many_params

from jobsd.store.sqlfiles import load_queries

HISTORY_STMT = """
DROP TRIGGER jobs_history_update ON jobsd.jobs;
CREATE FUNCTION jobsd.exp_history_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id, reason)
  SELECT n.id, n.org_id, o.status, n.status, n.attempts,
         coalesce(nullif(current_setting('jobsd.actor', true), ''), n.worker_id), n.reason
  FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
  WHERE o.status IS DISTINCT FROM n.status;
  RETURN NULL;
END $$;
CREATE TRIGGER jobs_history_update AFTER UPDATE ON jobsd.jobs
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION jobsd.exp_history_update();
"""

NOTIFY_DONE_STMT = """
DROP TRIGGER jobs_notify_done ON jobsd.jobs;
CREATE FUNCTION jobsd.exp_notify_done() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  -- one notification per statement, the ids in the payload (8000 bytes at most:
  -- a real version would split)
  PERFORM pg_notify('jobsd_done', string_agg(n.id::text, ','))
  FROM new_rows AS n JOIN old_rows AS o ON o.id = n.id
  WHERE n.status IN ('succeeded', 'failed', 'cancelled') AND o.status IS DISTINCT FROM n.status
  HAVING count(*) > 0;
  RETURN NULL;
END $$;
CREATE TRIGGER jobs_notify_done AFTER UPDATE ON jobsd.jobs
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
  FOR EACH STATEMENT EXECUTE FUNCTION jobsd.exp_notify_done();
"""

VARIANTS: dict[str, str] = {
    "base": "",
    "no notify_done trigger": "DROP TRIGGER jobs_notify_done ON jobsd.jobs;",
    "notify_done once per statement": NOTIFY_DONE_STMT,
    "no history trigger": "DROP TRIGGER jobs_history_update ON jobsd.jobs;",
    "history once per statement (transition tables)": HISTORY_STMT,
    "no check_transition trigger": "DROP TRIGGER jobs_check_transition ON jobsd.jobs;",
    "no foreign key job_events -> jobs": (
        "ALTER TABLE jobsd.job_events DROP CONSTRAINT job_events_job_id_fkey;"
    ),
    "no jobs_active_idx": "DROP INDEX jobsd.jobs_active_idx;",
    "no jobs_org_type_created_idx": "DROP INDEX jobsd.jobs_org_type_created_idx;",
    "dedup unique index partial": DEDUP_PARTIAL,
    "fillfactor 50": "ALTER TABLE jobsd.jobs SET (fillfactor = 50);",
    "history and notify_done per statement, 2 indexes fewer": (
        HISTORY_STMT
        + NOTIFY_DONE_STMT
        + "DROP INDEX jobsd.jobs_active_idx; DROP INDEX jobsd.jobs_org_type_created_idx;"
        + DEDUP_PARTIAL
    ),
    "proposal: history per statement, no FK, 2 indexes fewer, dedup partial": (
        HISTORY_STMT
        + "ALTER TABLE jobsd.job_events DROP CONSTRAINT job_events_job_id_fkey;"
        + "DROP INDEX jobsd.jobs_active_idx; DROP INDEX jobsd.jobs_org_type_created_idx;"
        + DEDUP_PARTIAL
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


def run(url: str, jobs: int, batch: int, finish_returning: str = "j.*") -> dict[str, float]:
    q = load_queries()
    claim = q["jobs_claim_batch"]
    finish = q["jobs_finish_batch"].replace("RETURNING j.*", f"RETURNING {finish_returning}")
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
            "armed": 0,
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
                {"results": _finish_json([(r[0], r[lease_pos]) for r in rows])},
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
    results["base, finish RETURNING j.id"] = []
    with scratch(args.database_url) as s:
        for r in range(args.rounds):
            for k, ddl in variants.items():
                url = s.clone(f"d{r}", ddl)
                results[k].append(run(url, args.jobs, args.batch))
                s.drop(url)
                print(f"round {r} {k}: {results[k][-1]}", flush=True)
                if k == "base":
                    url = s.clone(f"d{r}")
                    results["base, finish RETURNING j.id"].append(
                        run(url, args.jobs, args.batch, "j.id")
                    )
                    s.drop(url)
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
