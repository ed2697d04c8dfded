/*
 * file_limit.h: the process's open-file limit (RLIMIT_NOFILE), raised for servers that
 * hold many connections.
 *
 * systemd starts services with a soft limit of 1024 and a much higher hard one: a server
 * that accepts more connections than its soft limit allows fails accept() with EMFILE,
 * and every client beyond waits unanswered, however few connections are busy.
 */
#ifndef WAL_FILE_LIMIT_H
#define WAL_FILE_LIMIT_H

/*
 * Raises the soft limit toward wanted (never above the hard limit, never lowering it);
 * returns the soft limit in force afterwards (wanted when it is unlimited).
 */
long file_limit_raise(long wanted);

#endif
