/* One run of the C compiler, shared by the host target's two users of it:
 * fused kernels (fuse_compile.c) and custom C kernels (custom.c).
 *
 * tpu_cc_run writes the embedded headers and one source file into a new
 * directory under $TMPDIR (or /tmp), runs TORCH_TPU_CC (default "cc") with
 * the caller's flags under TORCH_TPU_COMPILE_TIMEOUT_S, and says what
 * happened; the caller publishes the library into the cache, then
 * tpu_cc_done removes the directory. A compiler that hangs is killed with
 * its process group (base/subprocess.c). */
#ifndef TPU_TARGETS_HOST_CC_H_
#define TPU_TARGETS_HOST_CC_H_

#include <stdbool.h>
#include <stdint.h>

#include "targets/host/fuse_headers.h"

typedef struct {
  const tpu_fuse_header_t* headers; /* written beside the source; the -I directory */
  int nheaders;
  const char* source_name;          /* the source's file name in the directory */
  const char* source;
  const char* flags;                /* the caller's optimization and ISA flags */
  const char* extra_flags;          /* more words after them, or NULL */
} tpu_cc_job_t;

typedef enum {
  TPU_CC_OK,        /* so_path holds the library */
  TPU_CC_SETUP,     /* the directory or a file could not be made: why */
  TPU_CC_NOT_RUN,   /* the compiler could not be started: why */
  TPU_CC_TIMEOUT,   /* killed after timeout_ms */
  TPU_CC_FAILED,    /* exit status or signal `code` (exited says which); log_path */
} tpu_cc_outcome_t;

typedef struct {
  tpu_cc_outcome_t outcome;
  bool exited;
  int code;
  int64_t timeout_ms;
  const char* compiler; /* the command's first word (points into this struct) */
  char why[600];
  char dir[4096];
  char so_path[4200];
  char log_path[4200];
  char words_[4096];
} tpu_cc_run_t;

/* TORCH_TPU_CC, default "cc" (the key of a cached library includes it). */
const char* tpu_cc_command(void);
/* TORCH_TPU_COMPILE_TIMEOUT_S in ms (default 120 s); -1: no limit. */
int64_t tpu_cc_timeout_ms(void);
/* Runs one compile; r->dir is set (and must be passed to tpu_cc_done) from
 * every outcome but TPU_CC_SETUP before the directory existed. */
void tpu_cc_run(const tpu_cc_job_t* job, tpu_cc_run_t* r);
/* Removes the run's directory and everything in it. */
void tpu_cc_done(tpu_cc_run_t* r);
/* The compiler's output, at most cap - 1 bytes, trailing blank lines cut,
 * the compile directory's path taken out (messages name the user's file). */
void tpu_cc_log(const tpu_cc_run_t* r, char* out, size_t cap);

#endif /* TPU_TARGETS_HOST_CC_H_ */
