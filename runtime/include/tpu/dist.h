/* TorchTPU runtime: the collective transport between the processes of a host
 * (runtime/dist/shm.c).
 *
 * A communicator is one shared-memory segment that every rank of a group maps:
 * a control block per rank (a monotone phase counter, the rank's pid, a
 * descriptor of the collective it is in) and a data area of one staging slot
 * per rank plus a result slot. A collective is a fixed sequence of steps;
 * after each step a rank bumps its phase and waits until every rank has
 * reached it. Data larger than a slot goes through in rounds.
 *
 * Reductions: each rank reduces one stretch of every round, over the ranks'
 * slots in rank order 0, 1, ..., size-1, accumulating in float32 for bfloat16
 * and float16 (rounded once), so every rank receives the same bits, in every
 * run. The functions here act on host-addressable memory on the calling
 * thread; the bridge queues them on a device stream.
 *
 * Where the kernel allows it, the data does not go through the slots: the
 * ranks copy straight between each other's buffers (tpu_dist_comm_direct).
 *
 * Nothing hangs: every wait gives up after the communicator's timeout, and
 * sooner when a peer's process has exited or a peer aborted, with a message
 * naming the collective and the ranks. The segment's name is unlinked as soon
 * as all ranks have attached, so no segment outlives the processes; one left
 * by a creator that died before that is removed by the next creation.
 */
#ifndef TPU_DIST_H_
#define TPU_DIST_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tpu/status.h"
#include "tpu/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpu_dist_comm tpu_dist_comm_t;

typedef enum tpu_dist_redop {
  TPU_DIST_SUM = 0,
  TPU_DIST_PRODUCT = 1,
  TPU_DIST_MIN = 2,
  TPU_DIST_MAX = 3,
  TPU_DIST_BAND = 4,
  TPU_DIST_BOR = 5,
  TPU_DIST_BXOR = 6,
  TPU_DIST_AVG = 7,
  TPU_DIST_PREMUL_SUM = 8, /* sum of factor * x */
} tpu_dist_redop_t;

/* Zero-initialisable: 0 means the default. */
typedef struct tpu_dist_options {
  size_t slot_bytes;   /* staging bytes per rank (default 4 MiB, or TORCH_TPU_DIST_SLOT_BYTES) */
  int64_t timeout_ms;  /* of every wait (default 600000) */
} tpu_dist_options_t;

/* A fresh segment name for a group ("/tpu_dist.<pid>.<n>.<random>"), written
 * into out (at least 64 bytes). The creating rank makes it and hands it to the
 * others (the bridge: through the process group's store). */
void tpu_dist_make_name(char* out, size_t out_size);

/* Rank 0 creates the segment `name` (removing segments of this kind left by
 * processes that no longer exist); the others attach to it, waiting for it to
 * appear. Returns once all `size` ranks have attached. */
tpu_status_t tpu_dist_comm_create(const char* name, int rank, int size,
                                  const tpu_dist_options_t* opts,
                                  tpu_dist_comm_t** out_comm) TPU_MUST_USE;
/* Unmaps the segment (NULL is ignored). */
void tpu_dist_comm_destroy(tpu_dist_comm_t* c);
int tpu_dist_comm_rank(const tpu_dist_comm_t* c);
int tpu_dist_comm_size(const tpu_dist_comm_t* c);
void tpu_dist_comm_set_timeout(tpu_dist_comm_t* c, int64_t timeout_ms);
/* Marks the communicator failed for every rank: their waits return an error
 * quoting `why`, and so does every later collective. */
void tpu_dist_comm_abort(tpu_dist_comm_t* c, const char* why);
/* Collectives completed by this rank, and of those, how many moved their data
 * by direct copies between the ranks' memory. */
uint64_t tpu_dist_comm_count(const tpu_dist_comm_t* c);
uint64_t tpu_dist_comm_direct_count(const tpu_dist_comm_t* c);
/* Whether the group uses direct copies: every rank may read and write every
 * other's memory (process_vm_readv/writev; not in a sandbox that forbids it,
 * nor with TORCH_TPU_DIST_DIRECT=0 on any rank). Then the collectives whose
 * ranks each publish one buffer (pieces back to back for scatter,
 * reduce_scatter and all_to_all) and carry at least
 * TORCH_TPU_DIST_DIRECT_MIN_BYTES (rank 0's; default 1 MiB) skip the slots. */
bool tpu_dist_comm_direct(const tpu_dist_comm_t* c);

/* Whether `op` is defined on `dt` (bitwise ops: integers and bool only; AVG:
 * not bool). */
bool tpu_dist_redop_supported(tpu_dist_redop_t op, tpu_dtype_t dt);
const char* tpu_dist_redop_name(tpu_dist_redop_t op);

/* The collectives. `count` is in elements of `dt`; buffers are dense. Every
 * rank calls the same collectives in the same order with matching sizes (they
 * are compared first; a mismatch fails on every rank, naming both). */

/* buf = op over ranks of buf (in place). `factor` scales each input for
 * PREMUL_SUM. */
tpu_status_t tpu_dist_all_reduce(tpu_dist_comm_t* c, void* buf, int64_t count, tpu_dtype_t dt,
                                 tpu_dist_redop_t op, double factor) TPU_MUST_USE;
/* Like all_reduce, but only `root`'s buf receives the result. */
tpu_status_t tpu_dist_reduce(tpu_dist_comm_t* c, void* buf, int64_t count, tpu_dtype_t dt,
                             tpu_dist_redop_t op, double factor, int root) TPU_MUST_USE;
tpu_status_t tpu_dist_broadcast(tpu_dist_comm_t* c, void* buf, int64_t count, tpu_dtype_t dt,
                                int root) TPU_MUST_USE;
/* outs[i] (size pointers, count elements each) = rank i's in. */
tpu_status_t tpu_dist_all_gather(tpu_dist_comm_t* c, const void* in, void* const* outs,
                                 int64_t count, tpu_dtype_t dt) TPU_MUST_USE;
/* Like all_gather into root's outs only (outs may be NULL elsewhere). */
tpu_status_t tpu_dist_gather(tpu_dist_comm_t* c, const void* in, void* const* outs,
                             int64_t count, tpu_dtype_t dt, int root) TPU_MUST_USE;
/* out = root's ins[rank] (ins may be NULL elsewhere). */
tpu_status_t tpu_dist_scatter(tpu_dist_comm_t* c, const void* const* ins, void* out,
                              int64_t count, tpu_dtype_t dt, int root) TPU_MUST_USE;
/* out = op over ranks i of rank i's ins[rank] (size pointers, count elements each). */
tpu_status_t tpu_dist_reduce_scatter(tpu_dist_comm_t* c, const void* const* ins, void* out,
                                     int64_t count, tpu_dtype_t dt, tpu_dist_redop_t op,
                                     double factor) TPU_MUST_USE;
/* outs[i] (out_counts[i] elements) = rank i's ins[rank] (its in_counts[rank]);
 * the counts must agree pairwise. */
tpu_status_t tpu_dist_all_to_all(tpu_dist_comm_t* c, const void* const* ins,
                                 const int64_t* in_counts, void* const* outs,
                                 const int64_t* out_counts, tpu_dtype_t dt) TPU_MUST_USE;
tpu_status_t tpu_dist_barrier(tpu_dist_comm_t* c) TPU_MUST_USE;

/* Point-to-point, outside the collectives' order: `bytes` from this rank to
 * `dst` / from `src`. Messages of a pair match in order; the receiver checks
 * the size and the tag (-1: any) and aborts the group on a mismatch. send
 * returns once the receiver has the data. One thread at a time per peer and
 * direction. */
tpu_status_t tpu_dist_send(tpu_dist_comm_t* c, const void* buf, int64_t bytes, int dst,
                           int tag) TPU_MUST_USE;
tpu_status_t tpu_dist_recv(tpu_dist_comm_t* c, void* buf, int64_t bytes, int src,
                           int tag) TPU_MUST_USE;

/* The reduction kernel of the collectives, exposed for tests: dst[k] = op
 * over i in 0..n-1 of srcs[i][k] (in that order), `count` elements. */
tpu_status_t tpu_dist_reduce_block(void* dst, const void* const* srcs, int n, int64_t count,
                                   tpu_dtype_t dt, tpu_dist_redop_t op, double factor,
                                   int avg_divisor) TPU_MUST_USE;

#ifdef __cplusplus
}
#endif
#endif /* TPU_DIST_H_ */
