"""Times in processing transitions are when the transition happened, not when the
transaction that made it began: a SQL batch runs every row of a batch in one
transaction, so a row that fails late in a long batch must still wait its whole backoff
from its failure (issue 29, item 5)."""

from conftest import connect
from process_helpers import make_processing_topic
from relay_helpers import ensure_extension


def pending_row(conn, topic, lease="30 seconds", backoff="2 seconds"):
    conn.execute("CREATE OR REPLACE FUNCTION public.clock_identity(b bytea) RETURNS bytea"
                 " LANGUAGE sql AS 'SELECT b'")
    make_processing_topic(conn, topic, "sql", "public.clock_identity",
                          processing_backoff=backoff, processing_lease=lease)
    return conn.execute("SELECT wal_enqueue(%s, '{}'::jsonb)", (topic,)).fetchone()[0]


def test_a_failure_late_in_a_long_transaction_waits_its_whole_backoff(unique):
    ensure_extension()
    topic = f"clock.fail.{unique}"
    with connect() as conn:
        row = pending_row(conn, topic)
    with connect(autocommit=False) as conn:
        claimed = conn.execute("SELECT id, lease_token FROM wal_delivery.claim_ready_to_process(10)"
                               " WHERE topic = %s", (topic,)).fetchone()
        assert claimed[0] == row
        conn.execute("SELECT pg_sleep(1.5)")  # the rows before it in the batch
        conn.execute("SELECT wal_delivery.fail_processing(%s, %s, 'late failure')", claimed)
        waits = conn.execute("SELECT extract(epoch FROM available_at - clock_timestamp())"
                             " FROM wal_delivery.outbox WHERE id = %s", (row,)).fetchone()[0]
        conn.commit()
    assert waits > 1.8, f"the backoff of 2 s ran from the transaction's start: {waits:.2f} s left"
