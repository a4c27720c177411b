"""Scratch: what each trigger and index costs Postgres per enqueued job.

    uv run --group bench python bench/experiments/insert_cost.py [--database-url URL]
        [--n 3000] [--rounds 3] [--only VARIANT...]

Each variant is the migrated schema changed by a little DDL, in its own database. The
figure is the CPU of the one backend that runs jobsd's own ``jobs_insert`` (one job
per autocommit statement, prepared) or ``jobs_insert_many`` (1,000 per statement),
read from /proc, and the WAL per job; medians of ``--rounds`` interleaved rounds.
pgqueuer's enqueue statement on its own schema is the reference.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

import psycopg
from common import DEFAULT_URL, backend_cpu, lsn, median, scratch

from jobsd.ids import uuid7
from jobsd.store.sqlfiles import load_queries

HISTORY_ROW = """
DROP TRIGGER jobs_history_insert ON jobsd.jobs;
CREATE FUNCTION jobsd.exp_history_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id, reason)
  VALUES (NEW.id, NEW.org_id, NULL, NEW.status, NEW.attempts,
          coalesce(nullif(current_setting('jobsd.actor', true), ''), NEW.worker_id), NEW.reason);
  RETURN NULL;
END $$;
CREATE TRIGGER jobs_history_insert AFTER INSERT ON jobsd.jobs
  FOR EACH ROW EXECUTE FUNCTION jobsd.exp_history_row();
"""

# history, notify and the admission fast path in one statement trigger: one function
# call, one transition table (the slow admission path is left out of the experiment)
MERGED = """
DROP TRIGGER jobs_history_insert ON jobsd.jobs;
DROP TRIGGER jobs_notify_insert ON jobsd.jobs;
DROP TRIGGER jobs_admit_insert ON jobsd.jobs;
CREATE FUNCTION jobsd.exp_after_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO jobsd.job_events (job_id, org_id, from_status, to_status, attempt, worker_id, reason)
  SELECT n.id, n.org_id, NULL, n.status, n.attempts,
         coalesce(nullif(current_setting('jobsd.actor', true), ''), n.worker_id), n.reason
  FROM new_jobs AS n;
  PERFORM pg_notify('jobsd', q.queue)
  FROM (SELECT DISTINCT queue FROM new_jobs WHERE status IN ('queued', 'scheduled')) AS q;
  IF EXISTS (SELECT 1 FROM new_jobs AS n
             WHERE n.concurrency_key IS NOT NULL
                OR EXISTS (SELECT 1 FROM jobsd.queues AS qs
                           WHERE qs.name = n.queue AND qs.capacity IS NOT NULL)) THEN
    RAISE NOTICE 'slow admission path';
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER jobs_after_insert AFTER INSERT ON jobsd.jobs
  REFERENCING NEW TABLE AS new_jobs
  FOR EACH STATEMENT EXECUTE FUNCTION jobsd.exp_after_insert();
"""

# the admission trigger without SECURITY DEFINER / SET search_path (a GUC save and
# restore per call)
ADMIT_NO_SET = """
ALTER FUNCTION jobsd.admit_inserted_jobs() RESET search_path;
ALTER FUNCTION jobsd.admit_inserted_jobs() SECURITY INVOKER;
"""

DEDUP_PARTIAL = """
ALTER TABLE jobsd.jobs DROP CONSTRAINT jobs_org_dedup_key_key;
CREATE UNIQUE INDEX jobs_org_dedup_key_key ON jobsd.jobs (org_id, dedup_key)
  WHERE dedup_key IS NOT NULL;
"""

BARE = """
DROP TRIGGER jobs_after_insert ON jobsd.jobs;
DROP TRIGGER jobs_notify_insert ON jobsd.jobs;
ALTER TABLE jobsd.jobs DROP CONSTRAINT jobs_queue_fkey;
DROP INDEX jobsd.jobs_active_idx, jobsd.jobs_claim_v2_idx, jobsd.jobs_created_idx,
  jobsd.jobs_org_created_idx, jobsd.jobs_open_by_queue_org_idx;
"""
# what pgqueuer's table has on its insert path: the key and the claim's index
CLAIM_INDEX_ONLY = """
DROP INDEX jobsd.jobs_active_idx, jobsd.jobs_created_idx, jobsd.jobs_org_created_idx,
  jobsd.jobs_open_by_queue_org_idx;
"""

VARIANTS: dict[str, str] = {
    "base": "",
    "no history trigger": "DROP TRIGGER jobs_history_insert ON jobsd.jobs;",
    "history as a row trigger": HISTORY_ROW,
    "no notify trigger": "DROP TRIGGER jobs_notify_insert ON jobsd.jobs;",
    "no admission trigger": "DROP TRIGGER jobs_admit_insert ON jobsd.jobs;",
    "admission without SET search_path": ADMIT_NO_SET,
    "no check trigger (WHEN only)": "DROP TRIGGER jobs_check_insert ON jobsd.jobs;",
    "history+notify+admission in one trigger": MERGED,
    "no statement triggers at all": (
        "DROP TRIGGER jobs_history_insert ON jobsd.jobs;"
        "DROP TRIGGER jobs_notify_insert ON jobsd.jobs;"
        "DROP TRIGGER jobs_admit_insert ON jobsd.jobs;"
    ),
    "no foreign key job_events -> jobs": (
        "ALTER TABLE jobsd.job_events DROP CONSTRAINT job_events_job_id_fkey;"
    ),
    "no jobs_active_idx": "DROP INDEX jobsd.jobs_active_idx;",
    "no jobs_org_type_created_idx": "DROP INDEX jobsd.jobs_org_type_created_idx;",
    "dedup unique index partial": DEDUP_PARTIAL,
    "bare table (pkey only, no triggers)": BARE,
    "pkey and claim index only (triggers kept)": CLAIM_INDEX_ONLY,
    # today's schema (0020), one piece less each
    "no jobs_created_idx": "DROP INDEX jobsd.jobs_created_idx;",
    "no jobs_org_created_idx": "DROP INDEX jobsd.jobs_org_created_idx;",
    "no jobs_open_by_queue_org_idx": "DROP INDEX jobsd.jobs_open_by_queue_org_idx;",
    "no after-insert trigger (history, checks)": "DROP TRIGGER jobs_after_insert ON jobsd.jobs;",
    "no queue foreign key": "ALTER TABLE jobsd.jobs DROP CONSTRAINT jobs_queue_fkey;",
    "after-insert trigger without SET search_path": (
        "ALTER FUNCTION jobsd.after_insert_jobs() RESET search_path;"
    ),
    "after-insert trigger SECURITY INVOKER": (
        "ALTER FUNCTION jobsd.after_insert_jobs() SECURITY INVOKER;"
    ),
    "no notify trigger (today's)": "DROP TRIGGER jobs_notify_insert ON jobsd.jobs;",
    "proposal: one statement trigger, no FK, 2 indexes fewer, dedup partial": (
        MERGED
        + "ALTER TABLE jobsd.job_events DROP CONSTRAINT job_events_job_id_fkey;"
        + "DROP INDEX jobsd.jobs_active_idx; DROP INDEX jobsd.jobs_org_type_created_idx;"
        + DEDUP_PARTIAL
    ),
}


def _single_params(i: int) -> dict[str, Any]:
    return {
        "id": uuid7(),
        "org_id": "bench",
        "type": "noop",
        "queue": "default",
        "dedup_key": None,
        "payload": f'{{"i":{i}}}',
        "run_after": None,
        "priority": 0,
        "concurrency_key": None,
        "trace_context": None,
        "blocked": False,
    }


def _many_params(lo: int, n: int) -> dict[str, Any]:
    return {
        "ids": [uuid7() for _ in range(n)],
        "org_ids": ["bench"] * n,
        "types": ["noop"] * n,
        "queues": ["default"] * n,
        "dedup_keys": [None] * n,
        "payloads": [f'{{"i":{i}}}' for i in range(lo, lo + n)],
        "run_afters": [None] * n,
        "priorities": [0] * n,
        "concurrency_keys": [None] * n,
        "trace_contexts": [None] * n,
    }


def run_single(url: str, n: int, returning: str = "*") -> tuple[float, float]:
    text = load_queries()["jobs_insert"].replace("RETURNING *", f"RETURNING {returning}")
    with psycopg.connect(url, autocommit=True) as conn:
        for i in range(200):
            conn.execute(text, _single_params(-i), prepare=True).fetchall()
        params = [_single_params(i) for i in range(n)]
        c0, w0 = backend_cpu(conn), lsn(conn)
        for p in params:
            conn.execute(text, p, prepare=True).fetchall()
        c1, w1 = backend_cpu(conn), lsn(conn)
    return (c1 - c0) / n * 1e6, (w1 - w0) / n


def run_many(url: str, batches: int, size: int = 1000) -> tuple[float, float]:
    text = load_queries()["jobs_insert_many"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(text, _many_params(-size, size), prepare=True).fetchall()
        params = [_many_params(b * size, size) for b in range(batches)]
        c0, w0 = backend_cpu(conn), lsn(conn)
        for p in params:
            conn.execute(text, p, prepare=True).fetchall()
        c1, w1 = backend_cpu(conn), lsn(conn)
    n = batches * size
    return (c1 - c0) / n * 1e6, (w1 - w0) / n


def run_pgqueuer(url: str, n: int, size: int) -> tuple[float, float]:
    from pgqueuer.adapters.persistence import qb

    text = qb.QueryQueueBuilder().build_enqueue_query("raise")
    with psycopg.connect(url, autocommit=True) as conn:

        def once(lo: int) -> None:
            cur = psycopg.RawCursor(conn)
            args = (
                [0] * size,
                ["noop"] * size,
                [str(i).encode() for i in range(lo, lo + size)],
                [timedelta(0)] * size,
                [None] * size,
                ["null"] * size,
            )
            cur.execute(text, args, prepare=True)
            cur.fetchall()

        for i in range(20):
            once(-size * (i + 1))
        c0, w0 = backend_cpu(conn), lsn(conn)
        for b in range(n // size):
            once(b * size)
        c1, w1 = backend_cpu(conn), lsn(conn)
    return (c1 - c0) / n * 1e6, (w1 - w0) / n


def install_pgqueuer(url: str) -> None:
    import anyio
    from libs import pgqueuer_lib

    anyio.run(pgqueuer_lib.install, url)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--n", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="+")
    args = parser.parse_args()
    variants = {k: v for k, v in VARIANTS.items() if not args.only or k in args.only}
    single: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    many: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    extra: dict[str, list[tuple[float, float]]] = {
        "base, RETURNING id": [],
        "pgqueuer enqueue, 1 per statement": [],
        "pgqueuer enqueue, 1,000 per statement": [],
    }
    with scratch(args.database_url) as s:
        for r in range(args.rounds):
            for k, ddl in variants.items():
                url = s.clone(f"v{r}", ddl)
                single[k].append(run_single(url, args.n))
                many[k].append(run_many(url, max(args.n // 1000, 3) * 2))
                if k == "base":
                    extra["base, RETURNING id"].append(run_single(url, args.n, "id"))
                s.drop(url)
                print(f"round {r} {k}: {single[k][-1]} {many[k][-1]}", flush=True)
            url = s.clone(f"pgq{r}", empty=True)
            install_pgqueuer(url)
            extra["pgqueuer enqueue, 1 per statement"].append(run_pgqueuer(url, args.n, 1))
            extra["pgqueuer enqueue, 1,000 per statement"].append(
                run_pgqueuer(url, args.n * 2, 1000)
            )
            s.drop(url)
    print()
    print(
        "| variant | µs backend CPU/job, 1 per statement | WAL B/job | "
        "µs backend CPU/job, 1,000 per statement | WAL B/job |"
    )
    print("|---|---|---|---|---|")
    for k in variants:
        print(
            f"| {k} | {median([x[0] for x in single[k]]):.0f} | "
            f"{median([x[1] for x in single[k]]):,.0f} | "
            f"{median([x[0] for x in many[k]]):.1f} | {median([x[1] for x in many[k]]):,.0f} |"
        )
    for k, xs in extra.items():
        if xs:
            print(
                f"| {k} | {median([x[0] for x in xs]):.1f} | "
                f"{median([x[1] for x in xs]):,.0f} | | |"
            )


if __name__ == "__main__":
    main()
