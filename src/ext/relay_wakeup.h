/*
 * relay_wakeup.h: waking the relay when a transaction that enqueued records commits.
 *
 * "Wakeup" here means setting the latch of the relay workers a transaction marked (the
 * relay of each lane it wrote, or all of them). A backend marks its transaction when it
 * enqueues; the wakeup happens once, at commit, and never for a transaction that
 * aborts, nor for a relay that is not listening. The shared
 * counter of commit wakeups (commits that asked for one) lets tests and operators see
 * that it happened.
 */
#ifndef RELAY_WAKEUP_H
#define RELAY_WAKEUP_H

#include "storage/latch.h"

#include "settings.h" /* MAX_RELAY_WORKERS */

void relay_wakeup_request_shmem(void);
void relay_wakeup_init_shmem(void);
void relay_wakeup_register_xact_callback(void);

/* Marks this transaction: its commit wakes every relay (an abort does not). */
void relay_wake_at_commit(void);

/*
 * The same for the relay that ships one lane of the log alone: a commit that wrote only
 * the log's lanes of one relay does not wake the others for an empty pass.
 */
void relay_wake_lane_at_commit(int lane);

/* The relay slot that ships a lane of the log. */
int relay_slot_of_lane(int lane);

/*
 * What the commits that woke a relay wrote: bit RELAY_MARK_LANE(l) for lane l of the log,
 * RELAY_MARK_ROWS for the row table (a commit that does not say which sets every bit).
 * relay_wakeup_take_marks returns the marks made for a slot since the last call and
 * clears them; a pass that reads what they name after taking them sees those commits.
 */
#define RELAY_MARK_LANE(lane) (1u << (lane))
#define RELAY_MARK_ROWS       (1u << 31)
uint32 relay_wakeup_take_marks(int slot);

/* Whether commits left marks for the slot that its relay has not taken yet. */
bool relay_wakeup_marks_pending(int slot);

/* Counts a pass and the lanes it read, for relay_passes(). */
void relay_count_pass(int lanes_read);

/*
 * Counts records Kafka may have stored without acknowledging them (timed out or purged
 * after being sent): each is sent again, so each may be a second copy.
 */
void relay_count_possible_duplicates(int records);

/* Called by relay workers (see the relay) to receive wakeups at the given slot. */
void relay_wakeup_register_latch(int slot, Latch *latch);

/* Whether commits wake the relay at the slot: off while it cannot ship anything. */
void relay_wakeup_listen(int slot, bool listen);

#endif
