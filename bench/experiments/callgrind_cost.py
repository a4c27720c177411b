"""Scratch: instructions per enqueued / drained job, per schema variant (callgrind).

    uv run --group bench python bench/experiments/callgrind_cost.py [--n 400]
        [--only VARIANT...] [--drain]

CPU-time readings swing by 20-50 % on this shared 2-core machine; instruction counts
do not. A throwaway cluster (initdb in a temp dir, fsync off) gets one database per
variant (insert_cost.VARIANTS / drain_cost.VARIANTS applied to the migrated schema);
then each database is opened by a single-user backend (``postgres --single``) under
``valgrind --tool=callgrind`` running a script, once with N operations and once with
none: the difference over N is the instructions per job. Insert: ``PREPARE`` of
jobsd's ``jobs_insert`` then N ``EXECUTE``s (one autocommit statement each), and of
``jobs_insert_many`` with 100 rows. Drain (``--drain``): N jobs bulk-inserted first
(in both runs), then claims of 100 with ``jobs_claim_batch`` and their outcomes with
``jobs_finish_batch`` (lease ids read back in SQL).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from drain_cost import VARIANTS as DRAIN_VARIANTS
from insert_cost import VARIANTS as INSERT_VARIANTS

from jobsd.ids import uuid7
from jobsd.store.migrate import migrate_sync
from jobsd.store.sqlfiles import load_queries

BIN = Path("/usr/lib/postgresql/15/bin")
PORT = 55439
AS_PG = ["runuser", "-u", "postgres", "--"]  # Postgres refuses to run as root


def _literal_insert() -> str:
    text = load_queries()["jobs_insert"]
    for name, value in {
        "id": "$1",
        "payload": "$2::jsonb",
        "org_id": "'bench'",
        "type": "'noop'",
        "queue": "'default'",
        "dedup_key": "NULL",
        "run_after": "NULL",
        "priority": "0",
        "concurrency_key": "NULL",
        "trace_context": "NULL",
        "blocked": "false",
    }.items():
        text = text.replace(f"%({name})s", value)
    return text.replace("%(payload)s::jsonb::jsonb", "$2::jsonb")


def _many_insert() -> str:
    text = load_queries()["jobs_insert_many"]
    for name, value in {
        "ids": "$1",
        "org_ids": "array_fill('bench'::text, ARRAY[$3])",
        "types": "array_fill('noop'::text, ARRAY[$3])",
        "queues": "array_fill('default'::text, ARRAY[$3])",
        "dedup_keys": "array_fill(NULL::text, ARRAY[$3])",
        "payloads": "$2",
        "run_afters": "array_fill(NULL::timestamptz, ARRAY[$3])",
        "priorities": "array_fill(0, ARRAY[$3])",
        "concurrency_keys": "array_fill(NULL::text, ARRAY[$3])",
        "trace_contexts": "array_fill(NULL::jsonb, ARRAY[$3])",
    }.items():
        text = text.replace(f"%({name})s", value)
    return text


def _strip(sql: str) -> str:
    return "\n".join(x for x in sql.splitlines() if not x.lstrip().startswith("--")).strip()


def insert_script(n: int, batch: int) -> str:
    """n single inserts, then n // batch inserts of ``batch`` rows (0: none)."""
    parts = [
        f"PREPARE ins(uuid, text) AS {_strip(_literal_insert()).rstrip(';')}",
        f"PREPARE many(uuid[], text[], int) AS {_strip(_many_insert()).rstrip(';')}",
    ]
    for i in range(n):
        parts.append(f"EXECUTE ins('{uuid7()}', '{{\"i\":{i}}}')")
    for b in range(n // batch if batch else 0):
        ids = "ARRAY[" + ",".join(f"'{uuid7()}'::uuid" for _ in range(batch)) + "]"
        pays = "ARRAY[" + ",".join(f"'{{\"i\":{b * batch + k}}}'" for k in range(batch)) + "]"
        parts.append(f"EXECUTE many({ids}, {pays}, {batch})")
    return ";\n\n".join(parts) + ";\n\n"


def drain_script(n: int, batch: int, rounds: int) -> str:
    q = load_queries()
    claim = _strip(q["jobs_claim_batch"]).rstrip(";")
    for name, value in {
        "limit": "$1",
        "worker_id": "'exp'",
        "queues": "NULL",
        "keep_dedup_types": "'{}'",
        "limit_types": "'{}'",
        "limit_values": "'{}'",
        "types": "NULL",
        "free": "NULL",
        "at_most_once_types": "'{}'",
        "relaxed_commit": "true",
        "reserve_s": "2",
    }.items():
        claim = claim.replace(f"%({name})s", value)
    finish = (
        _strip(q["jobs_finish_batch"])
        .rstrip(";")
        .replace("%(results)s", "$1")
        .replace("%(confirm)s", "false")
        .replace("%(errors_kept)s", "10")
    )
    parts = [
        f"PREPARE many(uuid[], text[], int) AS {_strip(_many_insert()).rstrip(';')}",
        f"PREPARE claim(int) AS {claim}",
        f"PREPARE fin(jsonb) AS {finish}",
    ]
    for b in range(n // 100):
        ids = "ARRAY[" + ",".join(f"'{uuid7()}'::uuid" for _ in range(100)) + "]"
        pays = "ARRAY[" + ",".join(f"'{{\"i\":{b * 100 + k}}}'" for k in range(100)) + "]"
        parts.append(f"EXECUTE many({ids}, {pays}, 100)")
    results = (
        "(SELECT jsonb_agg(jsonb_build_object('id', id, 'lease_id', lease_id,"
        " 'status', 'succeeded')) FROM jobsd.jobs WHERE status = 'running')"
    )
    for _ in range(rounds):
        parts.append(f"EXECUTE claim({batch})")
        parts.append(f"EXECUTE fin({results})")
    return ";\n\n".join(parts) + ";\n\n"


def instructions(data: Path, db: str, script: str, work: Path) -> int:
    out = work / f"cg.{db}.{time.monotonic_ns()}"
    cmd = [
        *AS_PG,
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        str(BIN / "postgres"),
        "--single",
        "-j",
        "-D",
        str(data),
        "-c",
        "fsync=off",
        db,
    ]
    subprocess.run(
        cmd,
        input=script,
        text=True,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    text = out.read_text(errors="replace")
    out.unlink()
    m = re.search(r"^totals:\s+(\d+)", text, re.M) or re.search(r"^summary:\s+(\d+)", text, re.M)
    assert m, "no totals in callgrind output"
    return int(m.group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--drain", action="store_true")
    parser.add_argument("--only", nargs="+")
    args = parser.parse_args()
    variants = DRAIN_VARIANTS if args.drain else INSERT_VARIANTS
    variants = {k: v for k, v in variants.items() if not args.only or k in args.only}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.chown(work, "postgres")
        data = work / "data"
        subprocess.run(
            [*AS_PG, str(BIN / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(
            [
                *AS_PG,
                str(BIN / "pg_ctl"),
                "-D",
                str(data),
                "-w",
                "-o",
                f"-p {PORT} -k {tmp} -c fsync=off",
                "start",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        admin = f"postgresql://postgres@127.0.0.1:{PORT}/postgres"
        names: dict[str, str] = {}
        try:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute("CREATE DATABASE tpl")
            migrate_sync(f"postgresql://postgres@127.0.0.1:{PORT}/tpl")
            for k, (name, ddl) in enumerate(variants.items()):
                db = f"v{k}"
                names[name] = db
                with psycopg.connect(admin, autocommit=True) as conn:
                    conn.execute(f"CREATE DATABASE {db} TEMPLATE tpl")  # type: ignore[arg-type]
                if ddl:
                    with psycopg.connect(
                        f"postgresql://postgres@127.0.0.1:{PORT}/{db}", autocommit=True
                    ) as conn:
                        conn.execute(ddl)  # type: ignore[arg-type]
        finally:
            subprocess.run(
                [*AS_PG, str(BIN / "pg_ctl"), "-D", str(data), "-w", "stop"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        results: dict[str, dict[str, float]] = {}
        for name, db in names.items():
            if args.drain:
                rounds = args.n // args.batch
                empty = instructions(data, db, drain_script(args.n, args.batch, 0), work)
                full = instructions(data, db, drain_script(args.n, args.batch, rounds), work)
                results[name] = {"drain": (full - empty) / args.n}
            else:
                empty = instructions(data, db, insert_script(0, 0), work)
                single = instructions(data, db, insert_script(args.n, 0), work)
                both = instructions(data, db, insert_script(args.n, args.batch), work)
                results[name] = {
                    "single": (single - empty) / args.n,
                    "many": (both - single) / args.n,
                }
            print(name, json.dumps(results[name]), flush=True)
    print()
    if args.drain:
        print(
            f"| variant | instructions per drained job (claim {args.batch} + finish "
            f"{args.batch}) | vs base |"
        )
        print("|---|---|---|")
        base = results.get("base", {}).get("drain")
        for name, r in results.items():
            rel = f"{r['drain'] / base - 1:+.1%}" if base else ""
            print(f"| {name} | {r['drain'] / 1e3:,.0f} k | {rel} |")
    else:
        print(
            f"| variant | instructions per job, 1 per statement | vs base | "
            f"per job, {args.batch} per statement | vs base |"
        )
        print("|---|---|---|---|---|")
        b = results.get("base")
        for name, r in results.items():
            rel1 = f"{r['single'] / b['single'] - 1:+.1%}" if b else ""
            rel2 = f"{r['many'] / b['many'] - 1:+.1%}" if b else ""
            print(
                f"| {name} | {r['single'] / 1e3:,.0f} k | {rel1} | "
                f"{r['many'] / 1e3:,.0f} k | {rel2} |"
            )


if __name__ == "__main__":
    main()
