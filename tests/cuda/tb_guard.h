/* tb_guard.h -- test-bed robustness: named cases, checked host allocations, crash/hang reports, a time budget. */
#ifndef TB_GUARD_H
#define TB_GUARD_H

/* Include after tb_common.h. Usage: tb_guard_init() first in main; tb_case("fmt", ...) before each case (prints
 * "CASE <name>", flushed, so the last such line of a log names the case that was running); tb_xmalloc instead of
 * malloc (exits 2 with the case name when it fails); tb_budget_ok() before each optional (timing) case.
 * A fatal signal prints "# CRASH (fatal signal) in case <name>" and re-raises it (the exit status still says
 * which); the watchdog (TB_WATCHDOG_S seconds, default 170, under scripts/gpu.sh's 180 s timeout) prints
 * "# TIMEOUT in case <name>" and exits 124. The budget: tb_budget_ok() is false once the process has run
 * TB_BUDGET_S seconds (default `dflt` given to tb_guard_init); tb_guard_skipped() counts the refusals. */

#include <signal.h>
#include <stdarg.h>
#include <unistd.h>

#include "tb_common.h"

static char tb_case_name[256] = "start";
static double tb_guard_t0, tb_guard_budget;
static int tb_guard_nskip;

static inline double tb_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void tb_case(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tb_case_name, sizeof tb_case_name, fmt, ap);
    va_end(ap);
    printf("CASE %s\n", tb_case_name);
    fflush(stdout);
}

static inline void *tb_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "malloc(%zu) failed in case %s\n", bytes, tb_case_name);
        exit(2);
    }
    return p;
}

static inline void tb_put_str(const char *s) { /* async-signal-safe */
    size_t n = 0;
    while (s[n]) n++;
    ssize_t r = write(STDOUT_FILENO, s, n);
    (void)r;
}

static void tb_on_fatal(int sig) {
    tb_put_str(sig == SIGALRM ? "\n# TIMEOUT in case " : "\n# CRASH (fatal signal) in case ");
    tb_put_str(tb_case_name);
    tb_put_str("\n");
    if (sig == SIGALRM) _exit(124);
    signal(sig, SIG_DFL); /* re-raise: the exit status still says which signal */
    raise(sig);
}

static inline void tb_guard_init(double budget_s) {
    tb_guard_t0 = tb_now_s();
    tb_guard_budget = tb_env_d("TB_BUDGET_S", budget_s);
    const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = tb_on_fatal;
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
    alarm((unsigned)tb_env_d("TB_WATCHDOG_S", 170.0));
}

static inline double tb_elapsed_s(void) { return tb_now_s() - tb_guard_t0; }

static inline bool tb_budget_ok(void) {
    if (tb_elapsed_s() < tb_guard_budget) return true;
    tb_guard_nskip++;
    return false;
}

/* prints the skip count (if any) with a '#' line */
static inline void tb_guard_report(const char *name) {
    if (tb_guard_nskip)
        printf("# %s: time budget TB_BUDGET_S=%.0f s reached, %d timing cases skipped\n", name, tb_guard_budget,
               tb_guard_nskip);
    printf("# %s: %.1f s\n", name, tb_elapsed_s());
    fflush(stdout);
}

#endif /* TB_GUARD_H */
