/* fa_team.h -- keeps an OpenMP team's workers off the CPU its master thread runs on (Linux).
 *
 * Why: when a worker sleeps between calls and its CPU goes idle, the Linux scheduler may wake
 * it on the master's CPU instead (a virtual machine's halted vCPU can look unavailable to the
 * guest's scheduler: seen on 2-vCPU Firecracker guests). The two threads then share one CPU,
 * each spinning through its time slice at the region's barrier while the other waits, and the
 * load balancer can leave them there for seconds: a 10 us region took ~1 ms, and
 * EncoderModel's batch-1 forward after a 150 ms pause took 14 ms instead of 5.5
 * (bench/studies/omp_wake.c, bench/studies/bench_idle_latency.py; bench/results/thread_placement_zen3.txt).
 *
 * What: at the start of a parallel region each worker checks (sched_getcpu, no system call on
 * x86-64) whether it runs on the CPU the master ran on when it opened the region. Only then it
 * narrows its own affinity to the master's affinity mask minus that CPU: the kernel moves it at
 * once, and later wake-ups honour the mask. The mask never holds a CPU the master may not use,
 * so a user's taskset / sched_setaffinity stays in force; nothing is changed when the team has
 * more threads than the master's mask has CPUs, when the user chose a binding for OpenMP
 * (OMP_PROC_BIND, OMP_PLACES, GOMP_CPU_AFFINITY) or when FASTATTN_THREAD_PLACEMENT=0. The
 * master's own affinity is never touched. The state is the threads' affinity itself (nothing is
 * cached), so the three extensions that include this header agree, and so does another
 * library sharing the same OpenMP thread pool.
 *
 * This header is the one way the kernels launch a team (C and Cython alike): fa_team_open
 * also decides its size, the caller's thread count clamped to [1, items], items being the
 * independent work items the region has (a thread more would only wait at its barrier).
 *     fa_team_t team = fa_team_open(n_threads, items);    (master, before the region)
 *     #pragma omp parallel num_threads(team.n)
 *     { fa_team_place(&team); ... }                        (every thread, first thing)
 * In Cython (_openmp.pxd declares these):
 *     cdef fa_team_t team = fa_team_open(n_threads, items)
 *     with nogil, parallel(num_threads=team.n):
 *         fa_team_place(&team)
 * Results do not depend on it: which thread runs which work item never changes an answer. */
#ifndef FA_TEAM_H
#define FA_TEAM_H

#include <stddef.h>

typedef struct {
    int n;        /* threads to launch: num_threads(team.n) */
    int cpu;      /* the master's CPU when it opened the region; -1: no placement */
    long tid;     /* the master's thread id (its affinity mask is the workers' bound) */
} fa_team_t;

/* the team size: n_threads, at most items (a region's independent work items), at least 1 */
static inline int fa_team_size(ptrdiff_t n_threads, ptrdiff_t items)
{
    ptrdiff_t n = n_threads < items ? n_threads : items;
    return n < 1 ? 1 : (int)n;
}

#if defined(__linux__) && defined(_OPENMP)
#ifndef _GNU_SOURCE
#error "fa_team.h needs _GNU_SOURCE defined before the first system header"
#endif
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* 1: place workers, 0: leave them; decided once per extension, from the environment as it is
 * at the first multi-threaded call */
static int fa_team_policy = -1;

static int fa_team_decide(void)
{
    const char *v = getenv("FASTATTN_THREAD_PLACEMENT");
    if (v != NULL && (strcmp(v, "0") == 0 || strcmp(v, "false") == 0 || strcmp(v, "off") == 0))
        return 0;
    /* the user bound OpenMP's threads: their placement wins */
    if (getenv("OMP_PROC_BIND") != NULL || getenv("OMP_PLACES") != NULL ||
        getenv("GOMP_CPU_AFFINITY") != NULL)
        return 0;
    return 1;
}

static inline fa_team_t fa_team_open(ptrdiff_t n_threads, ptrdiff_t items)
{
    fa_team_t t = {fa_team_size(n_threads, items), -1, 0};
    if (t.n < 2)
        return t;
    int on = __atomic_load_n(&fa_team_policy, __ATOMIC_RELAXED);
    if (on < 0) {
        on = fa_team_decide();
        __atomic_store_n(&fa_team_policy, on, __ATOMIC_RELAXED);
    }
    if (!on)
        return t;
    t.cpu = sched_getcpu();
    if (t.cpu >= 0)
        t.tid = (long)syscall(SYS_gettid);
    return t;
}

/* the slow path: this worker shares the master's CPU */
__attribute__((noinline)) static void fa_team_move(const fa_team_t *t)
{
    cpu_set_t want;
    if (sched_getaffinity((pid_t)t->tid, sizeof want, &want) != 0)
        return;                                 /* > CPU_SETSIZE CPUs, or the master is gone */
    if (CPU_COUNT(&want) < omp_get_num_threads() || !CPU_ISSET(t->cpu, &want))
        return;                     /* more threads than CPUs (or the master left its mask) */
    CPU_CLR(t->cpu, &want);
    sched_setaffinity(0, sizeof want, &want);   /* moves this thread now; best effort */
}

static inline void fa_team_place(const fa_team_t *t)
{
    if (t->cpu < 0 || omp_get_thread_num() == 0 || sched_getcpu() != t->cpu)
        return;
    fa_team_move(t);
}

#else /* not Linux, or no OpenMP: nothing to place */

static inline fa_team_t fa_team_open(ptrdiff_t n_threads, ptrdiff_t items)
{
    fa_team_t t = {fa_team_size(n_threads, items), -1, 0};
    return t;
}
static inline void fa_team_place(const fa_team_t *t) { (void)t; }

#endif
#endif /* FA_TEAM_H */
