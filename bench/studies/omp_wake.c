/* omp_wake.c -- where an idle OpenMP worker wakes up, and what that costs (the evidence behind
 * fastattn/_kernels/fa_team.h; not part of the package).
 *
 * Each round sleeps 150 ms (the worker goes to sleep, its CPU idles), then opens 8 parallel
 * regions of ~10 us of work per thread back to back, printing each region's wall time and the
 * CPUs the master and the worker ran it on. With -DPLACE the worker moves itself off the master's
 * CPU within the master's affinity mask, as fa_team.h does.
 *
 *   gcc -O2 -fopenmp bench/studies/omp_wake.c -o /tmp/omp_wake && GOMP_SPINCOUNT=20000 /tmp/omp_wake
 *   gcc -O2 -fopenmp -DPLACE bench/studies/omp_wake.c -o /tmp/omp_wake_p && GOMP_SPINCOUNT=20000 /tmp/omp_wake_p
 *
 * 2-vCPU Firecracker guest (Zen 3), 2026-12-02: without placement most rounds ran every region
 * with both threads on one CPU, ~500 us apart (each spins through its time slice at the barrier
 * while the other waits): 0.5-1.2 ms per region; with placement the first region 70-90 us (the
 * wake-up), then 15 us. */
#define _GNU_SOURCE
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void place(int master_cpu, const cpu_set_t *master_mask)
{
#ifdef PLACE
    if (omp_get_thread_num() == 0 || sched_getcpu() != master_cpu)
        return;
    cpu_set_t m = *master_mask;
    CPU_CLR(master_cpu, &m);
    if (CPU_COUNT(&m) > 0)
        sched_setaffinity(0, sizeof m, &m);
#else
    (void)master_cpu;
    (void)master_mask;
#endif
}

int main(void)
{
    cpu_set_t master_mask;
    sched_getaffinity(0, sizeof master_mask, &master_mask);
#pragma omp parallel
    { }
    for (int round = 0; round < 6; round++) {
        usleep(150000);
        printf("round %d:", round);
        for (int r = 0; r < 8; r++) {
            int cpu[2] = {-1, -1};
            int mc = sched_getcpu();
            double t0 = now();
#pragma omp parallel num_threads(2)
            {
                place(mc, &master_mask);
                int id = omp_get_thread_num();
                volatile double s = 0;
                for (int i = 0; i < 20000; i++) s += i;
                cpu[id] = sched_getcpu();
            }
            printf(" %.0fus(cpu %d,%d)", (now() - t0) * 1e6, cpu[0], cpu[1]);
        }
        printf("\n");
    }
    return 0;
}
