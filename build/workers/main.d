build/workers/main.o: src/workers/main.c src/workers/common/log.h \
 src/workers/common/options.h
src/workers/common/log.h:
src/workers/common/options.h:
