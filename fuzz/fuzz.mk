# fuzz/fuzz.mk: the libFuzzer targets (fuzz/README.md), included from the Makefile.
#
#   make fuzz [FUZZ_SECONDS=60] [FUZZ_TARGETS="retry_after s3_answer"]
#       builds every target into build/fuzz/ and runs each for FUZZ_SECONDS on its corpus
#       (fuzz/corpus/<target> copied into build/fuzz/corpus/<target>, which keeps what
#       the run finds); fails, naming the input, when a target crashes (the others still
#       run). FUZZ_SECONDS=0 runs the corpus once and stops (the regression inputs only).
#   make fuzz-build     the targets only
#
# clang with libFuzzer (Debian: clang-14, libclang-rt-14-dev); each target links only its
# parser's sources and their small dependencies, built here with ASan and UBSan.

FUZZ_CC      ?= $(firstword $(shell command -v clang-14 clang 2>/dev/null) clang)
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= record_contract ingest_batch kafka_headers admin_config retry_after s3_answer \
	console_payload
FUZZ_DIR      = build/fuzz

FUZZ_SANITIZE = -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ_CFLAGS   = -std=gnu11 -g -O1 -fno-omit-frame-pointer $(FUZZ_SANITIZE) -fsanitize=fuzzer-no-link \
	-Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers \
	-Ifuzz -Isrc/workers -Isrc $(MHD_CFLAGS) -I$(shell $(PG_CONFIG) --includedir) -MMD -MP \
	-DWAL_DELIVERY_VERSION='"$(EXTVERSION)"'
# The extension's code compiles against the server's headers (s3_answer).
FUZZ_PG_CFLAGS = -Isrc/ext -I$(shell $(PG_CONFIG) --includedir-server) -Wno-ignored-attributes

# What each target links besides fuzz/<target>.c, and its longest input (-max_len). The
# workers' targets take src/shared whole: the record contract is every door's.
FUZZ_SRCS_record_contract = src/shared/record_contract.c src/shared/trace_context.c src/shared/utf8.c
FUZZ_LIBS_record_contract =
FUZZ_MAX_LEN_record_contract = 4096

FUZZ_SRCS_ingest_batch = src/workers/ingest/ingest_parse.c src/workers/ingest/ingest_record.c \
	src/workers/ingest/ingest_json_member.c \
	src/workers/ingest/ingest_request.c src/workers/ingest/ingest_catalog.c \
	src/workers/ingest/ingest_metrics.c src/workers/common/metrics.c \
	src/workers/common/random_bytes.c \
	src/workers/common/text_buffer.c src/workers/common/log.c \
	src/shared/record_contract.c src/shared/trace_context.c src/shared/utf8.c
FUZZ_LIBS_ingest_batch = -ljansson $(MHD_LIBS) -lcrypto -lpthread -lm
FUZZ_MAX_LEN_ingest_batch = 16384

FUZZ_SRCS_kafka_headers = src/workers/common/handoff.c src/workers/retry/retry_message.c \
	src/workers/dlq/dlq_message.c src/workers/common/control_plane.c \
	src/workers/common/kafka_conf.c src/workers/common/fatal_error_hook.c \
	src/workers/common/stop_signal.c src/workers/common/sd_notify.c src/workers/common/metrics.c \
	src/workers/common/text_buffer.c src/workers/common/log.c \
	src/shared/record_contract.c src/shared/trace_context.c src/shared/utf8.c
FUZZ_LIBS_kafka_headers = -lrdkafka -ljansson -lpq -lcurl -lpthread -lm
FUZZ_MAX_LEN_kafka_headers = 4096

FUZZ_SRCS_admin_config = src/workers/common/control_plane.c
FUZZ_LIBS_admin_config = -ljansson -lpq -lcurl
FUZZ_MAX_LEN_admin_config = 16384

FUZZ_SRCS_retry_after = src/workers/common/webhook.c src/workers/common/header_lines.c
FUZZ_LIBS_retry_after = -lcurl -lcrypto
FUZZ_MAX_LEN_retry_after = 256

FUZZ_SRCS_console_payload = src/workers/console/console_payload.c src/shared/utf8.c
FUZZ_LIBS_console_payload = -ljansson
FUZZ_MAX_LEN_console_payload = 131072

# fuzz/s3_answer.c includes src/ext/s3_request.c (its answer handling is static);
# fuzz/pg_stubs.c stands in for the few backend functions it and gzip_buffer.c call.
FUZZ_SRCS_s3_answer = src/ext/gzip_buffer.c fuzz/pg_stubs.c
FUZZ_LIBS_s3_answer = -lcurl -lz
FUZZ_MAX_LEN_s3_answer = 8192
$(FUZZ_DIR)/obj/fuzz/s3_answer.o $(FUZZ_DIR)/obj/fuzz/pg_stubs.o $(FUZZ_DIR)/obj/src/ext/%.o: \
	FUZZ_EXTRA_CFLAGS = $(FUZZ_PG_CFLAGS)

$(FUZZ_DIR)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_EXTRA_CFLAGS) -c -o $@ $<

FUZZ_ALL_OBJS =

define fuzz_target
FUZZ_OBJS_$(1) = $$(patsubst %.c,$(FUZZ_DIR)/obj/%.o,fuzz/$(1).c $$(FUZZ_SRCS_$(1)))
FUZZ_ALL_OBJS += $$(FUZZ_OBJS_$(1))

$(FUZZ_DIR)/$(1): $$(FUZZ_OBJS_$(1))
	$$(FUZZ_CC) $$(FUZZ_SANITIZE) -fsanitize=fuzzer -o $$@ $$^ $$(FUZZ_LIBS_$(1))

# Runs on build/fuzz/corpus/$(1) (the seeds copied in, what earlier runs found kept);
# a crash leaves its input in build/fuzz/crashes/$(1)/ and fails.
fuzz-run-$(1): $(FUZZ_DIR)/$(1)
	@rm -rf $(FUZZ_DIR)/crashes/$(1) && mkdir -p $(FUZZ_DIR)/crashes/$(1) $(FUZZ_DIR)/corpus/$(1)
	@cp fuzz/corpus/$(1)/* $(FUZZ_DIR)/corpus/$(1)/
	@echo "fuzz: $(1) $(if $(filter 0,$(FUZZ_SECONDS)),on its corpus only,for $(FUZZ_SECONDS) s) (log: $(FUZZ_DIR)/$(1).log)"
	@if $(FUZZ_DIR)/$(1) $(if $(filter 0,$(FUZZ_SECONDS)),-runs=0,-max_total_time=$(FUZZ_SECONDS)) \
	    -max_len=$(FUZZ_MAX_LEN_$(1)) -timeout=25 -print_final_stats=1 \
	    -artifact_prefix=$(FUZZ_DIR)/crashes/$(1)/ $(FUZZ_DIR)/corpus/$(1) >$(FUZZ_DIR)/$(1).log 2>&1; then \
	  sed -n 's/^#\([0-9]*\).*DONE *cov: \([0-9]*\) ft: \([0-9]*\) corp: \([0-9]*\).*/fuzz: $(1): \1 runs, cov \2, ft \3, corpus \4: no crash/p' $(FUZZ_DIR)/$(1).log | tail -1; \
	else \
	  tail -60 $(FUZZ_DIR)/$(1).log >&2; \
	  echo "fuzz: $(1) FAILED; the input: $$$$(sed -n 's/.*Test unit written to \(.*\)/\1/p' $(FUZZ_DIR)/$(1).log | tail -1)" >&2; \
	  echo "  reproduce: $(FUZZ_DIR)/$(1) <that file>; keep it: fuzz/README.md" >&2; \
	  exit 1; \
	fi
endef

$(foreach t,$(FUZZ_TARGETS),$(eval $(call fuzz_target,$(t))))

fuzz-build: $(addprefix $(FUZZ_DIR)/,$(FUZZ_TARGETS))

# Every target runs even when one crashes; the run fails at the end, naming them.
fuzz: fuzz-build
	@crashed=; for t in $(FUZZ_TARGETS); do \
	  $(MAKE) --no-print-directory fuzz-run-$$t || crashed="$$crashed $$t"; \
	done; \
	if [ -n "$$crashed" ]; then echo "fuzz: FAILED:$$crashed (inputs named above)" >&2; exit 1; fi

.PHONY: fuzz-build $(addprefix fuzz-run-,$(FUZZ_TARGETS))

-include $(FUZZ_ALL_OBJS:.o=.d)
