build/workers/common/log.o: src/workers/common/log.c \
 src/workers/common/log.h
src/workers/common/log.h:
