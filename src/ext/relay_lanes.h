/*
 * relay_lanes.h: the log's part of a relay pass (relay_lanes.c).
 */
#ifndef RELAY_LANES_H
#define RELAY_LANES_H

#include "relay_rows.h"

/*
 * Ships the next batch of each lane the relay at slot owns and marks names
 * (RELAY_MARK_LANE bits), and moves their cursors, inside the pass transaction.
 */
void ship_log(int slot, uint32 marks, PassResult *result);

#endif
