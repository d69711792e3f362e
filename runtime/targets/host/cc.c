/* One run of the C compiler for fused and custom kernels (see cc.h). */
#include "targets/host/cc.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/env.h"
#include "base/subprocess.h"
#include "tpu/cache.h"
#include "tpu/parallel.h"

#define DIR_PREFIX "torch_tpu_cc_" /* then <pid>_XXXXXX */

const char* tpu_cc_command(void) {
  const char* cc = tpu_env_str("TORCH_TPU_CC");
  return cc && cc[strspn(cc, " \t")] ? cc : "cc";
}

int64_t tpu_cc_timeout_ms(void) {
  static _Atomic int64_t cached = -2;
  int64_t v = atomic_load(&cached);
  if (v == -2) {
    const double s = tpu_env_double("TORCH_TPU_COMPILE_TIMEOUT_S", 120);
    v = s > 0 ? (int64_t)(s * 1000 + 0.5) : -1;
    atomic_store(&cached, v);
  }
  return v;
}

/* Splits s at blanks into argv (no shell quoting: a word is a run of
 * non-blank characters); -1 when more than cap words. */
static int split_words(char* s, const char** argv, int cap) {
  int n = 0;
  for (char* p = s; *p;) {
    while (*p == ' ' || *p == '\t' || *p == '\n') *p++ = 0;
    if (!*p) break;
    if (n == cap) return -1;
    argv[n++] = p;
    while (*p && *p != ' ' && *p != '\t' && *p != '\n') p++;
  }
  return n;
}

static bool write_file(const char* path, const char* text, size_t len) {
  FILE* f = fopen(path, "wb");
  if (!f) return false;
  bool ok = fwrite(text, 1, len, f) == len;
  return fclose(f) == 0 && ok;
}

static int remove_entry(const char* path, const struct stat* st, int flag, struct FTW* ftw) {
  (void)st;
  (void)ftw;
  if (flag == FTW_DP) rmdir(path);
  else unlink(path);
  return 0;
}

/* The directory for compile directories: $TMPDIR when it is an absolute
 * path that leaves room for our names, else /tmp. */
static const char* tmp_root(void) {
  const char* t = tpu_env_str("TMPDIR");
  return t && t[0] == '/' && strlen(t) < 3000 ? t : "/tmp";
}

/* Removes what dead processes left under tmp_root(): compile directories
 * owned by us whose pid no longer runs (once per process). */
static void clean_stale_dirs(void) {
  const char* root = tmp_root();
  DIR* d = opendir(root);
  if (!d) return;
  struct dirent* ent;
  while ((ent = readdir(d)) != NULL) {
    const char* name = ent->d_name;
    if (strncmp(name, DIR_PREFIX, strlen(DIR_PREFIX)) != 0) continue;
    const char* p = name + strlen(DIR_PREFIX);
    char* end = NULL;
    long pid = strtol(p, &end, 10);
    if (end == p || *end != '_' || pid <= 0 || strlen(end + 1) != 6) continue;
    if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, name);
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) continue;
    nftw(path, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
  }
  closedir(d);
}

void tpu_cc_done(tpu_cc_run_t* r) {
  if (r->dir[0]) nftw(r->dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
  r->dir[0] = 0;
}

enum { MAX_HEADERS = 8, MAX_WORDS = 256 };

void tpu_cc_run(const tpu_cc_job_t* job, tpu_cc_run_t* r) {
  static pthread_once_t clean_once = PTHREAD_ONCE_INIT;
  pthread_once(&clean_once, clean_stale_dirs);
  memset(r, 0, sizeof *r);
  r->timeout_ms = tpu_cc_timeout_ms();
  r->compiler = tpu_cc_command();
  r->outcome = TPU_CC_SETUP;
  if (job->nheaders > MAX_HEADERS) {
    snprintf(r->why, sizeof r->why, "too many embedded headers (%d)", job->nheaders);
    return;
  }
  const char* root = tmp_root();
  snprintf(r->dir, sizeof r->dir, "%s/" DIR_PREFIX "%ld_XXXXXX", root, (long)getpid());
  if (!mkdtemp(r->dir)) {
    snprintf(r->why, sizeof r->why, "cannot create a compile directory under %.400s: %s", root,
             strerror(errno));
    r->dir[0] = 0;
    return;
  }
  /* what the guard removes if the process dies mid-compile: the files, then
   * the directory */
  char hpaths[MAX_HEADERS][4200], cpath[4200];
  const char* remove[MAX_HEADERS + 5];
  int nrm = 0;
  for (int i = 0; i < job->nheaders; i++) {
    snprintf(hpaths[i], sizeof hpaths[i], "%s/%s", r->dir, job->headers[i].name);
    remove[nrm++] = hpaths[i];
  }
  snprintf(cpath, sizeof cpath, "%s/%s", r->dir, job->source_name);
  snprintf(r->so_path, sizeof r->so_path, "%s/kernel.so", r->dir);
  snprintf(r->log_path, sizeof r->log_path, "%s/log.txt", r->dir);
  remove[nrm++] = cpath;
  remove[nrm++] = r->so_path;
  remove[nrm++] = r->log_path;
  remove[nrm++] = r->dir;
  remove[nrm] = NULL;
  for (int i = 0; i < job->nheaders; i++) {
    if (!write_file(hpaths[i], job->headers[i].text, job->headers[i].len)) {
      snprintf(r->why, sizeof r->why, "cannot write the embedded headers under %.400s", r->dir);
      return;
    }
  }
  if (!write_file(cpath, job->source, strlen(job->source))) {
    snprintf(r->why, sizeof r->why, "cannot write the source under %.400s", r->dir);
    return;
  }
  const int len = snprintf(r->words_, sizeof r->words_, "%s %s %s", r->compiler, job->flags,
                           job->extra_flags ? job->extra_flags : "");
  const char* argv[MAX_WORDS];
  int n = len < (int)sizeof r->words_ ? split_words(r->words_, argv, MAX_WORDS - 7) : -1;
  if (n <= 0) {
    snprintf(r->why, sizeof r->why, "the compiler command and flags are too long (at most %d words, %zu bytes)", MAX_WORDS - 7, sizeof r->words_ - 1);
    return;
  }
  r->compiler = argv[0];
  argv[n++] = "-I";
  argv[n++] = r->dir;
  argv[n++] = "-o";
  argv[n++] = r->so_path;
  argv[n++] = cpath;
  argv[n] = NULL;
  const int64_t t0 = tpu_now_ns();
  tpu_subprocess_result_t res;
  tpu_status_t st = tpu_subprocess_run(argv, r->log_path, r->timeout_ms, remove, &res);
  tpu_cache_note_compile(1e-9 * (double)(tpu_now_ns() - t0));
  if (st) {
    r->outcome = TPU_CC_NOT_RUN;
    snprintf(r->why, sizeof r->why, "%s", tpu_status_message(st));
    tpu_status_free(st);
  } else if (res.timed_out) {
    r->outcome = TPU_CC_TIMEOUT;
  } else if (!res.exited || res.code != 0) {
    r->outcome = TPU_CC_FAILED;
    r->exited = res.exited;
    r->code = res.code;
  } else {
    r->outcome = TPU_CC_OK;
  }
}

void tpu_cc_log(const tpu_cc_run_t* r, char* out, size_t cap) {
  out[0] = 0;
  FILE* f = fopen(r->log_path, "r");
  if (!f) return;
  size_t n = fread(out, 1, cap - 1, f);
  fclose(f);
  out[n] = 0;
  char prefix[4200];
  snprintf(prefix, sizeof prefix, "%s/", r->dir);
  const size_t pl = strlen(prefix);
  char* w = out;
  for (const char* p = out; *p;) {
    if (strncmp(p, prefix, pl) == 0) {
      p += pl;
      continue;
    }
    *w++ = *p++;
  }
  *w = 0;
  while (w > out && (w[-1] == '\n' || w[-1] == ' ')) *--w = 0;
}
