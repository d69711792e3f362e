/* Child processes whose lifetime is bounded (the fused-kernel compiler).
 *
 * tpu_subprocess_run starts a program (no shell: argv as given, argv[0] a
 * path or a name looked up in PATH) and waits for it up to a timeout. The
 * program runs in a process group of its own under a small guard process
 * (a fork of the caller). The guard kills the program's whole group, then
 * deletes the given paths, when
 *   - the caller's timeout passes,
 *   - the calling process exits (an atexit handler signals every guard), or
 *   - the calling process dies in any way, kill -9 included (the guard has
 *     PR_SET_PDEATHSIG set).
 * The caller's signal dispositions are never touched (unlike system(), which
 * ignores SIGINT and SIGQUIT in the whole process while it waits), so Ctrl-C
 * reaches Python while a compile runs on another thread. The program's stdin
 * is /dev/null and its stdout and stderr go to a log file; it runs with the
 * default dispositions for SIGINT, SIGQUIT and SIGPIPE and without core
 * dumps.
 */
#ifndef TPU_BASE_SUBPROCESS_H_
#define TPU_BASE_SUBPROCESS_H_

#include <stdbool.h>
#include <stdint.h>

#include "tpu/status.h"

typedef struct tpu_subprocess_result {
  bool timed_out; /* killed (with its group) at the timeout */
  bool exited;    /* ended by exit(); code is its exit status */
  int code;       /* exit status, or the signal that ended it when !exited */
} tpu_subprocess_result_t;

/* Runs argv (NULL-terminated) with stdout and stderr appended to log_path
 * (NULL: /dev/null). timeout_ms <= 0: no time limit. remove (NULL-terminated,
 * may be NULL) lists files, then directories, that the guard deletes when it
 * has to kill the program (the caller deletes them itself after a normal
 * end). Errors: INVALID_ARGUMENT when argv[0] is not an executable file,
 * INTERNAL when no process could be started. */
tpu_status_t tpu_subprocess_run(const char* const* argv, const char* log_path,
                                int64_t timeout_ms, const char* const* remove,
                                tpu_subprocess_result_t* out_result) TPU_MUST_USE;

/* Kills every program started by tpu_subprocess_run that still runs (their
 * guards kill the groups and clean up). Runs at exit on its own. */
void tpu_subprocess_kill_all(void);

#endif /* TPU_BASE_SUBPROCESS_H_ */
