/* The shared-memory collective transport of a host (tpu/dist.h).
 *
 * Segment layout: a header page, one 128-byte control block per rank, then
 * (page-aligned) size + 1 slots of slot_bytes: rank i's staging slot i and
 * the result slot. Every step of a collective ends with post (the rank's
 * phase counter += 1, release) and wait_all (every rank's phase >= ours,
 * acquire): all ranks run the same steps, so the counters agree. A slot is
 * written only after a wait that proves every reader of its previous
 * contents has passed the step that read it.
 *
 * The descriptor of a collective (kind, dtype, count, root, op) is written
 * into one of two per-rank copies chosen by the collective's sequence number,
 * before the first step: a rank that finishes collective k can write k + 1's
 * while a slower one still reads k's, and it cannot reach k + 2 before the
 * slower one has posted k + 1.
 *
 * Direct copies: where the kernel lets the ranks read and write each other's
 * memory (process_vm_readv/writev, probed once at creation), the collectives
 * that can move their data straight between the ranks' buffers do so instead
 * of staging it through the slots: every rank publishes its buffer's address
 * in its descriptor, and a reduction reads the peers' part of its stretch
 * into a cache-sized scratch block, reduces it in rank order with its own
 * part and writes the result into the peers' buffers. Half the memory
 * traffic of staging, and two steps per collective. Every rank takes the
 * same path: the choice depends only on what all of them published.
 */
#include "tpu/dist.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/cpu.h"
#include "base/env.h"

#define DIST_MAGIC 0x3174736964757074ull /* "tpudist1" */
#define DIST_PREFIX "tpu_dist."
#define HDR_BYTES 4096
#define CTL_BYTES 128
#define DEFAULT_SLOT (4u << 20)
#define DEFAULT_TIMEOUT_MS 600000
/* The most of a peer's part of a reduction read at a time. 512 KiB (was 128):
 * a 64 MiB float32 all_reduce of 2 ranks took 8-10 ms with 128 KiB blocks
 * and 7 ms with 512 KiB (a quarter of the process_vm calls, each pinning the
 * remote pages it copies); 1 MiB varied more (6-10 ms). */
#define DIRECT_BLOCK (512u << 10)
#define PROBE_WORD 0x65626f7270747064ull

enum coll_kind {
  K_BARRIER = 1, K_ALL_REDUCE, K_REDUCE, K_BROADCAST, K_ALL_GATHER, K_GATHER, K_SCATTER,
  K_REDUCE_SCATTER, K_ALL_TO_ALL,
};
static const char* const kind_names[] = {
    "?", "barrier", "all_reduce", "reduce", "broadcast", "all_gather", "gather", "scatter",
    "reduce_scatter", "all_to_all"};

typedef struct desc {
  uint64_t seq;
  int32_t kind, dtype, root, op;
  int64_t count;
  uint64_t addr; /* the rank's buffer for direct copies (0: stage through the slots) */
} desc_t;

/* A monotone counter another process waits on: spinning first, then asleep
 * on a futex in the shared segment (`wake` is bumped after every advance and
 * woken when someone sleeps on it). */
typedef struct counter {
  _Atomic uint64_t value;
  _Atomic uint32_t wake;
  _Atomic uint32_t waiters;
} counter_t;

typedef struct ctl {
  counter_t phase;
  _Atomic int32_t pid;
  _Atomic int32_t direct; /* 1: this rank can read and write every peer; 2: it cannot */
  uint64_t probe_addr;    /* a word of this process that peers read to probe */
  desc_t desc[2];
} ctl_t;
_Static_assert(sizeof(ctl_t) <= CTL_BYTES, "control block");

typedef struct hdr {
  _Atomic uint64_t magic;
  int32_t size;
  int32_t pad_;
  uint64_t slot_bytes;
  _Atomic int32_t attached;
  _Atomic int32_t aborted;
  int64_t direct_min; /* rank 0's smallest collective (bytes) for direct copies */
  char why[512];
} hdr_t;
_Static_assert(sizeof(hdr_t) <= HDR_BYTES, "header");

struct tpu_dist_comm {
  char name[96];
  int rank, size;
  size_t slot_bytes, map_bytes;
  int64_t timeout_ms;
  unsigned char* base;
  hdr_t* hdr;
  uint64_t phase; /* this rank's phase (the value last posted) */
  uint64_t seq;   /* collectives begun */
  uint64_t done;  /* collectives completed */
  uint64_t direct_done; /* of which by direct copies */
  const char* what; /* the collective in progress, for messages */
  bool direct;      /* every rank can reach every other's memory */
  size_t block;           /* bytes of a direct reduction's block: the slot, at most DIRECT_BLOCK */
  unsigned char* scratch; /* size blocks, made at first use */
};

static ctl_t* ctl_of(tpu_dist_comm_t* c, int r) {
  return (ctl_t*)(c->base + HDR_BYTES + (size_t)r * CTL_BYTES);
}
static size_t data_offset(int size) {
  size_t off = HDR_BYTES + (size_t)size * CTL_BYTES;
  return (off + 4095) & ~(size_t)4095;
}
static unsigned char* slot_of(tpu_dist_comm_t* c, int r) { /* r == size: the result slot */
  return c->base + data_offset(c->size) + (size_t)r * c->slot_bytes;
}

/* Point-to-point: one channel per ordered pair (src, dst) after the slots, a
 * page of counters and a buffer that a message streams through in chunks. */
typedef struct chan {
  counter_t sent;  /* chunks written (by src) */
  counter_t taken; /* chunks consumed (by dst) */
  int64_t msg_bytes;      /* of the message the current chunk belongs to */
  int64_t chunk_bytes;
  int32_t tag;
} chan_t;
static size_t chan_buf_bytes(size_t slot) { return slot < (1u << 20) ? slot : (1u << 20); }
static size_t chan_stride(size_t slot) { return 4096 + chan_buf_bytes(slot); }
static chan_t* chan_of(tpu_dist_comm_t* c, int src, int dst) {
  return (chan_t*)(c->base + data_offset(c->size) + (size_t)(c->size + 1) * c->slot_bytes +
                   (size_t)(src * c->size + dst) * chan_stride(c->slot_bytes));
}
static unsigned char* chan_buf(tpu_dist_comm_t* c, int src, int dst) {
  return (unsigned char*)chan_of(c, src, dst) + 4096;
}

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A peer is gone when its pid no longer exists or is a zombie (exited, not
 * yet reaped by its parent). */
static bool pid_gone(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE* f = fopen(path, "r");
  if (!f) return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char* close_paren = strrchr(buf, ')'); /* "pid (comm) S ..." */
  return close_paren && (close_paren[2] == 'Z' || close_paren[2] == 'X');
}

void tpu_dist_make_name(char* out, size_t out_size) {
  static _Atomic unsigned counter;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  unsigned r = (unsigned)ts.tv_nsec ^ ((unsigned)ts.tv_sec << 7) ^ ((unsigned)getpid() << 13);
  snprintf(out, out_size, "/" DIST_PREFIX "%d.%u.%08x", (int)getpid(),
           atomic_fetch_add(&counter, 1), r);
}

/* Removes segments of this kind whose creator (the pid in the name) is gone:
 * what a creator that died between creation and the last attach leaves. */
static void remove_stale_segments(void) {
  DIR* d = opendir("/dev/shm");
  if (!d) return;
  struct dirent* e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, DIST_PREFIX, strlen(DIST_PREFIX))) continue;
    int pid = atoi(e->d_name + strlen(DIST_PREFIX));
    if (pid_gone(pid)) {
      char path[300];
      snprintf(path, sizeof path, "/%s", e->d_name);
      shm_unlink(path);
    }
  }
  closedir(d);
}

void tpu_dist_comm_abort(tpu_dist_comm_t* c, const char* why) {
  if (!c || !c->hdr) return;
  int expected = 0;
  if (atomic_compare_exchange_strong(&c->hdr->aborted, &expected, 1 + c->rank)) {
    snprintf(c->hdr->why, sizeof c->hdr->why, "%s", why ? why : "aborted");
  }
}

static tpu_status_t aborted_status_of(tpu_dist_comm_t* c, const char* what) {
  int by = atomic_load(&c->hdr->aborted) - 1;
  return TPU_ERR(INTERNAL, "tpu_dist %s (rank %d of %d): the group failed earlier (rank %d: %s)",
                 what, c->rank, c->size, by, c->hdr->why);
}
static tpu_status_t aborted_status(tpu_dist_comm_t* c) { return aborted_status_of(c, c->what); }

/* Sequentially consistent, with the waiter's side below: either the waker
 * sees the sleeper registered, or the sleeper sees the new value. */
static void counter_set(counter_t* k, uint64_t v) {
  atomic_store(&k->value, v);
  atomic_fetch_add(&k->wake, 1);
  if (atomic_load(&k->waiters))
    (void)syscall(SYS_futex, &k->wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void post(tpu_dist_comm_t* c) {
  c->phase++;
  counter_set(&ctl_of(c, c->rank)->phase, c->phase);
}

/* Sleeps on k until it may have advanced, for at most 2 ms. */
static void counter_sleep(counter_t* k, uint64_t want) {
  atomic_fetch_add(&k->waiters, 1);
  const uint32_t w = atomic_load(&k->wake);
  if (atomic_load(&k->value) < want) {
    struct timespec ts = {0, 2000000};
    (void)syscall(SYS_futex, &k->wake, FUTEX_WAIT, w, &ts, NULL, 0);
  }
  atomic_fetch_sub(&k->waiters, 1);
}

/* Waits until counter k (rank `peer`'s) reaches `want`: spin, then yield,
 * then sleep on its futex, checking the abort flag, the peer's process and
 * the timeout every few milliseconds. */
static tpu_status_t wait_for(tpu_dist_comm_t* c, counter_t* k, uint64_t want, int peer,
                             const char* what) {
  int64_t start = -1, checked = 0;
  unsigned spins = 0;
  while (atomic_load_explicit(&k->value, memory_order_acquire) < want) {
    if (atomic_load_explicit(&c->hdr->aborted, memory_order_relaxed))
      return aborted_status_of(c, what);
    spins++;
    if (spins < 512) continue;
    if (spins < 640) {
      sched_yield();
      continue;
    }
    counter_sleep(k, want);
    const int64_t t = now_ms();
    if (start < 0) start = checked = t;
    if (t - checked < 10) continue;
    checked = t;
    int pid = atomic_load(&ctl_of(c, peer)->pid);
    if (pid_gone(pid)) {
      char why[256];
      snprintf(why, sizeof why, "rank %d (pid %d) exited during %s", peer, pid, what);
      tpu_dist_comm_abort(c, why);
      return TPU_ERR(INTERNAL, "tpu_dist %s (rank %d of %d): rank %d (pid %d) exited", what,
                     c->rank, c->size, peer, pid);
    }
    if (t - start > c->timeout_ms) {
      char why[256];
      snprintf(why, sizeof why, "rank %d timed out after %lld ms in %s waiting for rank %d",
               c->rank, (long long)c->timeout_ms, what, peer);
      tpu_dist_comm_abort(c, why);
      return TPU_ERR(INTERNAL,
                     "tpu_dist %s (rank %d of %d): timed out after %lld ms waiting for rank %d",
                     what, c->rank, c->size, (long long)c->timeout_ms, peer);
    }
  }
  return TPU_OK;
}

/* Waits until every rank has posted this rank's phase. */
static tpu_status_t wait_all(tpu_dist_comm_t* c) {
  for (int i = 0; i < c->size; i++)
    TPU_RETURN_IF_ERROR(wait_for(c, &ctl_of(c, i)->phase, c->phase, i, c->what));
  return TPU_OK;
}

static tpu_status_t step(tpu_dist_comm_t* c) {
  post(c);
  return wait_all(c);
}

/* ---- direct copies between the ranks' memory ------------------------------ */

static bool direct_wanted(void) { return tpu_env_int("TORCH_TPU_DIST_DIRECT", 1) != 0; }

/* Moves n bytes between this process's `local` and rank `peer`'s `remote`
 * (into the peer when `to_peer`). A failure aborts the group: the peer waits
 * for data that will not come. */
static tpu_status_t peer_copy(tpu_dist_comm_t* c, int peer, void* local, uint64_t remote,
                              size_t n, bool to_peer) {
  const int pid = atomic_load(&ctl_of(c, peer)->pid);
  while (n > 0) {
    struct iovec l = {local, n}, r = {(void*)(uintptr_t)remote, n};
    ssize_t got = to_peer ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                          : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got <= 0) {
      const int e = got < 0 ? errno : EIO;
      if (e == EINTR) continue;
      char why[256];
      snprintf(why, sizeof why, "rank %d could not %s rank %d (pid %d) in %s: %s", c->rank,
               to_peer ? "write to" : "read from", peer, pid, c->what,
               e == ESRCH ? "the process exited" : strerror(e));
      tpu_dist_comm_abort(c, why);
      return TPU_ERR(INTERNAL, "tpu_dist %s (rank %d of %d): %s", c->what, c->rank, c->size,
                     why);
    }
    local = (unsigned char*)local + got;
    remote += (uint64_t)got;
    n -= (size_t)got;
  }
  return TPU_OK;
}

/* Whether every rank can read every other's memory (not where a sandbox or
 * Yama forbids it, or TORCH_TPU_DIST_DIRECT=0 on any rank): each rank reads
 * every peer's probe word and publishes what it found; all then agree. */
static tpu_status_t probe_direct(tpu_dist_comm_t* c, int64_t start) {
  ctl_t* mine = ctl_of(c, c->rank);
  bool ok = direct_wanted();
  for (int i = 0; i < c->size && ok; i++) {
    if (i == c->rank) continue;
    uint64_t v = 0;
    struct iovec l = {&v, sizeof v}, r = {(void*)(uintptr_t)ctl_of(c, i)->probe_addr, sizeof v};
    ok = process_vm_readv(atomic_load(&ctl_of(c, i)->pid), &l, 1, &r, 1, 0) == (ssize_t)sizeof v &&
         v == PROBE_WORD;
  }
  atomic_store(&mine->direct, ok ? 1 : 2);
  bool all = true;
  for (int i = 0; i < c->size; i++) {
    int32_t d;
    while ((d = atomic_load(&ctl_of(c, i)->direct)) == 0) {
      if (now_ms() - start > c->timeout_ms)
        return TPU_ERR(INTERNAL, "tpu_dist init (rank %d of %d): rank %d never finished starting",
                       c->rank, c->size, i);
      struct timespec ts = {0, 200000};
      nanosleep(&ts, NULL);
    }
    all = all && d == 1;
  }
  c->direct = all;
  return TPU_OK;
}

static unsigned char* scratch_of(tpu_dist_comm_t* c, int i) {
  if (!c->scratch) c->scratch = aligned_alloc(64, (size_t)c->size * c->block);
  return c->scratch ? c->scratch + (size_t)i * c->block : NULL;
}

tpu_status_t tpu_dist_comm_create(const char* name, int rank, int size,
                                  const tpu_dist_options_t* opts, tpu_dist_comm_t** out_comm) {
  *out_comm = NULL;
  if (size < 1 || rank < 0 || rank >= size)
    return TPU_ERR(INVALID_ARGUMENT, "tpu_dist: rank %d is not in a group of %d", rank, size);
  if (!name || name[0] != '/' || strlen(name) >= 96)
    return TPU_ERR(INVALID_ARGUMENT, "tpu_dist: bad segment name '%s'", name ? name : "(null)");
  size_t slot = opts && opts->slot_bytes ? opts->slot_bytes : 0;
  if (!slot) {
    int64_t v = tpu_env_int("TORCH_TPU_DIST_SLOT_BYTES", DEFAULT_SLOT);
    slot = v >= 4096 ? (size_t)v : DEFAULT_SLOT;
  }
  slot = (slot + 4095) & ~(size_t)4095;
  if (slot < 4096 * (size_t)size) slot = 4096 * (size_t)size; /* room for a piece per rank */
  int64_t timeout = opts && opts->timeout_ms > 0 ? opts->timeout_ms : DEFAULT_TIMEOUT_MS;

  tpu_dist_comm_t* c = calloc(1, sizeof *c);
  if (!c) return TPU_ERR(RESOURCE_EXHAUSTED, "tpu_dist: out of host memory");
  snprintf(c->name, sizeof c->name, "%s", name);
  c->rank = rank;
  c->size = size;
  c->slot_bytes = slot;
  c->block = slot < DIRECT_BLOCK ? slot : DIRECT_BLOCK;
  c->timeout_ms = timeout;
  c->what = "init";
  c->map_bytes = data_offset(size) + (size_t)(size + 1) * slot +
                 (size_t)size * size * chan_stride(slot);
  tpu_status_t st = TPU_OK;
  int fd = -1;
  const int64_t start = now_ms();
  if (rank == 0) {
    remove_stale_segments();
    fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
      st = TPU_ERR(INTERNAL, "tpu_dist: cannot create shared memory segment %s: %s", name,
                   strerror(errno));
      goto error;
    }
    if (ftruncate(fd, (off_t)c->map_bytes) != 0) {
      st = TPU_ERR(RESOURCE_EXHAUSTED,
                   "tpu_dist: cannot size shared memory segment %s to %zu bytes: %s", name,
                   c->map_bytes, strerror(errno));
      goto error;
    }
  } else {
    for (;;) {
      fd = shm_open(name, O_RDWR, 0600);
      if (fd >= 0) {
        struct stat sb;
        if (fstat(fd, &sb) == 0 && (size_t)sb.st_size >= c->map_bytes) break;
        close(fd);
        fd = -1;
      }
      if (now_ms() - start > timeout) {
        st = TPU_ERR(INTERNAL,
                     "tpu_dist init (rank %d of %d): shared memory segment %s did not appear "
                     "within %lld ms (rank 0 on another host, or it failed)",
                     rank, size, name, (long long)timeout);
        goto error;
      }
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
  }
  c->base = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  fd = -1;
  if (c->base == MAP_FAILED) {
    c->base = NULL;
    st = TPU_ERR(RESOURCE_EXHAUSTED, "tpu_dist: cannot map %zu bytes of segment %s: %s",
                 c->map_bytes, name, strerror(errno));
    goto error;
  }
  c->hdr = (hdr_t*)c->base;
  if (rank == 0) {
    c->hdr->size = size;
    c->hdr->slot_bytes = slot;
    atomic_store(&c->hdr->magic, DIST_MAGIC);
  } else {
    while (atomic_load(&c->hdr->magic) != DIST_MAGIC) {
      if (now_ms() - start > timeout) {
        st = TPU_ERR(INTERNAL, "tpu_dist init (rank %d of %d): segment %s never initialized",
                     rank, size, name);
        goto error;
      }
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
    if (c->hdr->size != size || c->hdr->slot_bytes != slot) {
      st = TPU_ERR(INVALID_ARGUMENT,
                   "tpu_dist init (rank %d): ranks disagree on the group: rank 0 has size %d and "
                   "%llu slot bytes, rank %d has size %d and %zu",
                   rank, c->hdr->size, (unsigned long long)c->hdr->slot_bytes, rank, size, slot);
      goto error;
    }
  }
  atomic_store(&ctl_of(c, rank)->pid, (int32_t)getpid());
  /* Under Yama's ptrace_scope 1 only ancestors may read a process's memory,
   * and the ranks are siblings: let processes of this user do so (the
   * default where Yama is absent; ignored there). */
  static const uint64_t probe_word = PROBE_WORD;
  ctl_of(c, rank)->probe_addr = (uint64_t)(uintptr_t)&probe_word;
  if (direct_wanted()) (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  if (rank == 0) c->hdr->direct_min = tpu_env_int("TORCH_TPU_DIST_DIRECT_MIN_BYTES", 1 << 20);
  atomic_fetch_add(&c->hdr->attached, 1);
  while (atomic_load(&c->hdr->attached) < size) {
    if (now_ms() - start > timeout) {
      st = TPU_ERR(INTERNAL, "tpu_dist init (rank %d of %d): only %d ranks attached within %lld ms",
                   rank, size, atomic_load(&c->hdr->attached), (long long)timeout);
      goto error;
    }
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
  if (rank == 0) shm_unlink(name); /* every rank has it mapped: nothing can leak now */
  st = probe_direct(c, start);
  if (st) goto error_mapped;
  *out_comm = c;
  return TPU_OK;

error_mapped:
  tpu_dist_comm_abort(c, "a rank failed to start");
  munmap(c->base, c->map_bytes);
  free(c);
  return st;

error:
  if (fd >= 0) close(fd);
  if (rank == 0 && c->base == NULL) shm_unlink(name);
  if (c->base) {
    if (rank == 0) shm_unlink(name);
    munmap(c->base, c->map_bytes);
  }
  free(c);
  return st;
}

void tpu_dist_comm_destroy(tpu_dist_comm_t* c) {
  if (!c) return;
  if (c->base) munmap(c->base, c->map_bytes);
  free(c->scratch);
  free(c);
}

int tpu_dist_comm_rank(const tpu_dist_comm_t* c) { return c->rank; }
int tpu_dist_comm_size(const tpu_dist_comm_t* c) { return c->size; }
void tpu_dist_comm_set_timeout(tpu_dist_comm_t* c, int64_t timeout_ms) {
  if (timeout_ms > 0) c->timeout_ms = timeout_ms;
}
uint64_t tpu_dist_comm_count(const tpu_dist_comm_t* c) { return c->done; }
uint64_t tpu_dist_comm_direct_count(const tpu_dist_comm_t* c) { return c->direct_done; }
bool tpu_dist_comm_direct(const tpu_dist_comm_t* c) { return c->direct; }

const char* tpu_dist_redop_name(tpu_dist_redop_t op) {
  static const char* const names[] = {"SUM", "PRODUCT", "MIN", "MAX", "BAND",
                                      "BOR", "BXOR", "AVG", "PREMUL_SUM"};
  return (unsigned)op < sizeof names / sizeof names[0] ? names[op] : "?";
}

/* the dtypes reduce_into has a loop for; the others (float8/float4, the wide
 * unsigned integers) move through broadcast and gathers but are not reduced */
static bool has_reduction(tpu_dtype_t dt) {
  switch (dt) {
    case TPU_F32: case TPU_F64: case TPU_BF16: case TPU_F16: case TPU_U8: case TPU_I8:
    case TPU_I16: case TPU_I32: case TPU_I64: case TPU_BOOL: return true;
    default: return false;
  }
}

bool tpu_dist_redop_supported(tpu_dist_redop_t op, tpu_dtype_t dt) {
  if (!tpu_dtype_size(dt) || !has_reduction(dt)) return false;
  const bool fl = tpu_dtype_is_float(dt);
  switch (op) {
    case TPU_DIST_SUM: case TPU_DIST_PRODUCT: case TPU_DIST_MIN: case TPU_DIST_MAX: return true;
    case TPU_DIST_BAND: case TPU_DIST_BOR: case TPU_DIST_BXOR: return !fl;
    case TPU_DIST_AVG: return dt != TPU_BOOL;
    case TPU_DIST_PREMUL_SUM: return fl;
  }
  return false;
}

/* ---- the reduction kernel ------------------------------------------------ */

#define RBLK 512

#define DEF_REDUCE_FLOAT(NAME, T, ACC, LOAD, STORE, ATTR)                                   \
  ATTR static void NAME(void* dst_, void* dst2_, const void* const* srcs, int n,             \
                        int64_t count, int op, ACC factor, int avg) {                       \
    T* dst = (T*)dst_;                                                                      \
    ACC acc[RBLK];                                                                          \
    for (int64_t b = 0; b < count; b += RBLK) {                                             \
      const int64_t m = count - b < RBLK ? count - b : RBLK;                                \
      const T* s0 = (const T*)srcs[0] + b;                                                  \
      if (op == TPU_DIST_PREMUL_SUM)                                                        \
        for (int64_t k = 0; k < m; k++) acc[k] = factor * LOAD(s0[k]);                      \
      else                                                                                  \
        for (int64_t k = 0; k < m; k++) acc[k] = LOAD(s0[k]);                               \
      for (int i = 1; i < n; i++) {                                                         \
        const T* s = (const T*)srcs[i] + b;                                                 \
        switch (op) {                                                                       \
          case TPU_DIST_SUM: case TPU_DIST_AVG:                                             \
            for (int64_t k = 0; k < m; k++) acc[k] += LOAD(s[k]);                           \
            break;                                                                          \
          case TPU_DIST_PREMUL_SUM:                                                         \
            for (int64_t k = 0; k < m; k++) acc[k] += factor * LOAD(s[k]);                  \
            break;                                                                          \
          case TPU_DIST_PRODUCT:                                                            \
            for (int64_t k = 0; k < m; k++) acc[k] *= LOAD(s[k]);                           \
            break;                                                                          \
          case TPU_DIST_MIN: /* NaN wins, as torch.minimum */                               \
            for (int64_t k = 0; k < m; k++) {                                               \
              const ACC v = LOAD(s[k]);                                                     \
              acc[k] = (v < acc[k] || v != v) ? v : acc[k];                                 \
            }                                                                               \
            break;                                                                          \
          case TPU_DIST_MAX:                                                                \
            for (int64_t k = 0; k < m; k++) {                                               \
              const ACC v = LOAD(s[k]);                                                     \
              acc[k] = (v > acc[k] || v != v) ? v : acc[k];                                 \
            }                                                                               \
            break;                                                                          \
        }                                                                                   \
      }                                                                                     \
      if (op == TPU_DIST_AVG)                                                               \
        for (int64_t k = 0; k < m; k++) acc[k] /= (ACC)avg;                                 \
      for (int64_t k = 0; k < m; k++) dst[b + k] = STORE(acc[k]);                           \
      if (dst2_) memcpy((T*)dst2_ + b, dst + b, (size_t)m * sizeof(T)); /* still in L1 */   \
    }                                                                                       \
  }

#define ID(x) (x)
#define NO_ATTR
DEF_REDUCE_FLOAT(reduce_f32, float, float, ID, ID, NO_ATTR)
DEF_REDUCE_FLOAT(reduce_f64, double, double, ID, ID, NO_ATTR)
DEF_REDUCE_FLOAT(reduce_bf16, uint16_t, float, tpu_bf16_to_f32, tpu_f32_to_bf16, NO_ATTR)
DEF_REDUCE_FLOAT(reduce_f16, uint16_t, float, tpu_f16_to_f32, tpu_f32_to_f16, NO_ATTR)
/* AVX2 builds of the float loops (the conversions of bfloat16 gain most),
 * chosen at run time from CPUID (base/cpu.h); the results are the same bits */
#if defined(__x86_64__) || defined(__i386__)
#define TPU_HAVE_AVX2_REDUCE 1
#define AVX2_ATTR __attribute__((target("avx2,fma")))
DEF_REDUCE_FLOAT(reduce_f32_avx2, float, float, ID, ID, AVX2_ATTR)
DEF_REDUCE_FLOAT(reduce_f64_avx2, double, double, ID, ID, AVX2_ATTR)
DEF_REDUCE_FLOAT(reduce_bf16_avx2, uint16_t, float, tpu_bf16_to_f32, tpu_f32_to_bf16, AVX2_ATTR)

#include <immintrin.h>

/* Sums (SUM, AVG, PREMUL_SUM) of float32 and bfloat16, 16 elements a step
 * with the same operations in the same order as the loops above, so the same
 * bits; returns how many leading elements it did (the rest go to the loop). */
#define SUM_STEP(LOADV, STOREV)                                                             \
  for (; k + 16 <= count; k += 16) {                                                        \
    __m256 a0 = LOADV(srcs[0], k), a1 = LOADV(srcs[0], k + 8);                               \
    if (premul) {                                                                           \
      a0 = _mm256_mul_ps(f, a0);                                                            \
      a1 = _mm256_mul_ps(f, a1);                                                            \
    }                                                                                       \
    for (int i = 1; i < n; i++) {                                                           \
      __m256 b0 = LOADV(srcs[i], k), b1 = LOADV(srcs[i], k + 8);                             \
      if (premul) {                                                                         \
        b0 = _mm256_mul_ps(f, b0);                                                          \
        b1 = _mm256_mul_ps(f, b1);                                                          \
      }                                                                                     \
      a0 = _mm256_add_ps(a0, b0);                                                           \
      a1 = _mm256_add_ps(a1, b1);                                                           \
    }                                                                                       \
    if (avg) {                                                                              \
      a0 = _mm256_div_ps(a0, d);                                                            \
      a1 = _mm256_div_ps(a1, d);                                                            \
    }                                                                                       \
    STOREV(dst, k, a0);                                                                     \
    STOREV(dst, k + 8, a1);                                                                 \
  }

#define LOAD_F32(p, k) _mm256_loadu_ps((const float*)(p) + (k))
#define STORE_F32(p, k, v) _mm256_storeu_ps((float*)(p) + (k), v)
AVX2_ATTR static inline __m256 load_bf16x8(const void* p, int64_t k) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)((const uint16_t*)p + k)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
/* tpu_f32_to_bf16 on 8 lanes: round to nearest even, NaN kept quiet */
AVX2_ATTR static inline void store_bf16x8(void* p, int64_t k, __m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i q = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i w = _mm256_blendv_epi8(r, q, nan);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(w, w), 0x08);
  _mm_storeu_si128((__m128i*)((uint16_t*)p + k), _mm256_castsi256_si128(packed));
}
#define LOAD_BF16(p, k) load_bf16x8(p, k)
#define STORE_BF16(p, k, v) store_bf16x8(p, k, v)

AVX2_ATTR static int64_t sum_f32_avx2(void* dst, const void* const* srcs, int n, int64_t count,
                                      int op, float factor, int avg_divisor) {
  const bool premul = op == TPU_DIST_PREMUL_SUM, avg = op == TPU_DIST_AVG;
  const __m256 f = _mm256_set1_ps(factor), d = _mm256_set1_ps((float)avg_divisor);
  int64_t k = 0;
  SUM_STEP(LOAD_F32, STORE_F32)
  return k;
}
AVX2_ATTR static int64_t sum_bf16_avx2(void* dst, const void* const* srcs, int n, int64_t count,
                                       int op, float factor, int avg_divisor) {
  const bool premul = op == TPU_DIST_PREMUL_SUM, avg = op == TPU_DIST_AVG;
  const __m256 f = _mm256_set1_ps(factor), d = _mm256_set1_ps((float)avg_divisor);
  int64_t k = 0;
  SUM_STEP(LOAD_BF16, STORE_BF16)
  return k;
}

/* The float32 / bfloat16 reductions with AVX2: the sums vectorized by hand,
 * the tail and the other ops by the loops above. */
static void reduce_sum_or(int64_t (*sum)(void*, const void* const*, int, int64_t, int, float, int),
                          void (*rest)(void*, void*, const void* const*, int, int64_t, int, float,
                                       int),
                          size_t es, void* dst, void* dst2, const void* const* srcs, int n,
                          int64_t count, int op, float factor, int avg) {
  int64_t done = 0;
  if (op == TPU_DIST_SUM || op == TPU_DIST_AVG || op == TPU_DIST_PREMUL_SUM) {
    done = sum(dst, srcs, n, count, op, factor, avg);
    if (dst2) memcpy(dst2, dst, (size_t)done * es);
  }
  if (done == count) return;
  const void* tail[n];
  for (int i = 0; i < n; i++) tail[i] = (const unsigned char*)srcs[i] + done * es;
  rest((unsigned char*)dst + done * es, dst2 ? (unsigned char*)dst2 + done * es : NULL, tail, n,
       count - done, op, factor, avg);
}
#endif

static bool use_avx2(void) {
#ifdef TPU_HAVE_AVX2_REDUCE
  static int chosen = -1; /* benign race: every thread computes the same */
  if (chosen < 0) {
    const tpu_cpu_features_t* f = tpu_cpu_features();
    const char* isa = tpu_env_str("TORCH_TPU_ISA"); /* "portable": the baseline loops */
    chosen = f->avx2 && !(isa && strcmp(isa, "portable") == 0);
  }
  return chosen == 1;
#else
  return false;
#endif
}

/* Integers: sums and products wrap (unsigned arithmetic, as on CUDA), AVG
 * divides the exact sum (exact in 64 bits for the narrower types). */
#define DEF_REDUCE_INT(NAME, T, SIGNED)                                                     \
  static void NAME(void* dst_, void* dst2_, const void* const* srcs, int n, int64_t count,  \
                   int op, int avg) {                                                       \
    T* dst = (T*)dst_;                                                                      \
    uint64_t acc[RBLK];                                                                     \
    for (int64_t b = 0; b < count; b += RBLK) {                                             \
      const int64_t m = count - b < RBLK ? count - b : RBLK;                                \
      const T* s0 = (const T*)srcs[0] + b;                                                  \
      for (int64_t k = 0; k < m; k++) acc[k] = SIGNED ? (uint64_t)(int64_t)s0[k] : (uint64_t)s0[k]; \
      for (int i = 1; i < n; i++) {                                                         \
        const T* s = (const T*)srcs[i] + b;                                                 \
        for (int64_t k = 0; k < m; k++) {                                                   \
          const uint64_t v = SIGNED ? (uint64_t)(int64_t)s[k] : (uint64_t)s[k];             \
          switch (op) {                                                                     \
            case TPU_DIST_SUM: case TPU_DIST_AVG: acc[k] += v; break;                       \
            case TPU_DIST_PRODUCT: acc[k] *= v; break;                                      \
            case TPU_DIST_MIN:                                                              \
              if (SIGNED ? (int64_t)v < (int64_t)acc[k] : v < acc[k]) acc[k] = v;           \
              break;                                                                        \
            case TPU_DIST_MAX:                                                              \
              if (SIGNED ? (int64_t)v > (int64_t)acc[k] : v > acc[k]) acc[k] = v;           \
              break;                                                                        \
            case TPU_DIST_BAND: acc[k] &= v; break;                                         \
            case TPU_DIST_BOR: acc[k] |= v; break;                                          \
            case TPU_DIST_BXOR: acc[k] ^= v; break;                                         \
          }                                                                                 \
        }                                                                                   \
      }                                                                                     \
      if (op == TPU_DIST_AVG)                                                               \
        for (int64_t k = 0; k < m; k++)                                                     \
          acc[k] = SIGNED ? (uint64_t)((int64_t)acc[k] / avg) : acc[k] / (uint64_t)avg;     \
      for (int64_t k = 0; k < m; k++) dst[b + k] = (T)acc[k];                               \
      if (dst2_) memcpy((T*)dst2_ + b, dst + b, (size_t)m * sizeof(T));                     \
    }                                                                                       \
  }

DEF_REDUCE_INT(reduce_u8, uint8_t, 0)
DEF_REDUCE_INT(reduce_i8, int8_t, 1)
DEF_REDUCE_INT(reduce_i16, int16_t, 1)
DEF_REDUCE_INT(reduce_i32, int32_t, 1)
DEF_REDUCE_INT(reduce_i64, int64_t, 1)

/* dst (and dst2 when not NULL, a copy of the result) = op over srcs */
static tpu_status_t reduce_into(void* dst, void* dst2, const void* const* srcs, int n,
                                int64_t count, tpu_dtype_t dt, tpu_dist_redop_t op,
                                double factor, int avg_divisor) {
  if (!tpu_dist_redop_supported(op, dt))
    return TPU_ERR(INVALID_ARGUMENT, "tpu_dist: reduce op %s is not supported for %s",
                   tpu_dist_redop_name(op), tpu_dtype_name(dt));
  if (n < 1 || count <= 0) return TPU_OK;
  if (avg_divisor < 1) avg_divisor = n;
  switch (dt) {
#ifdef TPU_HAVE_AVX2_REDUCE
    case TPU_F32:
      if (use_avx2())
        reduce_sum_or(sum_f32_avx2, reduce_f32_avx2, 4, dst, dst2, srcs, n, count, op,
                      (float)factor, avg_divisor);
      else
        reduce_f32(dst, dst2, srcs, n, count, op, (float)factor, avg_divisor);
      break;
    case TPU_F64:
      (use_avx2() ? reduce_f64_avx2 : reduce_f64)(dst, dst2, srcs, n, count, op, factor, avg_divisor);
      break;
    case TPU_BF16:
      if (use_avx2())
        reduce_sum_or(sum_bf16_avx2, reduce_bf16_avx2, 2, dst, dst2, srcs, n, count, op,
                      (float)factor, avg_divisor);
      else
        reduce_bf16(dst, dst2, srcs, n, count, op, (float)factor, avg_divisor);
      break;
#else
    case TPU_F32: reduce_f32(dst, dst2, srcs, n, count, op, (float)factor, avg_divisor); break;
    case TPU_F64: reduce_f64(dst, dst2, srcs, n, count, op, factor, avg_divisor); break;
    case TPU_BF16: reduce_bf16(dst, dst2, srcs, n, count, op, (float)factor, avg_divisor); break;
#endif
    case TPU_F16: reduce_f16(dst, dst2, srcs, n, count, op, (float)factor, avg_divisor); break;
    case TPU_U8: reduce_u8(dst, dst2, srcs, n, count, op, avg_divisor); break;
    case TPU_I8: reduce_i8(dst, dst2, srcs, n, count, op, avg_divisor); break;
    case TPU_I16: reduce_i16(dst, dst2, srcs, n, count, op, avg_divisor); break;
    case TPU_I32: reduce_i32(dst, dst2, srcs, n, count, op, avg_divisor); break;
    case TPU_I64: reduce_i64(dst, dst2, srcs, n, count, op, avg_divisor); break;
    case TPU_BOOL: {
      /* 0/1 bytes: a sum or a maximum is "any", a product or a minimum "all" */
      int o = op == TPU_DIST_SUM ? TPU_DIST_MAX : op == TPU_DIST_PRODUCT ? TPU_DIST_MIN : (int)op;
      reduce_u8(dst, dst2, srcs, n, count, o, avg_divisor);
      break;
    }
    default:
      return TPU_ERR(UNIMPLEMENTED, "tpu_dist: dtype %s", tpu_dtype_name(dt));
  }
  return TPU_OK;
}

tpu_status_t tpu_dist_reduce_block(void* dst, const void* const* srcs, int n, int64_t count,
                                   tpu_dtype_t dt, tpu_dist_redop_t op, double factor,
                                   int avg_divisor) {
  return reduce_into(dst, NULL, srcs, n, count, dt, op, factor, avg_divisor);
}

/* ---- collectives ----------------------------------------------------------- */

/* Publishes this rank's descriptor, waits for all, and compares. `any_count`:
 * counts may differ (all_to_all; compared pairwise later). */
static tpu_status_t begin(tpu_dist_comm_t* c, int kind, tpu_dtype_t dt, int64_t count, int root,
                          int op, bool any_count, const void* addr) {
  c->what = kind_names[kind];
  if (atomic_load(&c->hdr->aborted)) return aborted_status(c);
  const uint64_t seq = ++c->seq;
  desc_t* mine = &ctl_of(c, c->rank)->desc[seq & 1];
  mine->seq = seq;
  mine->kind = kind;
  mine->dtype = (int32_t)dt;
  mine->root = root;
  mine->op = op;
  mine->count = count;
  mine->addr = (uint64_t)(uintptr_t)addr;
  TPU_RETURN_IF_ERROR(step(c));
  for (int i = 0; i < c->size; i++) {
    const desc_t* d = &ctl_of(c, i)->desc[seq & 1];
    if (d->seq != seq || d->kind != kind) {
      return TPU_ERR(INVALID_ARGUMENT,
                     "tpu_dist: ranks called different collectives: rank %d called %s "
                     "(collective #%llu), rank %d called %s (#%llu)",
                     c->rank, c->what, (unsigned long long)seq, i,
                     d->kind > 0 && d->kind <= K_ALL_TO_ALL ? kind_names[d->kind] : "?",
                     (unsigned long long)d->seq);
    }
    if (d->dtype != mine->dtype || (!any_count && d->count != count) || d->root != root ||
        d->op != op) {
      return TPU_ERR(INVALID_ARGUMENT,
                     "tpu_dist %s: ranks disagree: rank %d has %lld %s elements (root %d, op %s), "
                     "rank %d has %lld %s elements (root %d, op %s)",
                     c->what, c->rank, (long long)count, tpu_dtype_name(dt), root,
                     tpu_dist_redop_name((tpu_dist_redop_t)op), i, (long long)d->count,
                     tpu_dtype_name((tpu_dtype_t)d->dtype), d->root,
                     tpu_dist_redop_name((tpu_dist_redop_t)d->op));
    }
  }
  /* the same on every rank by now, so every rank fails alike */
  if (root < 0 || root >= c->size)
    return TPU_ERR(INVALID_ARGUMENT, "tpu_dist %s: root %d is not a rank of a group of %d",
                   c->what, root, c->size);
  return TPU_OK;
}

/* Whether the collective just begun moves its data directly between the
 * ranks' buffers: where every rank published one and it is large enough.
 * The same answer on every rank (it reads only what all published). */
static bool go_direct(tpu_dist_comm_t* c, int64_t bytes) {
  if (!c->direct || bytes <= 0 || bytes < c->hdr->direct_min) return false;
  for (int i = 0; i < c->size; i++)
    if (!ctl_of(c, i)->desc[c->seq & 1].addr) return false;
  return scratch_of(c, 0) != NULL;
}
static uint64_t peer_addr(tpu_dist_comm_t* c, int i) {
  return ctl_of(c, i)->desc[c->seq & 1].addr;
}
/* The last step of a direct collective: no rank returns (and lets its
 * buffers go) while a peer may still read or write them. */
static tpu_status_t direct_end(tpu_dist_comm_t* c) {
  TPU_RETURN_IF_ERROR(step(c));
  c->direct_done++;
  return TPU_OK;
}

static tpu_status_t finish(tpu_dist_comm_t* c, tpu_status_t st) {
  if (st == TPU_OK) c->done++;
  return st;
}

static tpu_status_t check_op(tpu_dist_comm_t* c, const char* what, tpu_dist_redop_t op,
                             tpu_dtype_t dt) {
  if (!tpu_dtype_size(dt))
    return TPU_ERR(UNIMPLEMENTED, "tpu_dist %s: dtype %s is not supported", what,
                   tpu_dtype_name(dt));
  if (!tpu_dist_redop_supported(op, dt))
    return TPU_ERR(INVALID_ARGUMENT, "tpu_dist %s: reduce op %s is not supported for %s", what,
                   tpu_dist_redop_name(op), tpu_dtype_name(dt));
  return TPU_OK;
}

/* all_reduce and reduce by direct copies: rank r reduces stretch r of the
 * buffers, a block at a time: the peers' parts read into scratch, its own in
 * place, the result written into every peer's buffer (all_reduce) or the
 * root's. Only rank r touches stretch r anywhere, so nothing races. */
static tpu_status_t reduce_direct(tpu_dist_comm_t* c, int kind, void* buf, int64_t count,
                                  tpu_dtype_t dt, tpu_dist_redop_t op, double factor, int root) {
  const size_t es = tpu_dtype_size(dt);
  const int W = c->size, me = c->rank;
  const bool all = kind == K_ALL_REDUCE;
  const int64_t lo = count * me / W, hi = count * (me + 1) / W, blk = (int64_t)(c->block / es);
  const void* srcs[W];
  for (int64_t off = lo; off < hi; off += blk) {
    const int64_t m = hi - off < blk ? hi - off : blk;
    const size_t nb = (size_t)m * es, at = (size_t)off * es;
    unsigned char* own = (unsigned char*)buf + at;
    for (int i = 0; i < W; i++) {
      if (i == me) {
        srcs[i] = own;
        continue;
      }
      TPU_RETURN_IF_ERROR(peer_copy(c, i, scratch_of(c, i), peer_addr(c, i) + at, nb, false));
      srcs[i] = scratch_of(c, i);
    }
    unsigned char* dst = all || me == root ? own : scratch_of(c, me);
    TPU_RETURN_IF_ERROR(reduce_into(dst, NULL, srcs, W, m, dt, op, factor, W));
    for (int i = 0; i < W; i++)
      if (i != me && (all || i == root))
        TPU_RETURN_IF_ERROR(peer_copy(c, i, dst, peer_addr(c, i) + at, nb, true));
  }
  return direct_end(c);
}

/* all_reduce and reduce: in rounds of a slot. Rank r reduces stretch r of the
 * round (over the ranks in order), reading its own part of the stretch in
 * place; so a rank stages only the stretches that others reduce, and takes
 * back only theirs from the result slot. all_reduce writes its own stretch
 * straight into its buffer (a block is read before it is written); reduce
 * leaves the non-roots' buffers as they were. */
static tpu_status_t reduce_impl(tpu_dist_comm_t* c, int kind, void* buf, int64_t count,
                                tpu_dtype_t dt, tpu_dist_redop_t op, double factor, int root) {
  TPU_RETURN_IF_ERROR(begin(c, kind, dt, count, root, op, false, buf));
  TPU_RETURN_IF_ERROR(check_op(c, kind_names[kind], op, dt));
  const size_t es = tpu_dtype_size(dt);
  if (go_direct(c, count * (int64_t)es)) return reduce_direct(c, kind, buf, count, dt, op, factor, root);
  const int64_t chunk = (int64_t)(c->slot_bytes / es);
  const int W = c->size, me = c->rank;
  const void* srcs[W];
  unsigned char* res = slot_of(c, W);
  unsigned char* mine = slot_of(c, me);
  const bool all = kind == K_ALL_REDUCE;
  for (int64_t off = 0; off < count; off += chunk) {
    const int64_t n = count - off < chunk ? count - off : chunk;
    unsigned char* b = (unsigned char*)buf + off * es;
#define STRETCH_LO(j) (n * (j) / W)
#define STRETCH_HI(j) (n * ((j) + 1) / W)
    for (int j = 0; j < W; j++)
      if (j != me)
        memcpy(mine + STRETCH_LO(j) * es, b + STRETCH_LO(j) * es,
               (size_t)(STRETCH_HI(j) - STRETCH_LO(j)) * es);
    TPU_RETURN_IF_ERROR(step(c));
    const int64_t lo = STRETCH_LO(me), hi = STRETCH_HI(me);
    for (int i = 0; i < W; i++) srcs[i] = (i == me ? b : slot_of(c, i)) + lo * es;
    unsigned char* dst = all ? b + lo * es : res + lo * es;
    TPU_RETURN_IF_ERROR(
        reduce_into(dst, all ? res + lo * es : NULL, srcs, W, hi - lo, dt, op, factor, W));
    TPU_RETURN_IF_ERROR(step(c));
    if (all || me == root) {
      for (int j = 0; j < W; j++)
        if (!all || j != me)
          memcpy(b + STRETCH_LO(j) * es, res + STRETCH_LO(j) * es,
                 (size_t)(STRETCH_HI(j) - STRETCH_LO(j)) * es);
    }
#undef STRETCH_LO
#undef STRETCH_HI
  }
  return TPU_OK;
}

tpu_status_t tpu_dist_all_reduce(tpu_dist_comm_t* c, void* buf, int64_t count, tpu_dtype_t dt,
                                 tpu_dist_redop_t op, double factor) {
  return finish(c, reduce_impl(c, K_ALL_REDUCE, buf, count, dt, op, factor, 0));
}

tpu_status_t tpu_dist_reduce(tpu_dist_comm_t* c, void* buf, int64_t count, tpu_dtype_t dt,
                             tpu_dist_redop_t op, double factor, int root) {
  return finish(c, reduce_impl(c, K_REDUCE, buf, count, dt, op, factor, root));
}

static tpu_status_t broadcast_impl(tpu_dist_comm_t* c, void* buf, int64_t count, tpu_dtype_t dt,
                                   int root) {
  TPU_RETURN_IF_ERROR(begin(c, K_BROADCAST, dt, count, root, 0, false, buf));
  const size_t es = tpu_dtype_size(dt);
  if (go_direct(c, count * (int64_t)es)) {
    if (c->rank != root)
      TPU_RETURN_IF_ERROR(peer_copy(c, root, buf, peer_addr(c, root), (size_t)count * es, false));
    return direct_end(c);
  }
  const int64_t chunk = (int64_t)(c->slot_bytes / es);
  for (int64_t off = 0; off < count; off += chunk) {
    const int64_t n = count - off < chunk ? count - off : chunk;
    if (c->rank == root) memcpy(slot_of(c, root), (unsigned char*)buf + off * es, (size_t)n * es);
    TPU_RETURN_IF_ERROR(step(c));
    if (c->rank != root) memcpy((unsigned char*)buf + off * es, slot_of(c, root), (size_t)n * es);
    TPU_RETURN_IF_ERROR(step(c));
  }
  return TPU_OK;
}

tpu_status_t tpu_dist_broadcast(tpu_dist_comm_t* c, void* buf, int64_t count, tpu_dtype_t dt,
                                int root) {
  return finish(c, broadcast_impl(c, buf, count, dt, root));
}

static tpu_status_t gather_impl(tpu_dist_comm_t* c, int kind, const void* in, void* const* outs,
                                int64_t count, tpu_dtype_t dt, int root) {
  TPU_RETURN_IF_ERROR(begin(c, kind, dt, count, root, 0, false, in));
  const size_t es = tpu_dtype_size(dt);
  const bool receive = kind == K_ALL_GATHER || c->rank == root;
  if (go_direct(c, count * (int64_t)es)) {
    for (int i = 0; i < c->size && receive; i++) {
      if (i != c->rank)
        TPU_RETURN_IF_ERROR(peer_copy(c, i, outs[i], peer_addr(c, i), (size_t)count * es, false));
      else if (outs[i] != in)
        memmove(outs[i], in, (size_t)count * es);
    }
    return direct_end(c);
  }
  const int64_t chunk = (int64_t)(c->slot_bytes / es);
  for (int64_t off = 0; off < count; off += chunk) {
    const int64_t n = count - off < chunk ? count - off : chunk;
    memcpy(slot_of(c, c->rank), (const unsigned char*)in + off * es, (size_t)n * es);
    TPU_RETURN_IF_ERROR(step(c));
    if (receive) {
      for (int i = 0; i < c->size; i++)
        memcpy((unsigned char*)outs[i] + off * es, slot_of(c, i), (size_t)n * es);
    }
    TPU_RETURN_IF_ERROR(step(c));
  }
  return TPU_OK;
}

tpu_status_t tpu_dist_all_gather(tpu_dist_comm_t* c, const void* in, void* const* outs,
                                 int64_t count, tpu_dtype_t dt) {
  return finish(c, gather_impl(c, K_ALL_GATHER, in, outs, count, dt, 0));
}

tpu_status_t tpu_dist_gather(tpu_dist_comm_t* c, const void* in, void* const* outs,
                             int64_t count, tpu_dtype_t dt, int root) {
  return finish(c, gather_impl(c, K_GATHER, in, outs, count, dt, root));
}

/* ins[0] when ins[j] = ins[0] + j * piece_bytes for every j (one buffer to
 * publish for direct copies), else NULL. */
static const void* consecutive(const void* const* ins, int n, size_t piece_bytes) {
  if (!ins) return NULL;
  for (int j = 1; j < n; j++)
    if ((const unsigned char*)ins[j] != (const unsigned char*)ins[0] + j * piece_bytes) return NULL;
  return ins[0];
}

/* The slot split into one piece per rank: `sub` elements each. */
static int64_t piece_elems(tpu_dist_comm_t* c, size_t es) {
  return (int64_t)(c->slot_bytes / (size_t)c->size / es);
}

static tpu_status_t scatter_impl(tpu_dist_comm_t* c, const void* const* ins, void* out,
                                 int64_t count, tpu_dtype_t dt, int root) {
  const size_t es = tpu_dtype_size(dt);
  const bool is_root = c->rank == root;
  TPU_RETURN_IF_ERROR(begin(c, K_SCATTER, dt, count, root, 0, false,
                            is_root ? consecutive(ins, c->size, count * es) : out));
  if (go_direct(c, count * (int64_t)es)) {
    const uint64_t from = peer_addr(c, root) + (uint64_t)c->rank * count * es;
    if (!is_root) TPU_RETURN_IF_ERROR(peer_copy(c, root, out, from, (size_t)count * es, false));
    else if (out != ins[c->rank]) memmove(out, ins[c->rank], (size_t)count * es);
    return direct_end(c);
  }
  const int64_t sub = piece_elems(c, es);
  for (int64_t off = 0; off < count; off += sub) {
    const int64_t n = count - off < sub ? count - off : sub;
    if (c->rank == root) {
      for (int j = 0; j < c->size; j++)
        memcpy(slot_of(c, root) + (size_t)j * sub * es, (const unsigned char*)ins[j] + off * es,
               (size_t)n * es);
    }
    TPU_RETURN_IF_ERROR(step(c));
    memcpy((unsigned char*)out + off * es, slot_of(c, root) + (size_t)c->rank * sub * es,
           (size_t)n * es);
    TPU_RETURN_IF_ERROR(step(c));
  }
  return TPU_OK;
}

tpu_status_t tpu_dist_scatter(tpu_dist_comm_t* c, const void* const* ins, void* out,
                              int64_t count, tpu_dtype_t dt, int root) {
  return finish(c, scatter_impl(c, ins, out, count, dt, root));
}

static tpu_status_t reduce_scatter_impl(tpu_dist_comm_t* c, const void* const* ins, void* out,
                                        int64_t count, tpu_dtype_t dt, tpu_dist_redop_t op,
                                        double factor) {
  const size_t es = tpu_dtype_size(dt);
  TPU_RETURN_IF_ERROR(begin(c, K_REDUCE_SCATTER, dt, count, 0, op, false,
                            consecutive(ins, c->size, count * es)));
  TPU_RETURN_IF_ERROR(check_op(c, "reduce_scatter", op, dt));
  const int64_t sub = piece_elems(c, es);
  const void* srcs[c->size];
  if (go_direct(c, count * (int64_t)es)) {
    /* out = rank order over i of rank i's piece `me`, a block at a time */
    const int W = c->size, me = c->rank;
    const int64_t blk = (int64_t)(c->block / es);
    for (int64_t off = 0; off < count; off += blk) {
      const int64_t m = count - off < blk ? count - off : blk;
      const size_t nb = (size_t)m * es;
      const uint64_t at = ((uint64_t)me * count + off) * es;
      for (int i = 0; i < W; i++) {
        if (i == me) {
          srcs[i] = (const unsigned char*)ins[me] + off * es;
          continue;
        }
        TPU_RETURN_IF_ERROR(peer_copy(c, i, scratch_of(c, i), peer_addr(c, i) + at, nb, false));
        srcs[i] = scratch_of(c, i);
      }
      TPU_RETURN_IF_ERROR(
          reduce_into((unsigned char*)out + off * es, NULL, srcs, W, m, dt, op, factor, W));
    }
    return direct_end(c);
  }
  for (int64_t off = 0; off < count; off += sub) {
    const int64_t n = count - off < sub ? count - off : sub;
    for (int j = 0; j < c->size; j++)
      memcpy(slot_of(c, c->rank) + (size_t)j * sub * es, (const unsigned char*)ins[j] + off * es,
             (size_t)n * es);
    TPU_RETURN_IF_ERROR(step(c));
    for (int i = 0; i < c->size; i++) srcs[i] = slot_of(c, i) + (size_t)c->rank * sub * es;
    TPU_RETURN_IF_ERROR(tpu_dist_reduce_block((unsigned char*)out + off * es, srcs, c->size, n,
                                              dt, op, factor, c->size));
    TPU_RETURN_IF_ERROR(step(c));
  }
  return TPU_OK;
}

tpu_status_t tpu_dist_reduce_scatter(tpu_dist_comm_t* c, const void* const* ins, void* out,
                                     int64_t count, tpu_dtype_t dt, tpu_dist_redop_t op,
                                     double factor) {
  return finish(c, reduce_scatter_impl(c, ins, out, count, dt, op, factor));
}

static tpu_status_t all_to_all_impl(tpu_dist_comm_t* c, const void* const* ins,
                                    const int64_t* in_counts, void* const* outs,
                                    const int64_t* out_counts, tpu_dtype_t dt) {
  int64_t total = 0;
  for (int j = 0; j < c->size; j++) total += in_counts[j];
  const size_t es = tpu_dtype_size(dt);
  const int W = c->size;
  /* direct copies need the inputs back to back in rank order */
  const void* base = ins[0];
  for (int64_t j = 0, at = 0; j < W && base; at += in_counts[j], j++)
    if ((const unsigned char*)ins[j] != (const unsigned char*)base + at * es) base = NULL;
  TPU_RETURN_IF_ERROR(begin(c, K_ALL_TO_ALL, dt, total, 0, 0, true, base));
  /* the split sizes first: each rank's sends and receives, so that every
   * rank checks the whole matrix and all fail alike on a mismatch */
  int64_t* row = (int64_t*)slot_of(c, c->rank);
  for (int j = 0; j < W; j++) {
    row[j] = in_counts[j];
    row[W + j] = out_counts[j];
  }
  TPU_RETURN_IF_ERROR(step(c));
  int64_t most = 0, sum = 0;
  int64_t from[W]; /* where rank i's piece for this rank starts in its input */
  tpu_status_t bad = TPU_OK;
  for (int i = 0; i < W && !bad; i++) {
    const int64_t* r = (const int64_t*)slot_of(c, i);
    from[i] = 0;
    for (int j = 0; j < W && !bad; j++) {
      const int64_t expect = ((const int64_t*)slot_of(c, j))[W + i];
      if (j < c->rank) from[i] += r[j];
      sum += r[j];
      if (r[j] > most) most = r[j];
      if (r[j] != expect)
        bad = TPU_ERR(INVALID_ARGUMENT,
                      "tpu_dist all_to_all: rank %d sends %lld elements to rank %d, which "
                      "expects %lld from it",
                      i, (long long)r[j], j, (long long)expect);
    }
  }
  /* every rank read every row: the slots may be reused after this step */
  tpu_status_t st = step(c);
  if (bad) {
    tpu_status_free(st);
    return bad;
  }
  TPU_RETURN_IF_ERROR(st);
  if (go_direct(c, sum * (int64_t)es)) {
    for (int i = 0; i < W; i++) {
      const size_t nb = (size_t)out_counts[i] * es;
      if (!nb) continue;
      if (i != c->rank)
        TPU_RETURN_IF_ERROR(
            peer_copy(c, i, outs[i], peer_addr(c, i) + (uint64_t)from[i] * es, nb, false));
      else if (outs[i] != ins[i])
        memmove(outs[i], ins[i], nb);
    }
    return direct_end(c);
  }
  const int64_t sub = piece_elems(c, es);
  for (int64_t off = 0; off < most; off += sub) {
    for (int j = 0; j < W; j++) {
      const int64_t n = in_counts[j] - off < sub ? in_counts[j] - off : sub;
      if (n > 0)
        memcpy(slot_of(c, c->rank) + (size_t)j * sub * es, (const unsigned char*)ins[j] + off * es,
               (size_t)n * es);
    }
    TPU_RETURN_IF_ERROR(step(c));
    for (int i = 0; i < W; i++) {
      const int64_t n = out_counts[i] - off < sub ? out_counts[i] - off : sub;
      if (n > 0)
        memcpy((unsigned char*)outs[i] + off * es, slot_of(c, i) + (size_t)c->rank * sub * es,
               (size_t)n * es);
    }
    TPU_RETURN_IF_ERROR(step(c));
  }
  return TPU_OK;
}

tpu_status_t tpu_dist_all_to_all(tpu_dist_comm_t* c, const void* const* ins,
                                 const int64_t* in_counts, void* const* outs,
                                 const int64_t* out_counts, tpu_dtype_t dt) {
  return finish(c, all_to_all_impl(c, ins, in_counts, outs, out_counts, dt));
}

tpu_status_t tpu_dist_barrier(tpu_dist_comm_t* c) {
  return finish(c, begin(c, K_BARRIER, TPU_U8, 0, 0, 0, false, NULL));
}

/* ---- point-to-point ---------------------------------------------------------
 * A message goes through the (src, dst) channel in chunks of its buffer: the
 * sender waits until the receiver has taken the previous chunk, the receiver
 * until the next one is there. Messages between a pair match in order (as
 * NCCL's); the receiver checks the size and the tag, and a mismatch aborts
 * the group (the sender would wait for it forever). Sends to one peer must
 * come from one thread at a time, and so must receives from one peer. */

tpu_status_t tpu_dist_send(tpu_dist_comm_t* c, const void* buf, int64_t bytes, int dst, int tag) {
  if (dst < 0 || dst >= c->size || dst == c->rank)
    return TPU_ERR(INVALID_ARGUMENT, "tpu_dist send: rank %d cannot send to rank %d (of %d)",
                   c->rank, dst, c->size);
  if (atomic_load(&c->hdr->aborted)) return aborted_status_of(c, "send");
  chan_t* ch = chan_of(c, c->rank, dst);
  unsigned char* cb = chan_buf(c, c->rank, dst);
  const int64_t cap = (int64_t)chan_buf_bytes(c->slot_bytes);
  int64_t off = 0;
  do { /* an empty message is one empty chunk */
    const int64_t n = bytes - off < cap ? bytes - off : cap;
    const uint64_t k = atomic_load_explicit(&ch->sent.value, memory_order_relaxed);
    TPU_RETURN_IF_ERROR(wait_for(c, &ch->taken, k, dst, "send"));
    memcpy(cb, (const unsigned char*)buf + off, (size_t)n);
    ch->msg_bytes = bytes;
    ch->chunk_bytes = n;
    ch->tag = tag;
    counter_set(&ch->sent, k + 1);
    off += n;
  } while (off < bytes);
  /* sent once the receiver has taken the last chunk, as a completed send's
   * buffer may be reused and freed */
  return wait_for(c, &ch->taken, atomic_load(&ch->sent.value), dst, "send");
}

tpu_status_t tpu_dist_recv(tpu_dist_comm_t* c, void* buf, int64_t bytes, int src, int tag) {
  if (src < 0 || src >= c->size || src == c->rank)
    return TPU_ERR(INVALID_ARGUMENT, "tpu_dist recv: rank %d cannot receive from rank %d (of %d)",
                   c->rank, src, c->size);
  if (atomic_load(&c->hdr->aborted)) return aborted_status_of(c, "recv");
  chan_t* ch = chan_of(c, src, c->rank);
  const unsigned char* cb = chan_buf(c, src, c->rank);
  int64_t off = 0;
  do {
    const uint64_t k = atomic_load_explicit(&ch->taken.value, memory_order_relaxed);
    TPU_RETURN_IF_ERROR(wait_for(c, &ch->sent, k + 1, src, "recv"));
    if (ch->msg_bytes != bytes || (tag >= 0 && ch->tag >= 0 && ch->tag != tag)) {
      char why[256];
      snprintf(why, sizeof why,
               "recv on rank %d expected %lld bytes (tag %d) from rank %d, which sent %lld "
               "bytes (tag %d)",
               c->rank, (long long)bytes, tag, src, (long long)ch->msg_bytes, ch->tag);
      tpu_dist_comm_abort(c, why);
      return TPU_ERR(INVALID_ARGUMENT, "tpu_dist %s", why);
    }
    memcpy((unsigned char*)buf + off, cb, (size_t)ch->chunk_bytes);
    off += ch->chunk_bytes;
    counter_set(&ch->taken, k + 1);
  } while (off < bytes);
  return TPU_OK;
}
