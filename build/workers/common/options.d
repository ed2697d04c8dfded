build/workers/common/options.o: src/workers/common/options.c \
 src/workers/common/options.h
src/workers/common/options.h:
