"""Schema version 2: cordons that survive a restart, per-attempt replica status, rendezvous and scheduling feedback."""

STATEMENTS: tuple[str, ...] = (
    """CREATE TABLE cordons (
        cluster TEXT PRIMARY KEY,
        reason TEXT NOT NULL,
        actor TEXT NOT NULL,
        time REAL NOT NULL
    )""",
    # One row per replica of an attempt, replaced by each WorkloadStatus the agent sends.
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
        update_time REAL NOT NULL,
        PRIMARY KEY (job_id, attempt, pod_set, idx)
    )""",
    "ALTER TABLE attempts ADD COLUMN rendezvous TEXT NOT NULL DEFAULT ''",
    # The extender's last filter verdict for a pod of the attempt, as one line, and when it ran.
    "ALTER TABLE attempts ADD COLUMN feedback TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE attempts ADD COLUMN feedback_time REAL",
)
