/* The three-tier executable cache: round trips, promotion, corruption,
 * unwritable tiers, clearing, statistics, the inter-process lock, dlopen of
 * entries, concurrent publishers. Every directory lives under a fresh
 * /tmp/tpu_cache_test_* directory (never the user's real cache). */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"
#include "tpu/cache.h"

static char g_base[256];
static char g_payload[300]; /* a plain file to publish (not a real .so) */
static char g_t2[300], g_t3root[300], g_t3[400];

static const char* K1 = "0123456789abcdef";
static const char* K2 = "fedcba98765432100123456789abcdef";
static const char* K3 = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void drain_warnings(void) {
  while (tpu_cache_pop_warning()) {
  }
}

static int count_warnings(void) {
  int n = 0;
  while (tpu_cache_pop_warning()) n++;
  return n;
}

/* Sets both variables (NULL: unset) and re-reads them. */
static void configure(const char* t2, const char* t3) {
  if (t2) setenv("TORCH_TPU_TIER2_COMPILATION_CACHE", t2, 1);
  else unsetenv("TORCH_TPU_TIER2_COMPILATION_CACHE");
  if (t3) setenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", t3, 1);
  else unsetenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT");
  tpu_cache_reload_config();
  drain_warnings();
}

static void configure_default_dirs(void) { configure(g_t2, g_t3root); }

static void write_file(const char* path, const void* data, size_t n) {
  FILE* f = fopen(path, "wb");
  CHECK(f != NULL);
  if (!f) return;
  CHECK(fwrite(data, 1, n, f) == n);
  fclose(f);
}

static long file_size(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static bool exists(const char* path) { return access(path, F_OK) == 0; }

static void entry(char* out, size_t cap, const char* dir, const char* key) {
  snprintf(out, cap, "%s/%s.so", dir, key);
}

static void rm_rf(const char* path) {
  char cmd[600];
  snprintf(cmd, sizeof(cmd), "chmod -R u+rwx '%s' 2>/dev/null; rm -rf '%s'", path, path);
  if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", path);
}

static void test_hash_and_keys(void) {
  CHECK(tpu_cache_hash64("", 0, 0) == 0xef46db3751d8e999ull);
  CHECK(tpu_cache_hash64("abc", 3, 0) == 0x44bc2cf5ad770999ull);
  const char* s = "Nobody inspects the spammish repetition";
  CHECK(tpu_cache_hash64(s, strlen(s), 0) == 0xfbcea83c8a378bf1ull);
  CHECK(tpu_cache_key_valid(K1) && tpu_cache_key_valid(K2) && tpu_cache_key_valid(K3));
  CHECK(!tpu_cache_key_valid("0123456789abcde"));     /* 15 digits */
  CHECK(!tpu_cache_key_valid("0123456789ABCDEF"));    /* uppercase */
  CHECK(!tpu_cache_key_valid("../3456789abcdef0"));   /* path characters */
  CHECK(!tpu_cache_key_valid(NULL));
  char k65[66];
  memset(k65, 'a', 65);
  k65[65] = '\0';
  CHECK(!tpu_cache_key_valid(k65));
}

static void test_tier1(void) {
  tpu_cache_reset_stats();
  int a = 1, b = 2;
  CHECK(tpu_cache_tier1_get(K1) == NULL);
  tpu_cache_tier1_put(K1, &a);
  tpu_cache_tier1_put(K2, &b);
  CHECK(tpu_cache_tier1_get(K1) == &a);
  CHECK(tpu_cache_tier1_get(K2) == &b);
  tpu_cache_tier1_put(K1, &b); /* replace */
  CHECK(tpu_cache_tier1_get(K1) == &b);
  /* many keys force the map to grow */
  static int vals[1000];
  char key[32];
  for (int i = 0; i < 1000; i++) {
    snprintf(key, sizeof(key), "%016x", i);
    tpu_cache_tier1_put(key, &vals[i]);
  }
  int good = 0;
  for (int i = 0; i < 1000; i++) {
    snprintf(key, sizeof(key), "%016x", i);
    good += tpu_cache_tier1_get(key) == &vals[i];
  }
  CHECK(good == 1000);
  tpu_cache_tier1_put(K2, NULL); /* removal */
  CHECK(tpu_cache_tier1_get(K2) == NULL);
  tpu_cache_stats_t st;
  tpu_cache_get_stats(&st);
  CHECK(st.tier1_hits == 1003);
  CHECK_OK(tpu_cache_clear(1));
  CHECK(tpu_cache_tier1_get(K1) == NULL);
  tpu_cache_tier1_put(K1, &a); /* usable again after a clear */
  CHECK(tpu_cache_tier1_get(K1) == &a);
  CHECK_OK(tpu_cache_clear(1));
}

static void test_round_trip(void) {
  configure_default_dirs();
  CHECK(tpu_cache_dir(2) && strcmp(tpu_cache_dir(2), g_t2) == 0);
  CHECK(tpu_cache_dir(3) && strcmp(tpu_cache_dir(3), g_t3) == 0);
  CHECK_OK(tpu_cache_clear(0));
  tpu_cache_reset_stats();
  char path[512];
  int tier = -1;
  CHECK(!tpu_cache_find(K1, path, sizeof(path), &tier));
  CHECK_OK(tpu_cache_publish(K1, g_payload, path, sizeof(path)));
  char e2[512], e3[512];
  entry(e2, sizeof(e2), g_t2, K1);
  entry(e3, sizeof(e3), g_t3, K1);
  CHECK(strcmp(path, e2) == 0);
  CHECK(file_size(e2) == file_size(g_payload) + 32);
  CHECK(file_size(e3) == file_size(g_payload) + 32);
  /* the entry starts with the payload bytes */
  FILE* f = fopen(e2, "rb");
  unsigned char head[16] = {0};
  CHECK(f && fread(head, 1, 16, f) == 16);
  if (f) fclose(f);
  for (int i = 0; i < 16; i++) CHECK(head[i] == (unsigned char)(i * 7 + 3));
  CHECK(tpu_cache_find(K1, path, sizeof(path), &tier));
  CHECK(tier == 2 && strcmp(path, e2) == 0);
  /* tier 3 alone: remove the tier-2 entry; the hit is promoted to tier 2 */
  CHECK_OK(tpu_cache_clear(2));
  CHECK(!exists(e2) && exists(e3));
  CHECK(tpu_cache_find(K1, path, sizeof(path), &tier));
  CHECK(tier == 3 && strcmp(path, e2) == 0);
  CHECK(exists(e2) && file_size(e2) == file_size(e3));
  CHECK(tpu_cache_find(K1, path, sizeof(path), &tier));
  CHECK(tier == 2);
  /* path buffer too small: a miss, nothing counted */
  char tiny[8];
  CHECK(!tpu_cache_find(K1, tiny, sizeof(tiny), &tier));
  tpu_status_t st = tpu_cache_publish(K1, g_payload, tiny, sizeof(tiny));
  CHECK(st != TPU_OK);
  tpu_status_free(st);
  /* bad arguments */
  st = tpu_cache_publish("nothex", g_payload, path, sizeof(path));
  CHECK(st != TPU_OK && tpu_status_code(st) == TPU_CODE_INVALID_ARGUMENT);
  tpu_status_free(st);
  st = tpu_cache_publish(K2, "/nonexistent/file.so", path, sizeof(path));
  CHECK(st != TPU_OK && strstr(tpu_status_message(st), "/nonexistent/file.so"));
  tpu_status_free(st);
  CHECK(!tpu_cache_find("nothex", path, sizeof(path), &tier));
  tpu_cache_stats_t s;
  tpu_cache_get_stats(&s);
  CHECK(s.tier2_hits == 2 && s.tier3_hits == 1 && s.corrupt_entries == 0);
  CHECK(s.store_failures == 0 && s.misses == 0);
  CHECK(count_warnings() == 0);
}

static void test_tier2_disabled(void) {
  configure("disabled", g_t3root);
  CHECK(tpu_cache_dir(2) == NULL);
  CHECK(tpu_cache_dir(3) != NULL);
  CHECK_OK(tpu_cache_clear(0));
  char path[512], e3[512];
  int tier = 0;
  CHECK_OK(tpu_cache_publish(K2, g_payload, path, sizeof(path)));
  entry(e3, sizeof(e3), g_t3, K2);
  CHECK(strcmp(path, e3) == 0);
  CHECK(tpu_cache_find(K2, path, sizeof(path), &tier));
  CHECK(tier == 3 && strcmp(path, e3) == 0);
  /* the lock falls back to the tier-3 directory */
  int h = tpu_cache_lock(K2);
  CHECK(h >= 0);
  char lk[512];
  snprintf(lk, sizeof(lk), "%s/%s.lock", g_t3, K2);
  CHECK(exists(lk));
  tpu_cache_unlock(h);
  /* both off: publish hands back the source, no lock, no hit */
  configure("disabled", "disabled");
  CHECK(tpu_cache_dir(2) == NULL && tpu_cache_dir(3) == NULL);
  CHECK_OK(tpu_cache_publish(K2, g_payload, path, sizeof(path)));
  CHECK(strcmp(path, g_payload) == 0);
  CHECK(!tpu_cache_find(K2, path, sizeof(path), &tier));
  CHECK(tpu_cache_lock(K2) == -1);
  CHECK(count_warnings() == 0);
  /* a tier-2 name that is not one path component is refused with a warning */
  configure(NULL, g_t3root);
  setenv("TORCH_TPU_TIER2_COMPILATION_CACHE", "../evil", 1);
  tpu_cache_reload_config();
  CHECK(tpu_cache_dir(2) == NULL);
  const char* w = tpu_cache_pop_warning();
  CHECK(w && strstr(w, "tier 2"));
  CHECK(tpu_cache_pop_warning() == NULL);
  /* default tier-3 root from XDG_CACHE_HOME */
  char xdg[400], want[600];
  snprintf(xdg, sizeof(xdg), "%s/xdg", g_base);
  setenv("XDG_CACHE_HOME", xdg, 1);
  configure("disabled", NULL);
  snprintf(want, sizeof(want), "%s/torch_tpu/%s", xdg, TPU_RUNTIME_VERSION);
  CHECK(tpu_cache_dir(3) && strcmp(tpu_cache_dir(3), want) == 0);
  unsetenv("XDG_CACHE_HOME");
}

/* Corrupts the tier-2 entry of key with fn, then expects a miss (tier 3 off),
 * the entry deleted and one corrupt entry counted. */
static void expect_corrupt(const char* what, void (*fn)(const char* path)) {
  char path[512], e2[512];
  int tier = 0;
  tpu_cache_reset_stats();
  CHECK_OK(tpu_cache_publish(K3, g_payload, path, sizeof(path)));
  entry(e2, sizeof(e2), g_t2, K3);
  CHECK(strcmp(path, e2) == 0);
  fn(e2);
  bool hit = tpu_cache_find(K3, path, sizeof(path), &tier);
  if (hit) fprintf(stderr, "corruption not detected: %s\n", what);
  CHECK(!hit);
  CHECK(!exists(e2));
  tpu_cache_stats_t s;
  tpu_cache_get_stats(&s);
  CHECK(s.corrupt_entries == 1 && s.tier2_hits == 0);
}

static void corrupt_truncate(const char* p) { CHECK(truncate(p, file_size(p) - 10) == 0); }
static void corrupt_truncate_payload(const char* p) { CHECK(truncate(p, 100) == 0); }
static void corrupt_empty(const char* p) { CHECK(truncate(p, 0) == 0); }
static void flip_at(const char* p, long off) {
  int fd = open(p, O_RDWR);
  CHECK(fd >= 0);
  unsigned char c = 0;
  CHECK(pread(fd, &c, 1, off) == 1);
  c ^= 0x40;
  CHECK(pwrite(fd, &c, 1, off) == 1);
  close(fd);
}
static void corrupt_flip_payload(const char* p) { flip_at(p, 1234); }
static void corrupt_magic(const char* p) { flip_at(p, file_size(p) - 32 + 16); }
static void corrupt_length(const char* p) { flip_at(p, file_size(p) - 32); }
static void corrupt_rename(const char* p) {
  /* a valid entry of another key copied under this key's name */
  char other[512], cmd[1200];
  entry(other, sizeof(other), g_t2, K1);
  snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", other, p);
  CHECK(system(cmd) == 0);
}

static void test_corruption(void) {
  configure(g_t2, "disabled");
  CHECK_OK(tpu_cache_clear(0));
  char path[512];
  CHECK_OK(tpu_cache_publish(K1, g_payload, path, sizeof(path)));
  expect_corrupt("truncated trailer", corrupt_truncate);
  expect_corrupt("truncated payload", corrupt_truncate_payload);
  expect_corrupt("empty file", corrupt_empty);
  expect_corrupt("flipped payload byte", corrupt_flip_payload);
  expect_corrupt("wrong magic", corrupt_magic);
  expect_corrupt("wrong length", corrupt_length);
  expect_corrupt("entry of another key", corrupt_rename);
  /* a corrupt tier-2 entry falls through to a good tier-3 one */
  configure_default_dirs();
  CHECK_OK(tpu_cache_clear(0));
  tpu_cache_reset_stats();
  CHECK_OK(tpu_cache_publish(K3, g_payload, path, sizeof(path)));
  char e2[512];
  entry(e2, sizeof(e2), g_t2, K3);
  corrupt_flip_payload(e2);
  int tier = 0;
  CHECK(tpu_cache_find(K3, path, sizeof(path), &tier));
  CHECK(tier == 3 && strcmp(path, e2) == 0); /* repaired by the promotion */
  CHECK(tpu_cache_find(K3, path, sizeof(path), &tier) && tier == 2);
  tpu_cache_stats_t s;
  tpu_cache_get_stats(&s);
  CHECK(s.corrupt_entries == 1 && s.tier3_hits == 1 && s.tier2_hits == 1);
}

/* Makes a tier-3 root that cannot be written: chmod 0500 as a normal user;
 * as root (which ignores permissions) a path below a regular file. */
static void unwritable_root(char* out, size_t cap) {
  if (geteuid() != 0) {
    snprintf(out, cap, "%s/ro", g_base);
    char dir[800];
    snprintf(dir, sizeof(dir), "%s/%s", out, TPU_RUNTIME_VERSION);
    CHECK(mkdir(out, 0700) == 0 && mkdir(dir, 0700) == 0);
    CHECK(chmod(dir, 0500) == 0);
  } else {
    char file[400];
    snprintf(file, sizeof(file), "%s/plainfile", g_base);
    write_file(file, "x", 1);
    snprintf(out, cap, "%s/sub", file);
  }
}

static void test_unwritable_tier3(void) {
  char ro[700];
  unwritable_root(ro, sizeof(ro));
  configure(g_t2, ro);
  CHECK_OK(tpu_cache_clear(0));
  tpu_cache_reset_stats();
  char path[512], e2[512];
  int tier = 0;
  CHECK_OK(tpu_cache_publish(K1, g_payload, path, sizeof(path)));
  entry(e2, sizeof(e2), g_t2, K1);
  CHECK(strcmp(path, e2) == 0);
  CHECK_OK(tpu_cache_publish(K2, g_payload, path, sizeof(path)));
  tpu_cache_stats_t s;
  tpu_cache_get_stats(&s);
  CHECK(s.store_failures == 2);
  const char* w = tpu_cache_pop_warning();
  CHECK(w && strstr(w, "tier 3"));
  if (w) printf("  queued warning: %s\n", w);
  fflush(stdout); /* forked children must not repeat it */
  CHECK(tpu_cache_pop_warning() == NULL); /* once per tier */
  CHECK(tpu_cache_find(K1, path, sizeof(path), &tier) && tier == 2);
  /* tier 2 unwritable as well: publish hands back the source */
  char ro2[800];
  snprintf(ro2, sizeof(ro2), "%s/%s/sub2", ro, TPU_RUNTIME_VERSION);
  configure(ro2, ro);
  CHECK_OK(tpu_cache_publish(K1, g_payload, path, sizeof(path)));
  CHECK(strcmp(path, g_payload) == 0);
  CHECK(count_warnings() == 2);
  CHECK(tpu_cache_lock(K1) == -1);
  CHECK_OK(tpu_cache_clear(0)); /* nothing to clear, no error */
}

static void test_clear_and_stats(void) {
  configure_default_dirs();
  CHECK_OK(tpu_cache_clear(0));
  tpu_cache_reset_stats();
  char path[512], e2[512], e3[512], stray[512], lk[512], deadtmp[600], livetmp[600];
  CHECK_OK(tpu_cache_publish(K1, g_payload, path, sizeof(path)));
  CHECK_OK(tpu_cache_publish(K2, g_payload, path, sizeof(path)));
  int h = tpu_cache_lock(K1);
  CHECK(h >= 0);
  tpu_cache_unlock(h);
  snprintf(stray, sizeof(stray), "%s/notes.txt", g_t2);
  write_file(stray, "keep", 4);
  snprintf(lk, sizeof(lk), "%s/%s.lock", g_t2, K1);
  /* temporaries: of a process that has exited (removed), of this one (kept) */
  pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, NULL, 0);
  snprintf(deadtmp, sizeof(deadtmp), "%s/.%s.%ld.7.tmp", g_t2, K1, (long)child);
  snprintf(livetmp, sizeof(livetmp), "%s/.%s.%ld.7.tmp", g_t2, K1, (long)getpid());
  write_file(deadtmp, "t", 1);
  write_file(livetmp, "t", 1);
  CHECK_OK(tpu_cache_clear(2));
  entry(e2, sizeof(e2), g_t2, K1);
  entry(e3, sizeof(e3), g_t3, K1);
  CHECK(!exists(e2) && exists(e3));
  CHECK(exists(stray) && exists(lk) && exists(livetmp) && !exists(deadtmp));
  CHECK_OK(tpu_cache_clear(3));
  CHECK(!exists(e3));
  entry(e3, sizeof(e3), g_t3, K2);
  CHECK(!exists(e3));
  unlink(livetmp);
  unlink(stray);
  int tier;
  CHECK(!tpu_cache_find(K1, path, sizeof(path), &tier));
  tpu_status_t st = tpu_cache_clear(4);
  CHECK(st != TPU_OK);
  tpu_status_free(st);

  tpu_cache_note_miss();
  tpu_cache_note_miss();
  tpu_cache_note_compile(0.25);
  tpu_cache_note_compile(0.5);
  tpu_cache_stats_t s;
  tpu_cache_get_stats(&s);
  CHECK(s.misses == 2 && s.compiles == 2);
  CHECK_NEAR(s.compile_seconds, 0.75, 1e-12);
  CHECK(s.tier1_hits == 0 && s.tier2_hits == 0 && s.tier3_hits == 0);
  tpu_cache_reset_stats();
  tpu_cache_get_stats(&s);
  CHECK(s.misses == 0 && s.compiles == 0 && s.compile_seconds == 0.0);
}

/* Writes that fail midway (a file-size limit stands in for a full disk): no
 * tier stores, the source is handed back, no temporary file is left. */
static void test_write_failure(void) {
  configure_default_dirs();
  CHECK_OK(tpu_cache_clear(0));
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {1000, 1000};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(10);
    tpu_cache_reset_stats();
    char path[512];
    tpu_status_t st = tpu_cache_publish(K1, g_payload, path, sizeof(path));
    if (st) _exit(11);
    if (strcmp(path, g_payload) != 0) _exit(12);
    tpu_cache_stats_t s;
    tpu_cache_get_stats(&s);
    if (s.store_failures != 2) _exit(13);
    if (count_warnings() != 2) _exit(14);
    tpu_status_free(tpu_cache_publish(K1, g_payload, path, sizeof(path)));
    if (count_warnings() != 0) _exit(15); /* once per tier */
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  if (WIFEXITED(status) && WEXITSTATUS(status)) fprintf(stderr, "child exit %d\n", WEXITSTATUS(status));
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  char cmd[1200];
  snprintf(cmd, sizeof(cmd), "test -z \"$(ls -A '%s' '%s' | grep -E '[.](tmp|so)$')\"", g_t2,
           g_t3);
  CHECK(system(cmd) == 0);
}

/* A child holds the key's lock and publishes after a delay; the parent blocks
 * on the lock and then finds the child's entry. */
static void test_lock_across_processes(void) {
  configure_default_dirs();
  CHECK_OK(tpu_cache_clear(0));
  int pfd[2];
  CHECK(pipe(pfd) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(pfd[0]);
    int h = tpu_cache_lock(K2);
    char c = h >= 0 ? 'L' : 'E';
    if (write(pfd[1], &c, 1) != 1) _exit(2);
    usleep(300 * 1000);
    char path[512];
    tpu_status_t st = tpu_cache_publish(K2, g_payload, path, sizeof(path));
    tpu_cache_unlock(h);
    _exit(st == TPU_OK ? 0 : 3);
  }
  close(pfd[1]);
  char c = 0;
  CHECK(read(pfd[0], &c, 1) == 1 && c == 'L');
  close(pfd[0]);
  char path[512];
  int tier = 0;
  CHECK(!tpu_cache_find(K2, path, sizeof(path), &tier)); /* the child is still compiling */
  double t0 = now_s();
  int h = tpu_cache_lock(K2);
  double waited = now_s() - t0;
  CHECK(h >= 0);
  CHECK(waited > 0.15);
  CHECK(tpu_cache_find(K2, path, sizeof(path), &tier) && tier == 2);
  tpu_cache_unlock(h);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  /* threads of one process exclude each other too (separate open files) */
  int h1 = tpu_cache_lock(K1);
  int fd2 = -1;
  char lk[512];
  snprintf(lk, sizeof(lk), "%s/%s.lock", g_t2, K1);
  fd2 = open(lk, O_RDWR);
  CHECK(fd2 >= 0 && flock(fd2, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK);
  tpu_cache_unlock(h1);
  CHECK(flock(fd2, LOCK_EX | LOCK_NB) == 0);
  close(fd2);
}

/* A holder that never lets go (a compile that hangs) bounds the wait; one
 * that dies releases the lock at once. */
static void test_lock_wait_bounded(void) {
  configure_default_dirs();
  int pfd[2];
  CHECK(pipe(pfd) == 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(pfd[0]);
    int h = tpu_cache_lock(K3);
    char c = h >= 0 ? 'L' : 'E';
    if (write(pfd[1], &c, 1) != 1) _exit(2);
    for (;;) pause(); /* hung */
  }
  close(pfd[1]);
  char c = 0;
  CHECK(read(pfd[0], &c, 1) == 1 && c == 'L');
  close(pfd[0]);
  double t0 = now_s();
  int h = tpu_cache_lock_wait(K3, 300);
  double waited = now_s() - t0;
  CHECK(h == TPU_CACHE_LOCK_BUSY);
  CHECK(waited >= 0.29);
  tpu_cache_unlock(h); /* a no-op on a failed handle */
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  /* the dead holder's lock is free: taken without waiting the bound out */
  h = tpu_cache_lock_wait(K3, 60 * 1000);
  CHECK(h >= 0);
  tpu_cache_unlock(h);
  /* no usable tier: no lock, not BUSY */
  configure("disabled", "disabled");
  CHECK(tpu_cache_lock_wait(K3, 100) == -1);
  configure_default_dirs();
}

/* tpu_cache_drop deletes a verified entry from both tiers. */
static void test_drop(void) {
  configure_default_dirs();
  CHECK_OK(tpu_cache_clear(0));
  char path[512], p2[512], p3[512];
  CHECK_OK(tpu_cache_publish(K1, g_payload, path, sizeof(path)));
  entry(p2, sizeof(p2), g_t2, K1);
  entry(p3, sizeof(p3), g_t3, K1);
  CHECK(exists(p2) && exists(p3));
  tpu_cache_reset_stats();
  tpu_cache_drop(K1);
  CHECK(!exists(p2) && !exists(p3));
  tpu_cache_stats_t st;
  tpu_cache_get_stats(&st);
  CHECK(st.corrupt_entries == 2);
  int tier = 0;
  CHECK(!tpu_cache_find(K1, path, sizeof(path), &tier));
  tpu_cache_drop("not a key"); /* ignored */
}

/* Builds a real shared object, publishes it and dlopens the entries. */
static void test_dlopen(void) {
  if (system("cc --version >/dev/null 2>&1") != 0) {
    printf("  cc missing: dlopen test skipped\n");
    return;
  }
  char src[400], so[400], cmd[1200];
  snprintf(src, sizeof(src), "%s/exe.c", g_base);
  snprintf(so, sizeof(so), "%s/exe.so", g_base);
  const char* code = "int tpu_cache_test_answer(int x) { return 40 + x; }\n";
  write_file(src, code, strlen(code));
  snprintf(cmd, sizeof(cmd), "cc -shared -fPIC -O1 -o '%s' '%s'", so, src);
  CHECK(system(cmd) == 0);
  configure_default_dirs();
  CHECK_OK(tpu_cache_clear(0));
  const char* key = "00112233445566778899aabbccddeeff";
  char path[512];
  int tier = 0;
  CHECK_OK(tpu_cache_publish(key, so, path, sizeof(path)));
  CHECK(tpu_cache_find(key, path, sizeof(path), &tier) && tier == 2);
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) fprintf(stderr, "dlopen(%s): %s\n", path, dlerror());
  CHECK(lib != NULL);
  if (lib) {
    int (*fn)(int) = (int (*)(int))dlsym(lib, "tpu_cache_test_answer");
    CHECK(fn && fn(2) == 42);
    tpu_cache_tier1_put(key, lib);
    CHECK(tpu_cache_tier1_get(key) == lib);
    CHECK_OK(tpu_cache_clear(1));
    dlclose(lib);
  }
  /* the tier-3 copy loads as well */
  char e3[512];
  entry(e3, sizeof(e3), g_t3, key);
  void* lib3 = dlopen(e3, RTLD_NOW | RTLD_LOCAL);
  CHECK(lib3 != NULL);
  if (lib3) {
    int (*fn)(int) = (int (*)(int))dlsym(lib3, "tpu_cache_test_answer");
    CHECK(fn && fn(0) == 40);
    dlclose(lib3);
  }
}

/* Several threads publish and look up the same and different keys. */
typedef struct {
  int id;
  int errors;
} worker_t;

static void* worker(void* arg) {
  worker_t* w = arg;
  char key[40], path[512];
  for (int i = 0; i < 40; i++) {
    snprintf(key, sizeof(key), "%016x", (i % 5) + 100 * (i % 2 ? w->id : 0));
    tpu_status_t st = tpu_cache_publish(key, g_payload, path, sizeof(path));
    if (st) {
      w->errors++;
      tpu_status_free(st);
    }
    int tier;
    if (!tpu_cache_find(key, path, sizeof(path), &tier)) w->errors++;
    int h = tpu_cache_lock(key);
    if (h < 0) w->errors++;
    tpu_cache_unlock(h);
    tpu_cache_tier1_put(key, w);
    if (!tpu_cache_tier1_get(key)) w->errors++;
  }
  return NULL;
}

static void test_threads(void) {
  configure_default_dirs();
  CHECK_OK(tpu_cache_clear(0));
  tpu_cache_reset_stats();
  enum { N = 4 };
  pthread_t th[N];
  worker_t w[N];
  for (int i = 0; i < N; i++) {
    w[i].id = i + 1;
    w[i].errors = 0;
    CHECK(pthread_create(&th[i], NULL, worker, &w[i]) == 0);
  }
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < N; i++) CHECK(w[i].errors == 0);
  tpu_cache_stats_t s;
  tpu_cache_get_stats(&s);
  CHECK(s.corrupt_entries == 0 && s.store_failures == 0);
  CHECK(s.tier2_hits == N * 40);
  CHECK_OK(tpu_cache_clear(0));
}

int main(void) {
  snprintf(g_base, sizeof(g_base), "/tmp/tpu_cache_test_XXXXXX");
  if (!mkdtemp(g_base)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(g_payload, sizeof(g_payload), "%s/payload.bin", g_base);
  unsigned char data[5000];
  for (int i = 0; i < (int)sizeof(data); i++) data[i] = (unsigned char)(i * 7 + 3);
  write_file(g_payload, data, sizeof(data));
  snprintf(g_t2, sizeof(g_t2), "%s/t2", g_base);
  snprintf(g_t3root, sizeof(g_t3root), "%s/t3", g_base);
  snprintf(g_t3, sizeof(g_t3), "%s/%s", g_t3root, TPU_RUNTIME_VERSION);

  test_hash_and_keys();
  test_tier1();
  test_round_trip();
  test_tier2_disabled();
  test_corruption();
  test_unwritable_tier3();
  test_clear_and_stats();
  test_write_failure();
  test_lock_across_processes();
  test_lock_wait_bounded();
  test_drop();
  test_dlopen();
  test_threads();

  rm_rf(g_base);
  TEST_MAIN_END();
}
