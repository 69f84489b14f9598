"""PostgreSQL schema version 2: the same as the SQLite store's version 2, in PostgreSQL types."""

STATEMENTS: tuple[str, ...] = (
    """CREATE TABLE cordons (
        cluster TEXT PRIMARY KEY,
        reason TEXT NOT NULL,
        actor TEXT NOT NULL,
        time DOUBLE PRECISION NOT NULL
    )""",
    """CREATE TABLE replicas (
        job_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        pod_set TEXT NOT NULL,
        idx INTEGER NOT NULL,
        pod TEXT NOT NULL,
        node TEXT NOT NULL,
        phase TEXT NOT NULL,
        exit_code INTEGER,
        reason TEXT NOT NULL,
        message TEXT NOT NULL,
        update_time DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (job_id, attempt, pod_set, idx)
    )""",
    "ALTER TABLE attempts ADD COLUMN rendezvous TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE attempts ADD COLUMN feedback TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE attempts ADD COLUMN feedback_time DOUBLE PRECISION",
)
