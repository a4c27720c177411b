"""Scratch: what the insert's triggers and ON CONFLICT cost its backend, on today's schema.

    uv run --group bench python bench/experiments/insert_triggers.py [--database-url URL]

Each variant is the migrated schema with a trigger dropped, or the statement with
``ON CONFLICT DO NOTHING`` left out, each in its own database; the figure is the CPU of
the backend that runs ``jobs_insert`` one job per autocommit statement (prepared), and
the WAL per job; medians of three interleaved rounds (``insert_cost.run_single``).
"""

from __future__ import annotations

import argparse

import insert_cost
from common import DEFAULT_URL, median, scratch

from jobsd.store.sqlfiles import load_queries

RETURNING = "id, status, run_after, created_at"
TRIGGERS = {
    "base": "",
    "no notify trigger": "DROP TRIGGER jobs_notify_insert ON jobsd.jobs;",
    "no after-insert trigger (history, checks)": "DROP TRIGGER jobs_after_insert ON jobsd.jobs;",
    "no statement triggers": (
        "DROP TRIGGER jobs_notify_insert ON jobsd.jobs;"
        "DROP TRIGGER jobs_after_insert ON jobsd.jobs;"
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--n", type=int, default=3000)
    args = parser.parse_args()
    text = load_queries()["jobs_insert"]
    statements = {
        "as shipped": text,
        "no ON CONFLICT": text.replace("ON CONFLICT DO NOTHING\n", ""),
    }
    figures: dict[str, list[tuple[float, float]]] = {}
    with scratch(args.database_url) as s:
        for r in range(3):
            for name, ddl in TRIGGERS.items():
                url = s.clone(f"t{r}", ddl)
                figures.setdefault(name, []).append(
                    insert_cost.run_single(url, args.n, returning=RETURNING)
                )
            for name, statement in statements.items():
                url = s.clone(f"s{r}")
                insert_cost.load_queries = lambda statement=statement: {"jobs_insert": statement}
                figures.setdefault(f"statement {name}", []).append(
                    insert_cost.run_single(url, args.n, returning=RETURNING)
                )
                insert_cost.load_queries = load_queries
    print("| variant | µs backend CPU/job | WAL B/job |\n|---|---|---|")
    for name, runs in figures.items():
        cpu, wal = median([c for c, _ in runs]), median([w for _, w in runs])
        print(f"| {name} | {cpu:.0f} | {wal:.0f} |")


if __name__ == "__main__":
    main()
