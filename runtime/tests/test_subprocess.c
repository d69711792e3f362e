/* Bounded child processes (base/subprocess.h): exit status and signals, the
 * timeout killing the whole process group, no shell, unknown programs, and
 * the guard killing the program when its caller dies. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/subprocess.h"
#include "test_util.h"

static char g_dir[128];

static bool alive(pid_t pid) {
  char p[64], buf[512];
  snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
  FILE* f = fopen(p, "r");
  if (!f) return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char* r = strrchr(buf, ')');
  return r && r[1] == ' ' && r[2] != 'Z' && r[2] != 'X';
}

/* Waits (up to 20 s) for pid to be gone. */
static bool gone(pid_t pid) {
  for (int i = 0; i < 2000 && alive(pid); i++) usleep(10000);
  return !alive(pid);
}

static pid_t read_pid(const char* path, int line) {
  for (int i = 0; i < 2000; i++) {
    FILE* f = fopen(path, "r");
    long v = 0, got = -1;
    if (f) {
      for (int k = 0; k <= line && fscanf(f, "%ld", &v) == 1; k++)
        if (k == line) got = v;
      fclose(f);
    }
    if (got > 0) return (pid_t)got;
    usleep(10000);
  }
  return -1;
}

static void test_status(void) {
  tpu_subprocess_result_t r;
  const char* ok[] = {"true", NULL};
  CHECK_OK(tpu_subprocess_run(ok, NULL, 5000, NULL, &r));
  CHECK(r.exited && r.code == 0 && !r.timed_out);
  const char* three[] = {"/bin/sh", "-c", "exit 3", NULL};
  CHECK_OK(tpu_subprocess_run(three, NULL, 5000, NULL, &r));
  CHECK(r.exited && r.code == 3);
  const char* segv[] = {"/bin/sh", "-c", "kill -SEGV $$", NULL};
  CHECK_OK(tpu_subprocess_run(segv, NULL, 5000, NULL, &r));
  CHECK(!r.exited && r.code == SIGSEGV && !r.timed_out);
  /* arguments are not given to a shell */
  char log[256], buf[256] = {0};
  snprintf(log, sizeof log, "%s/echo.txt", g_dir);
  const char* echo[] = {"echo", "a  b", "$HOME", "'q'", NULL};
  CHECK_OK(tpu_subprocess_run(echo, log, 5000, NULL, &r));
  FILE* f = fopen(log, "r");
  CHECK(f && fgets(buf, sizeof buf, f));
  if (f) fclose(f);
  CHECK(strcmp(buf, "a  b $HOME 'q'\n") == 0);
  /* a program that does not exist is an error, no process is started */
  const char* none[] = {"/nonexistent/cc", NULL};
  tpu_status_t st = tpu_subprocess_run(none, NULL, 5000, NULL, &r);
  CHECK(st != TPU_OK && tpu_status_code(st) == TPU_CODE_INVALID_ARGUMENT);
  tpu_status_free(st);
  const char* none2[] = {"no_such_program_tpu_test", NULL};
  st = tpu_subprocess_run(none2, NULL, 5000, NULL, &r);
  CHECK(st != TPU_OK);
  tpu_status_free(st);
}

/* A program that hangs, with a child of its own: both die at the timeout,
 * and the guard deletes the listed paths. */
static void test_timeout_kills_group(void) {
  char pids[256], file[256], sub[256], script[700];
  snprintf(pids, sizeof pids, "%s/pids", g_dir);
  snprintf(sub, sizeof sub, "%s/sub", g_dir);
  snprintf(file, sizeof file, "%s/sub/f", g_dir);
  CHECK(mkdir(sub, 0700) == 0);
  FILE* f = fopen(file, "w");
  if (f) fclose(f);
  snprintf(script, sizeof script, "echo $$ >> %s; sleep 1000 & echo $! >> %s; wait", pids, pids);
  const char* argv[] = {"/bin/sh", "-c", script, NULL};
  const char* remove[] = {file, sub, NULL};
  tpu_subprocess_result_t r;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  CHECK_OK(tpu_subprocess_run(argv, NULL, 500, remove, &r));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  CHECK(r.timed_out);
  CHECK(dt >= 0.45 && dt < 30);
  pid_t sh = read_pid(pids, 0), sleeper = read_pid(pids, 1);
  CHECK(sh > 0 && sleeper > 0);
  CHECK(gone(sh) && gone(sleeper));
  CHECK(access(sub, F_OK) != 0);
  unlink(pids);
}

/* The caller is killed with SIGKILL while its program runs: the guard still
 * kills the program's group. */
static void test_caller_death(void) {
  char pids[256], script[600];
  snprintf(pids, sizeof pids, "%s/pids2", g_dir);
  snprintf(script, sizeof script, "echo $$ >> %s; sleep 1000 & echo $! >> %s; wait", pids, pids);
  pid_t caller = fork();
  if (caller == 0) {
    const char* argv[] = {"/bin/sh", "-c", script, NULL};
    tpu_subprocess_result_t r;
    tpu_status_t st = tpu_subprocess_run(argv, NULL, 0, NULL, &r);
    (void)st;
    _exit(0);
  }
  pid_t sh = read_pid(pids, 0), sleeper = read_pid(pids, 1);
  CHECK(sh > 0 && sleeper > 0);
  kill(caller, SIGKILL);
  waitpid(caller, NULL, 0);
  CHECK(gone(sh) && gone(sleeper));
  if (alive(sleeper)) kill(sleeper, SIGKILL);
  if (alive(sh)) kill(sh, SIGKILL);
}

/* SIGINT's disposition in the caller is left alone while a program runs
 * (system() ignores it in the whole process meanwhile). */
static volatile sig_atomic_t g_got_int;
static void on_int(int sig) {
  (void)sig;
  g_got_int = 1;
}
static void* raise_int(void* arg) {
  (void)arg;
  usleep(200 * 1000);
  kill(getpid(), SIGINT);
  return NULL;
}
static void test_sigint_reaches_caller(void) {
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_int;
  sigaction(SIGINT, &sa, &old);
  pthread_t t;
  pthread_create(&t, NULL, raise_int, NULL);
  const char* argv[] = {"sleep", "1", NULL};
  tpu_subprocess_result_t r;
  CHECK_OK(tpu_subprocess_run(argv, NULL, 10000, NULL, &r));
  pthread_join(t, NULL);
  CHECK(g_got_int == 1);
  CHECK(r.exited && r.code == 0); /* the program is in its own group: not interrupted */
  sigaction(SIGINT, &old, NULL);
}

int main(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/tpu_subprocess_test_XXXXXX");
  if (!mkdtemp(g_dir)) {
    perror("mkdtemp");
    return 1;
  }
  test_status();
  test_timeout_kills_group();
  test_caller_death();
  test_sigint_reaches_caller();
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", g_dir);
  TEST_MAIN_END();
}
