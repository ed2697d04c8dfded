# wal_delivery: the Postgres extension (PGXS) and the wal-worker binary.
#
#   make            build both          make install   install the extension
#   make demo       run it end to end   make test      set up, build and run every test
#   make bench      run the benchmarks  make format    clang-format the C sources

EXTENSION  = wal_delivery
MODULE_big = wal_delivery
OBJS       = $(patsubst %.c,%.o,$(wildcard src/ext/*.c))
DATA       = $(wildcard sql/wal_delivery--*.sql)
# pg_regress tests (sql/NAME.sql, expected/NAME.out), run in this order.
REGRESS    = extension config enqueue state_machine retention security retries archive processing upgrade
REGRESS_OPTS = --load-extension=wal_delivery
# -Wextra, less the two checks every fmgr function (unused fcinfo) and every PG-style
# partial initialiser trips.
PG_CFLAGS  = -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror
PG_CPPFLAGS = -Isrc/ext
SHLIB_LINK = -lrdkafka -lcurl -lz

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PGXS tracks no header dependencies; rebuild the extension when any of its headers change.
$(OBJS): $(wildcard src/ext/*.h)

# ---------------------------------------------------------------- the workers
WORKER_SRCS  = $(wildcard src/workers/*.c src/workers/*/*.c)
WORKER_OBJS  = $(patsubst src/workers/%.c,build/workers/%.o,$(WORKER_SRCS))
WORKER_CFLAGS = -std=gnu11 -O2 -g -Wall -Wextra -Werror -Isrc/workers \
	-I$(shell $(PG_CONFIG) --includedir) -MMD -MP
WORKER_LIBS  = -lrdkafka -lpq -lcurl -ljansson -lmicrohttpd -lcrypto -lpthread -lm

all: bin/wal-worker

build/workers/%.o: src/workers/%.c
	@mkdir -p $(dir $@)
	$(CC) $(WORKER_CFLAGS) -c -o $@ $<

bin/wal-worker: $(WORKER_OBJS)
	@mkdir -p bin
	$(CC) -o $@ $^ $(WORKER_LIBS)

-include $(WORKER_OBJS:.o=.d)

clean: clean-workers
clean-workers:
	rm -rf build bin

# ---------------------------------------------------------------- the project's commands
.PHONY: setup test demo demo-stop bench format clean-workers

setup:
	tests/setup

test:
	tests/run

demo:
	demo/run

demo-stop:
	demo/stop

bench:
	bench/run

format:
	clang-format -i $(wildcard src/ext/*.[ch] src/workers/*.[ch] src/workers/*/*.[ch])
