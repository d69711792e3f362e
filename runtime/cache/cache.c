/* The three-tier cache of compiled executables (see tpu/cache.h).
 *
 * Locking: g_mu guards the configuration, the per-tier state, the statistics
 * and the warning queue; g_t1_mu guards the tier-1 map. File I/O runs without
 * either lock, on a copy of the tier directory taken under g_mu.
 */
#include "tpu/cache.h"

#include "base/env.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define TIER2_ENV "TORCH_TPU_TIER2_COMPILATION_CACHE"
#define TIER3_ENV "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"
#define TIER2_BASE "/dev/shm/torch_tpu_cache"

#define TRAILER_SIZE 32
#define TRAILER_VERSION 1u
static const char kMagic[8] = {'T', 'P', 'U', 'X', 'C', 'A', 'C', 'H'};
/* Largest entry accepted (a sanity bound; executables are far smaller). */
#define MAX_ENTRY_BYTES ((size_t)1 << 31)

/* ---- checksum: XXH64 ---- */
#define H_P1 0x9E3779B185EBCA87ull
#define H_P2 0xC2B2AE3D27D4EB4Full
#define H_P3 0x165667B19E3779F9ull
#define H_P4 0x85EBCA77C2B2AE63ull
#define H_P5 0x27D4EB2F165667C5ull

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap64(v);
#endif
  return v;
}

static inline uint32_t load32(const unsigned char* p) {
  uint32_t v;
  memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  return v;
}

static inline uint64_t xx_round(uint64_t acc, uint64_t lane) {
  acc += lane * H_P2;
  acc = rotl64(acc, 31);
  return acc * H_P1;
}

static inline uint64_t xx_merge(uint64_t h, uint64_t acc) {
  h ^= xx_round(0, acc);
  return h * H_P1 + H_P4;
}

uint64_t tpu_cache_hash64(const void* data, size_t len, uint64_t seed) {
  const unsigned char* p = (const unsigned char*)data;
  const unsigned char* end = p + len;
  uint64_t h;
  if (len >= 32) {
    /* Four independent lanes over 32-byte stripes. */
    uint64_t a = seed + H_P1 + H_P2, b = seed + H_P2, c = seed, d = seed - H_P1;
    const unsigned char* stop = end - 32;
    do {
      a = xx_round(a, load64(p));
      b = xx_round(b, load64(p + 8));
      c = xx_round(c, load64(p + 16));
      d = xx_round(d, load64(p + 24));
      p += 32;
    } while (p <= stop);
    h = rotl64(a, 1) + rotl64(b, 7) + rotl64(c, 12) + rotl64(d, 18);
    h = xx_merge(h, a);
    h = xx_merge(h, b);
    h = xx_merge(h, c);
    h = xx_merge(h, d);
  } else {
    h = seed + H_P5;
  }
  h += (uint64_t)len;
  for (; end - p >= 8; p += 8) {
    h ^= xx_round(0, load64(p));
    h = rotl64(h, 27) * H_P1 + H_P4;
  }
  if (end - p >= 4) {
    h ^= (uint64_t)load32(p) * H_P1;
    h = rotl64(h, 23) * H_P2 + H_P3;
    p += 4;
  }
  for (; p < end; p++) {
    h ^= (uint64_t)(*p) * H_P5;
    h = rotl64(h, 11) * H_P1;
  }
  h ^= h >> 33;
  h *= H_P2;
  h ^= h >> 29;
  h *= H_P3;
  h ^= h >> 32;
  return h;
}

void tpu_cache_make_key(const void* what, size_t what_len, const char* how, char out[33]) {
  uint64_t h1 = tpu_cache_hash64(what, what_len, 0x7470755f66757365ull);
  h1 = tpu_cache_hash64(how, strlen(how), h1);
  uint64_t h2 = tpu_cache_hash64(what, what_len, 0x9e3779b97f4a7c15ull);
  h2 = tpu_cache_hash64(how, strlen(how), h2);
  snprintf(out, 33, "%016" PRIx64 "%016" PRIx64, h1, h2);
}

bool tpu_cache_key_valid(const char* key) {
  if (!key) return false;
  size_t n = 0;
  for (; key[n]; n++) {
    char ch = key[n];
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
    if (n >= TPU_CACHE_KEY_MAX) return false;
  }
  return n >= TPU_CACHE_KEY_MIN;
}

/* The payload checksum is seeded with the key, so an entry renamed to
 * another key fails verification too. */
static uint64_t payload_checksum(const char* key, const void* data, size_t len) {
  return tpu_cache_hash64(data, len, tpu_cache_hash64(key, strlen(key), 0));
}

static void put_le64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put_le32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}
static uint32_t get_le32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static void make_trailer(unsigned char t[TRAILER_SIZE], const char* key, const void* payload,
                         size_t len) {
  put_le64(t, (uint64_t)len);
  put_le64(t + 8, payload_checksum(key, payload, len));
  memcpy(t + 16, kMagic, 8);
  put_le32(t + 24, TRAILER_VERSION);
  put_le32(t + 28, TRAILER_SIZE);
}

/* True when buf (a whole entry file) carries a valid trailer for key. */
static bool entry_valid(const char* key, const unsigned char* buf, size_t len) {
  if (len <= TRAILER_SIZE) return false;
  const unsigned char* t = buf + len - TRAILER_SIZE;
  size_t payload = len - TRAILER_SIZE;
  if (memcmp(t + 16, kMagic, 8) != 0) return false;
  if (get_le32(t + 24) != TRAILER_VERSION || get_le32(t + 28) != TRAILER_SIZE) return false;
  if (get_le64(t) != (uint64_t)payload) return false;
  return get_le64(t + 8) == payload_checksum(key, buf, payload);
}

/* ---- configuration, state, statistics, warnings ---- */
typedef struct tier_state {
  bool configured; /* on in the configuration */
  bool prepared;   /* directory creation and checks done */
  bool usable;     /* configured and the checks passed */
  bool warned;     /* a warning about this tier was queued */
  char dir[PATH_MAX];
} tier_state_t;

#define WARN_SLOTS 16
#define WARN_LEN 512

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static bool g_loaded;
static tier_state_t g_tier[4]; /* indices 2 and 3 */
static tpu_cache_stats_t g_stats;
static char g_warn[WARN_SLOTS][WARN_LEN];
static int g_warn_head, g_warn_count;
static unsigned long g_tmp_counter;

static void queue_warning_locked(const char* fmt, ...) TPU_PRINTF(1, 2);
static void queue_warning_locked(const char* fmt, ...) {
  if (g_warn_count == WARN_SLOTS) return; /* nobody is popping: drop */
  int slot = (g_warn_head + g_warn_count) % WARN_SLOTS;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_warn[slot], WARN_LEN, fmt, ap);
  va_end(ap);
  g_warn_count++;
}

/* Queues msg for tier t unless this tier already warned. */
static void warn_tier_locked(int t, const char* msg) {
  if (g_tier[t].warned) return;
  g_tier[t].warned = true;
  queue_warning_locked("TorchTPU compilation cache tier %d (%s): %s", t,
                       g_tier[t].dir[0] ? g_tier[t].dir : "no directory", msg);
}

static bool set_dir(tier_state_t* s, const char* a, const char* b, const char* c) {
  int n = snprintf(s->dir, sizeof(s->dir), "%s%s%s", a, b ? b : "", c ? c : "");
  if (n < 0 || (size_t)n >= sizeof(s->dir) - 80) { /* room for "/<key>.lock" etc. */
    s->dir[0] = '\0';
    return false;
  }
  return true;
}

/* A tier-2 name is one path component of [A-Za-z0-9._-]. */
static bool tier2_name_ok(const char* v) {
  if (!v[0] || strcmp(v, ".") == 0 || strcmp(v, "..") == 0) return false;
  for (const char* p = v; *p; p++) {
    char ch = *p;
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-';
    if (!ok) return false;
  }
  return true;
}

static void load_config_locked(void) {
  memset(&g_tier, 0, sizeof(g_tier));
  g_loaded = true;

  tier_state_t* s2 = &g_tier[2];
  const char* v = tpu_env_str(TIER2_ENV);
  if (!v) v = "default";
  if (strcmp(v, "disabled") != 0) {
    bool ok;
    if (v[0] == '/') ok = set_dir(s2, v, NULL, NULL);
    else if (tier2_name_ok(v)) ok = set_dir(s2, TIER2_BASE "/", v, NULL);
    else ok = false;
    if (ok) {
      s2->configured = true;
    } else {
      s2->dir[0] = '\0';
      s2->warned = true;
      queue_warning_locked(
          "TorchTPU compilation cache tier 2 is off: " TIER2_ENV
          "='%.200s' is neither a name of [A-Za-z0-9._-], an absolute directory, nor 'disabled'",
          v);
    }
  }

  tier_state_t* s3 = &g_tier[3];
  v = tpu_env_str(TIER3_ENV);
  if (v && v[0] && strcmp(v, "disabled") == 0) return;
  bool ok = false;
  if (v && v[0]) {
    ok = set_dir(s3, v, "/", TPU_RUNTIME_VERSION);
  } else {
    const char* xdg = tpu_env_str("XDG_CACHE_HOME");
    const char* home = tpu_env_str("HOME");
    if (xdg && xdg[0] == '/') ok = set_dir(s3, xdg, "/torch_tpu/", TPU_RUNTIME_VERSION);
    else if (home && home[0] == '/') ok = set_dir(s3, home, "/.cache/torch_tpu/", TPU_RUNTIME_VERSION);
  }
  if (ok) {
    s3->configured = true;
  } else {
    s3->dir[0] = '\0';
    s3->warned = true;
    queue_warning_locked("TorchTPU compilation cache tier 3 is off: no usable directory (set " TIER3_ENV
                         ", XDG_CACHE_HOME or HOME to an absolute path)");
  }
}

static void ensure_loaded_locked(void) {
  if (!g_loaded) load_config_locked();
}

/* mkdir -p with the given mode for every directory created. */
static int mkdir_p(const char* path, mode_t mode) {
  char buf[PATH_MAX];
  size_t n = strlen(path);
  if (n == 0 || n >= sizeof(buf)) return ENAMETOOLONG;
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != '\0') continue;
    char saved = buf[i];
    buf[i] = '\0';
    if (mkdir(buf, mode) != 0 && errno != EEXIST) {
      int e = errno;
      buf[i] = saved;
      return e;
    }
    buf[i] = saved;
  }
  return 0;
}

/* Creates and checks the directory of tier t once per configuration. Called
 * with g_mu held (directory creation is quick and happens once). */
static bool prepare_tier_locked(int t) {
  tier_state_t* s = &g_tier[t];
  if (!s->configured) return false;
  if (s->prepared) return s->usable;
  s->prepared = true;
  s->usable = false;
  char msg[PATH_MAX + 200];
  int e = mkdir_p(s->dir, 0700);
  struct stat st;
  if (stat(s->dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    snprintf(msg, sizeof(msg), "cannot create the directory (%s); this tier is off",
             strerror(e ? e : ENOTDIR));
    warn_tier_locked(t, msg);
    return false;
  }
  /* Entries are loaded as code: refuse a directory that others could write. */
  if ((st.st_uid != geteuid() && st.st_uid != 0) || (st.st_mode & (S_IWGRP | S_IWOTH))) {
    warn_tier_locked(t,
                     "the directory is owned by another user or writable by group/others; this "
                     "tier is off (executables are loaded from it)");
    return false;
  }
  if (t == 2) {
    struct statvfs vs;
    if (statvfs(s->dir, &vs) == 0 && (vs.f_flag & ST_NOEXEC)) {
      warn_tier_locked(t,
                       "the directory is on a noexec mount, so executables cannot be loaded from "
                       "it; this tier is off (set " TIER2_ENV " to an absolute directory elsewhere)");
      return false;
    }
  }
  s->usable = true;
  return true;
}

/* Copies the directory of tier t to out when the tier is usable. */
static bool tier_dir_copy(int t, char out[PATH_MAX]) {
  pthread_mutex_lock(&g_mu);
  ensure_loaded_locked();
  bool ok = prepare_tier_locked(t);
  if (ok) memcpy(out, g_tier[t].dir, sizeof(g_tier[t].dir));
  pthread_mutex_unlock(&g_mu);
  return ok;
}

/* Counts a failed store into tier t and warns once. */
static void note_store_failure(int t, const char* what, int err) {
  char msg[256];
  snprintf(msg, sizeof(msg),
           "cannot store compiled executables (%s: %s); this tier is skipped, the others still work",
           what, strerror(err));
  pthread_mutex_lock(&g_mu);
  g_stats.store_failures++;
  warn_tier_locked(t, msg);
  pthread_mutex_unlock(&g_mu);
}

void tpu_cache_reload_config(void) {
  pthread_mutex_lock(&g_mu);
  load_config_locked();
  pthread_mutex_unlock(&g_mu);
}

const char* tpu_cache_dir(int tier) {
  if (tier != 2 && tier != 3) return NULL;
  pthread_mutex_lock(&g_mu);
  ensure_loaded_locked();
  const char* d = prepare_tier_locked(tier) ? g_tier[tier].dir : NULL;
  pthread_mutex_unlock(&g_mu);
  return d;
}

const char* tpu_cache_pop_warning(void) {
  static _Thread_local char out[WARN_LEN];
  pthread_mutex_lock(&g_mu);
  ensure_loaded_locked(); /* configuration problems are warnings too */
  bool any = g_warn_count > 0;
  if (any) {
    memcpy(out, g_warn[g_warn_head], WARN_LEN);
    g_warn_head = (g_warn_head + 1) % WARN_SLOTS;
    g_warn_count--;
  }
  pthread_mutex_unlock(&g_mu);
  return any ? out : NULL;
}

void tpu_cache_note_miss(void) {
  pthread_mutex_lock(&g_mu);
  g_stats.misses++;
  pthread_mutex_unlock(&g_mu);
}

void tpu_cache_note_compile(double seconds) {
  pthread_mutex_lock(&g_mu);
  g_stats.compiles++;
  g_stats.compile_seconds += seconds;
  pthread_mutex_unlock(&g_mu);
}

void tpu_cache_get_stats(tpu_cache_stats_t* out) {
  if (!out) return;
  pthread_mutex_lock(&g_mu);
  *out = g_stats;
  pthread_mutex_unlock(&g_mu);
}

void tpu_cache_reset_stats(void) {
  pthread_mutex_lock(&g_mu);
  memset(&g_stats, 0, sizeof(g_stats));
  pthread_mutex_unlock(&g_mu);
}

/* ---- tier 1: chained hash map ---- */
typedef struct t1_node {
  struct t1_node* next;
  uint64_t hash;
  void* value;
  char key[]; /* NUL-terminated */
} t1_node_t;

static pthread_mutex_t g_t1_mu = PTHREAD_MUTEX_INITIALIZER;
static t1_node_t** g_t1_buckets;
static size_t g_t1_nbuckets, g_t1_count;

static t1_node_t** t1_slot(const char* key, uint64_t h) {
  t1_node_t** pp = &g_t1_buckets[h & (g_t1_nbuckets - 1)];
  while (*pp && ((*pp)->hash != h || strcmp((*pp)->key, key) != 0)) pp = &(*pp)->next;
  return pp;
}

static bool t1_grow(void) {
  size_t nb = g_t1_nbuckets ? g_t1_nbuckets * 2 : 64;
  t1_node_t** b = calloc(nb, sizeof(*b));
  if (!b) return false;
  for (size_t i = 0; i < g_t1_nbuckets; i++) {
    t1_node_t* n = g_t1_buckets[i];
    while (n) {
      t1_node_t* next = n->next;
      n->next = b[n->hash & (nb - 1)];
      b[n->hash & (nb - 1)] = n;
      n = next;
    }
  }
  free(g_t1_buckets);
  g_t1_buckets = b;
  g_t1_nbuckets = nb;
  return true;
}

void* tpu_cache_tier1_get(const char* key) {
  if (!key || !key[0]) return NULL;
  uint64_t h = tpu_cache_hash64(key, strlen(key), 0);
  void* v = NULL;
  pthread_mutex_lock(&g_t1_mu);
  if (g_t1_nbuckets) {
    t1_node_t* n = *t1_slot(key, h);
    if (n) v = n->value;
  }
  pthread_mutex_unlock(&g_t1_mu);
  if (v) {
    pthread_mutex_lock(&g_mu);
    g_stats.tier1_hits++;
    pthread_mutex_unlock(&g_mu);
  }
  return v;
}

void tpu_cache_tier1_put(const char* key, void* value) {
  if (!key || !key[0]) return;
  size_t len = strlen(key);
  uint64_t h = tpu_cache_hash64(key, len, 0);
  pthread_mutex_lock(&g_t1_mu);
  if (!value) {
    if (g_t1_nbuckets) {
      t1_node_t** pp = t1_slot(key, h);
      t1_node_t* n = *pp;
      if (n) {
        *pp = n->next;
        free(n);
        g_t1_count--;
      }
    }
  } else if (g_t1_nbuckets || t1_grow()) {
    t1_node_t** pp = t1_slot(key, h);
    if (*pp) {
      (*pp)->value = value;
    } else {
      t1_node_t* n = malloc(sizeof(*n) + len + 1);
      if (n) { /* out of memory: the key simply stays uncached */
        n->next = NULL;
        n->hash = h;
        n->value = value;
        memcpy(n->key, key, len + 1);
        *pp = n;
        if (++g_t1_count > g_t1_nbuckets) t1_grow();
      }
    }
  }
  pthread_mutex_unlock(&g_t1_mu);
}

static void t1_clear(void) {
  pthread_mutex_lock(&g_t1_mu);
  for (size_t i = 0; i < g_t1_nbuckets; i++) {
    t1_node_t* n = g_t1_buckets[i];
    while (n) {
      t1_node_t* next = n->next;
      free(n);
      n = next;
    }
  }
  free(g_t1_buckets);
  g_t1_buckets = NULL;
  g_t1_nbuckets = g_t1_count = 0;
  pthread_mutex_unlock(&g_t1_mu);
}

/* ---- file helpers ---- */
/* Reads all of fd into a new buffer (returns errno, 0 on success). */
static int read_fd_all(int fd, unsigned char** out, size_t* out_len) {
  struct stat st;
  if (fstat(fd, &st) != 0) return errno;
  if (!S_ISREG(st.st_mode)) return EINVAL;
  if ((uint64_t)st.st_size > MAX_ENTRY_BYTES) return EFBIG;
  size_t cap = (size_t)st.st_size;
  unsigned char* buf = malloc(cap ? cap : 1);
  if (!buf) return ENOMEM;
  size_t got = 0;
  while (got < cap) {
    ssize_t r = read(fd, buf + got, cap - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      free(buf);
      return e;
    }
    if (r == 0) break; /* shrank meanwhile: the caller sees the short length */
    got += (size_t)r;
  }
  *out = buf;
  *out_len = got;
  return 0;
}

static int write_all(int fd, const void* data, size_t len) {
  const unsigned char* p = data;
  while (len) {
    ssize_t w = write(fd, p, len);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (w == 0) return ENOSPC;
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

static void entry_path(char* out, size_t cap, const char* dir, const char* key) {
  snprintf(out, cap, "%s/%s.so", dir, key);
}

/* Publishes payload + trailer as "<dir>/<key>.so" atomically (temporary file
 * in dir, then rename). Returns errno, 0 on success. */
static int write_entry(const char* dir, const char* key, const unsigned char* payload, size_t len,
                       const unsigned char* trailer) {
  char tmp[PATH_MAX], final_path[PATH_MAX];
  unsigned long n = __atomic_fetch_add(&g_tmp_counter, 1, __ATOMIC_RELAXED);
  snprintf(tmp, sizeof(tmp), "%s/.%s.%ld.%lu.tmp", dir, key, (long)getpid(), n);
  entry_path(final_path, sizeof(final_path), dir, key);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return errno;
  int e = write_all(fd, payload, len);
  if (!e && trailer) e = write_all(fd, trailer, TRAILER_SIZE);
  if (close(fd) != 0 && !e) e = errno;
  if (!e && rename(tmp, final_path) != 0) e = errno;
  if (e) unlink(tmp);
  return e;
}

/* Deletes a corrupt entry at path if it is still the file open as fd. */
static void drop_corrupt(const char* path, int fd) {
  struct stat a, b;
  if (fstat(fd, &a) == 0 && lstat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
    unlink(path);
  pthread_mutex_lock(&g_mu);
  g_stats.corrupt_entries++;
  pthread_mutex_unlock(&g_mu);
}

/* Opens, reads and verifies "<dir>/<key>.so". Returns the file contents (the
 * caller frees) or NULL on a miss; corrupt entries are dropped. */
static unsigned char* load_verified(const char* dir, const char* key, char* path, size_t* len) {
  entry_path(path, PATH_MAX, dir, key);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return NULL;
  unsigned char* buf = NULL;
  size_t n = 0;
  int e = read_fd_all(fd, &buf, &n);
  if (e == 0 && entry_valid(key, buf, n)) {
    close(fd);
    *len = n;
    return buf;
  }
  /* Unreadable for a transient reason (memory): a miss, not corruption. */
  if (e == 0 || e == EFBIG || e == EINVAL) drop_corrupt(path, fd);
  free(buf);
  close(fd);
  return NULL;
}

static bool copy_out(char* path, size_t cap, const char* src) {
  size_t n = strlen(src);
  if (!path || n >= cap) return false;
  memcpy(path, src, n + 1);
  return true;
}

/* ---- tiers 2 and 3 ---- */
/* tpu_cache_find, and when keep is not NULL the verified file contents
 * (payload and trailer; the caller frees them) in *keep, *keep_len. */
static bool find_entry(const char* key, char* path, size_t cap, int* tier, unsigned char** keep,
                       size_t* keep_len) {
  if (!tpu_cache_key_valid(key) || !path || cap == 0) return false;
  char dir[PATH_MAX], p[PATH_MAX];
  size_t len = 0;
  unsigned char* buf = NULL;
  int found = 0;
  if (tier_dir_copy(2, dir) && (buf = load_verified(dir, key, p, &len))) {
    found = 2;
  } else if (tier_dir_copy(3, dir) && (buf = load_verified(dir, key, p, &len))) {
    found = 3;
    /* Promote into tier 2 so the other processes of this host find it there. */
    char dir2[PATH_MAX];
    if (tier_dir_copy(2, dir2)) {
      int e = write_entry(dir2, key, buf, len, NULL);
      if (e == 0) entry_path(p, sizeof(p), dir2, key);
      else note_store_failure(2, "copying a tier-3 entry", e);
    }
  }
  if (!found) return false;
  if (!copy_out(path, cap, p)) {
    free(buf);
    return false;
  }
  if (keep) {
    *keep = buf;
    *keep_len = len;
  } else {
    free(buf);
  }
  if (tier) *tier = found;
  pthread_mutex_lock(&g_mu);
  if (found == 2) g_stats.tier2_hits++;
  else g_stats.tier3_hits++;
  pthread_mutex_unlock(&g_mu);
  return true;
}

bool tpu_cache_find(const char* key, char* path, size_t cap, int* tier) {
  return find_entry(key, path, cap, tier, NULL, NULL);
}

bool tpu_cache_find_bytes(const char* key, void** data, size_t* len, int* tier) {
  char path[PATH_MAX];
  unsigned char* buf = NULL;
  size_t n = 0;
  *data = NULL;
  *len = 0;
  if (!find_entry(key, path, sizeof(path), tier, &buf, &n)) return false;
  *data = buf; /* the trailer stays behind the payload, unreported */
  *len = n - TRAILER_SIZE;
  return true;
}

/* Writes payload (with its trailer) into tiers 2 and 3; best receives the
 * path of the first copy written, or stays empty. */
static void publish_payload(const char* key, const unsigned char* buf, size_t len,
                            char best[PATH_MAX]) {
  unsigned char trailer[TRAILER_SIZE];
  make_trailer(trailer, key, buf, len);
  best[0] = 0;
  for (int t = 2; t <= 3; t++) {
    char dir[PATH_MAX];
    if (!tier_dir_copy(t, dir)) {
      /* Configured but unusable (cannot create it, unsafe, noexec): a failed store. */
      pthread_mutex_lock(&g_mu);
      bool configured = g_tier[t].configured;
      if (configured) g_stats.store_failures++;
      pthread_mutex_unlock(&g_mu);
      continue;
    }
    int e = write_entry(dir, key, buf, len, trailer);
    if (e) {
      note_store_failure(t, "writing an entry", e);
      continue;
    }
    if (!best[0]) entry_path(best, PATH_MAX, dir, key);
  }
}

tpu_status_t tpu_cache_publish_bytes(const char* key, const void* data, size_t len) {
  if (!tpu_cache_key_valid(key))
    return TPU_ERR(INVALID_ARGUMENT, "tpu_cache_publish_bytes: key '%.80s' is not %d..%d hex digits",
                   key ? key : "(null)", TPU_CACHE_KEY_MIN, TPU_CACHE_KEY_MAX);
  if (!data || len == 0)
    return TPU_ERR(INVALID_ARGUMENT, "tpu_cache_publish_bytes: empty payload for key %s", key);
  char best[PATH_MAX];
  publish_payload(key, data, len, best);
  return TPU_OK;
}

void tpu_cache_note_store_failure(const char* fmt, ...) {
  char msg[WARN_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&g_mu);
  g_stats.store_failures++;
  queue_warning_locked("%s", msg);
  pthread_mutex_unlock(&g_mu);
}

tpu_status_t tpu_cache_publish(const char* key, const char* src_path, char* path, size_t cap) {
  if (!tpu_cache_key_valid(key))
    return TPU_ERR(INVALID_ARGUMENT, "tpu_cache_publish: key '%.80s' is not %d..%d hex digits",
                   key ? key : "(null)", TPU_CACHE_KEY_MIN, TPU_CACHE_KEY_MAX);
  if (!src_path || !path || cap == 0)
    return TPU_ERR(INVALID_ARGUMENT, "tpu_cache_publish: NULL source or output path for key %s",
                   key);
  int fd = open(src_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return TPU_ERR(INVALID_ARGUMENT, "tpu_cache_publish: cannot open %s for key %s: %s", src_path,
                   key, strerror(errno));
  unsigned char* buf = NULL;
  size_t len = 0;
  int e = read_fd_all(fd, &buf, &len);
  close(fd);
  if (e)
    return TPU_ERR(INVALID_ARGUMENT, "tpu_cache_publish: cannot read %s for key %s: %s", src_path,
                   key, strerror(e));
  if (len == 0) {
    free(buf);
    return TPU_ERR(INVALID_ARGUMENT, "tpu_cache_publish: %s (key %s) is empty", src_path, key);
  }
  char best[PATH_MAX];
  publish_payload(key, buf, len, best);
  free(buf);
  const char* out = best[0] ? best : src_path;
  if (!copy_out(path, cap, out))
    return TPU_ERR(INVALID_ARGUMENT,
                   "tpu_cache_publish: the path %s (key %s) does not fit the %zu-byte buffer", out,
                   key, cap);
  return TPU_OK;
}

static int64_t lock_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int tpu_cache_lock_wait(const char* key, int64_t timeout_ms) {
  if (!tpu_cache_key_valid(key)) return -1;
  for (int t = 2; t <= 3; t++) {
    char dir[PATH_MAX], p[PATH_MAX];
    if (!tier_dir_copy(t, dir)) continue;
    snprintf(p, sizeof(p), "%s/%s.lock", dir, key);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) continue;
    int r;
    if (timeout_ms < 0) {
      do r = flock(fd, LOCK_EX);
      while (r != 0 && errno == EINTR);
    } else {
      /* Poll: flock has no timeout, and a holder whose compile hangs keeps
       * the lock as long as it lives (a dead holder's lock is released). */
      int64_t deadline = lock_now_ms() + timeout_ms;
      long nap_us = 1000;
      while ((r = flock(fd, LOCK_EX | LOCK_NB)) != 0 && (errno == EWOULDBLOCK || errno == EINTR)) {
        if (lock_now_ms() >= deadline) {
          close(fd);
          return TPU_CACHE_LOCK_BUSY;
        }
        struct timespec ts = {0, nap_us * 1000};
        nanosleep(&ts, NULL);
        if (nap_us < 50000) nap_us *= 2;
      }
    }
    if (r == 0) return fd;
    close(fd);
  }
  return -1;
}

int tpu_cache_lock(const char* key) { return tpu_cache_lock_wait(key, -1); }

void tpu_cache_drop(const char* key) {
  if (!tpu_cache_key_valid(key)) return;
  for (int t = 2; t <= 3; t++) {
    char dir[PATH_MAX], p[PATH_MAX];
    if (!tier_dir_copy(t, dir)) continue;
    entry_path(p, sizeof(p), dir, key);
    if (unlink(p) == 0) {
      pthread_mutex_lock(&g_mu);
      g_stats.corrupt_entries++;
      pthread_mutex_unlock(&g_mu);
    }
  }
}

void tpu_cache_unlock(int handle) {
  if (handle < 0) return;
  flock(handle, LOCK_UN);
  close(handle);
}

/* Parses ".<key>.<pid>.<n>.tmp"; returns the pid or -1. */
static long tmp_file_pid(const char* name) {
  if (name[0] != '.') return -1;
  const char* dot = strchr(name + 1, '.');
  if (!dot) return -1;
  char key[TPU_CACHE_KEY_MAX + 1];
  size_t klen = (size_t)(dot - (name + 1));
  if (klen > TPU_CACHE_KEY_MAX) return -1;
  memcpy(key, name + 1, klen);
  key[klen] = '\0';
  if (!tpu_cache_key_valid(key)) return -1;
  char* end;
  long pid = strtol(dot + 1, &end, 10);
  if (end == dot + 1 || *end != '.' || pid <= 0) return -1;
  const char* q = end + 1;
  strtoul(q, &end, 10);
  if (end == q || strcmp(end, ".tmp") != 0) return -1;
  return pid;
}

/* True for "<key>.so". */
static bool is_entry_name(const char* name) {
  size_t n = strlen(name);
  if (n < 4 || strcmp(name + n - 3, ".so") != 0) return false;
  char key[TPU_CACHE_KEY_MAX + 1];
  if (n - 3 > TPU_CACHE_KEY_MAX) return false;
  memcpy(key, name, n - 3);
  key[n - 3] = '\0';
  return tpu_cache_key_valid(key);
}

static tpu_status_t clear_dir_tier(int t) {
  char dir[PATH_MAX];
  pthread_mutex_lock(&g_mu);
  ensure_loaded_locked();
  /* Only a directory that passed the checks is ours to clean. */
  bool ok = prepare_tier_locked(t);
  if (ok) memcpy(dir, g_tier[t].dir, sizeof(dir));
  pthread_mutex_unlock(&g_mu);
  if (!ok) return TPU_OK;
  DIR* d = opendir(dir);
  if (!d) {
    if (errno == ENOENT) return TPU_OK;
    return TPU_ERR(INTERNAL, "tpu_cache_clear: cannot list tier %d directory %s: %s", t, dir,
                   strerror(errno));
  }
  int first_err = 0;
  char failed[PATH_MAX] = {0};
  struct dirent* ent;
  while ((ent = readdir(d)) != NULL) {
    const char* name = ent->d_name;
    bool remove = is_entry_name(name);
    if (!remove) {
      long pid = tmp_file_pid(name);
      /* Temporary files of running processes may be about to be renamed. */
      remove = pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
    }
    if (!remove) continue;
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    if (unlink(p) != 0 && errno != ENOENT && !first_err) {
      first_err = errno;
      snprintf(failed, sizeof(failed), "%s", p);
    }
  }
  closedir(d);
  if (first_err)
    return TPU_ERR(INTERNAL, "tpu_cache_clear: cannot delete %s (tier %d): %s", failed, t,
                   strerror(first_err));
  return TPU_OK;
}

tpu_status_t tpu_cache_clear(int tier) {
  if (tier < 0 || tier > 3)
    return TPU_ERR(INVALID_ARGUMENT, "tpu_cache_clear: tier %d is not 0 (all), 1, 2 or 3", tier);
  if (tier == 0 || tier == 1) t1_clear();
  for (int t = 2; t <= 3; t++) {
    if (tier != 0 && tier != t) continue;
    TPU_RETURN_IF_ERROR(clear_dir_tier(t));
  }
  return TPU_OK;
}
