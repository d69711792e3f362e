/* Bounded child processes (see subprocess.h).
 *
 * Process tree: caller -> guard (fork of the caller without its atfork
 * handlers, its own process group)
 * -> program (vfork + execv, a process group of its own). The guard only
 * makes async-signal-safe calls: it is a fork of a multithreaded process.
 * Everything it needs (the resolved path, argv, the paths to delete) is
 * prepared by the caller before the fork.
 *
 * The caller polls waitpid(guard, WNOHANG) with a short sleep (at most 10 ms)
 * so it can stop at the deadline; at the deadline it sends the guard SIGTERM,
 * whose handler kills the program's group, deletes the paths and exits.
 */
#include "base/subprocess.h"

#include "base/env.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The guard's exit status when it had to kill the program. */
#define GUARD_KILLED 125
/* The guard's exit status when it could not start the program. */
#define GUARD_NO_START 126

/* ---- the guard (runs in the forked child only) ---- */
static volatile pid_t g_guard_program;
static const char* const* g_guard_remove;

static void guard_stop(int sig) {
  (void)sig;
  pid_t c = g_guard_program;
  if (c > 0) {
    kill(-c, SIGKILL);
    kill(c, SIGKILL); /* in case it had not joined its group yet */
    while (waitpid(c, NULL, 0) < 0 && errno == EINTR) {
    }
  }
  for (const char* const* p = g_guard_remove; p && *p; p++)
    if (unlink(*p) != 0) rmdir(*p);
  _exit(GUARD_KILLED);
}

static void guard_default(int sig) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_DFL;
  sigaction(sig, &sa, NULL);
}

static void guard_main(pid_t caller, const char* path, char* const* argv, const char* log_path,
                       const char* const* remove) {
  sigset_t all, term;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, NULL);
  setpgid(0, 0); /* terminal signals for the caller's group do not reach us */
  g_guard_remove = remove;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = guard_stop;
  sigfillset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  /* what the caller (Python) ignores or catches, the program gets by default */
  guard_default(SIGINT);
  guard_default(SIGQUIT);
  guard_default(SIGPIPE);
  guard_default(SIGXFSZ);
  guard_default(SIGHUP);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  struct rlimit nocore = {0, 0};
  setrlimit(RLIMIT_CORE, &nocore);

  int in = open("/dev/null", O_RDONLY);
  int out = log_path ? open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0600)
                     : open("/dev/null", O_WRONLY);
  if (in < 0 || out < 0) _exit(GUARD_NO_START);
  if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0) _exit(GUARD_NO_START);
#ifdef SYS_close_range
  syscall(SYS_close_range, 3u, ~0u, 0u); /* inherited descriptors stay with the caller */
#else
  for (int fd = 3; fd < 1024; fd++) close(fd);
#endif

  pid_t c = vfork();
  if (c == 0) {
    setpgid(0, 0);
    guard_default(SIGTERM);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execv(path, argv);
    _exit(GUARD_NO_START);
  }
  if (c < 0) _exit(GUARD_NO_START);
  setpgid(c, c); /* fails harmlessly once it has exec'd */
  g_guard_program = c;
  if (getppid() != caller) guard_stop(0); /* the caller died before the death signal was set */
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigprocmask(SIG_UNBLOCK, &term, NULL);
  int st = 0;
  pid_t r;
  while ((r = waitpid(c, &st, 0)) < 0 && errno == EINTR) {
  }
  sigprocmask(SIG_BLOCK, &term, NULL);
  if (r < 0) _exit(GUARD_NO_START);
  if (WIFEXITED(st)) _exit(WEXITSTATUS(st));
  int sig = WIFSIGNALED(st) ? WTERMSIG(st) : SIGKILL;
  /* end the same way, so the caller sees the signal */
  guard_default(sig);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  sigprocmask(SIG_UNBLOCK, &one, NULL);
  kill(getpid(), sig);
  _exit(GUARD_KILLED);
}

/* ---- the caller's side ---- */
#define MAX_GUARDS 64
static _Atomic pid_t g_guards[MAX_GUARDS];
static pthread_once_t g_atexit_once = PTHREAD_ONCE_INIT;

void tpu_subprocess_kill_all(void) {
  for (int i = 0; i < MAX_GUARDS; i++) {
    pid_t g = atomic_load(&g_guards[i]);
    if (g > 0) kill(g, SIGTERM);
  }
}

static void register_atexit(void) { atexit(tpu_subprocess_kill_all); }

static int guard_slot_take(pid_t g) {
  for (int i = 0; i < MAX_GUARDS; i++) {
    pid_t zero = 0;
    if (atomic_compare_exchange_strong(&g_guards[i], &zero, g)) return i;
  }
  return -1; /* full: the death signal still covers an abnormal end */
}

static bool is_executable(const char* p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, X_OK) == 0;
}

/* argv[0] as a path: itself when it has a '/', else the first PATH entry
 * that holds an executable file of that name. */
static bool resolve_program(const char* name, char* out, size_t cap) {
  if (strchr(name, '/')) {
    if (strlen(name) >= cap) return false;
    strcpy(out, name);
    return is_executable(out);
  }
  const char* path = tpu_env_str("PATH");
  if (!path) path = "/usr/local/bin:/usr/bin:/bin";
  for (const char* p = path;;) {
    const char* colon = strchr(p, ':');
    size_t n = colon ? (size_t)(colon - p) : strlen(p);
    int w = n ? snprintf(out, cap, "%.*s/%s", (int)n, p, name) : snprintf(out, cap, "./%s", name);
    if (w > 0 && (size_t)w < cap && is_executable(out)) return true;
    if (!colon) break;
    p = colon + 1;
  }
  return false;
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

tpu_status_t tpu_subprocess_run(const char* const* argv, const char* log_path,
                                int64_t timeout_ms, const char* const* remove,
                                tpu_subprocess_result_t* out_result) {
  if (!argv || !argv[0] || !out_result)
    return TPU_ERR(INVALID_ARGUMENT, "tpu_subprocess_run: no program given");
  memset(out_result, 0, sizeof *out_result);
  char path[4096];
  if (!resolve_program(argv[0], path, sizeof path))
    return TPU_ERR(INVALID_ARGUMENT, "tpu_subprocess_run: '%.200s' is not an executable file%s",
                   argv[0], strchr(argv[0], '/') ? "" : " in PATH");
  pthread_once(&g_atexit_once, register_atexit);
  pid_t caller = getpid();
  /* _Fork: no pthread_atfork handlers (a prepare handler taking a lock this
   * thread holds would deadlock; the guard needs none of them). */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  pid_t g = _Fork();
#else
  pid_t g = fork();
#endif
  if (g < 0)
    return TPU_ERR(INTERNAL, "tpu_subprocess_run: cannot start '%.200s': %s", argv[0],
                   strerror(errno));
  if (g == 0) guard_main(caller, path, (char* const*)argv, log_path, remove); /* no return */
  setpgid(g, g);
  int slot = guard_slot_take(g);
  int64_t deadline = timeout_ms > 0 ? mono_ms() + timeout_ms : 0;
  int st = 0, nap = 1;
  bool reaped = false, killed = false;
  for (;;) {
    pid_t r = waitpid(g, &st, WNOHANG);
    if (r == g) {
      reaped = true;
      break;
    }
    if (r < 0 && errno != EINTR) break; /* reaped by someone else (SIGCHLD ignored) */
    if (!killed && deadline && mono_ms() >= deadline) {
      kill(g, SIGTERM); /* the guard kills the program's group and cleans up */
      killed = true;
      deadline = mono_ms() + 10000;
      continue;
    }
    if (killed && mono_ms() >= deadline) { /* a guard that does not react */
      kill(g, SIGKILL);
      while (waitpid(g, &st, 0) < 0 && errno == EINTR) {
      }
      reaped = true;
      break;
    }
    sleep_ms(nap);
    if (nap < 10) nap *= 2;
  }
  if (slot >= 0) atomic_store(&g_guards[slot], 0);
  out_result->timed_out = killed;
  if (!reaped) { /* exit status lost: the caller judges by the output */
    out_result->exited = true;
    out_result->code = 0;
  } else if (WIFEXITED(st)) {
    out_result->exited = true;
    out_result->code = WEXITSTATUS(st);
  } else {
    out_result->exited = false;
    out_result->code = WIFSIGNALED(st) ? WTERMSIG(st) : SIGKILL;
  }
  if (!killed && out_result->exited && out_result->code == GUARD_NO_START)
    return TPU_ERR(INTERNAL, "tpu_subprocess_run: cannot start '%.200s' (%s)", argv[0], path);
  return TPU_OK;
}
