/* tm_membw.h -- measured DRAM read bandwidth (best of reps over a buffer far larger than the caches). */
#ifndef TM_MEMBW_H
#define TM_MEMBW_H

#include "core/tm_core.h"

tm_status tm_membw_measure(int n_threads, size_t bytes, int reps, double *gb_s, tm_error *err);

/* A probe kept for repeated measurements (its buffer filled once): bench latency measures the bandwidth next to
 * each group of decode steps, so that each step time is compared with the bandwidth of its own moment. */
typedef struct tm_membw_probe tm_membw_probe;
tm_status tm_membw_probe_create(int n_threads, size_t bytes, tm_membw_probe **out, tm_error *err);
double tm_membw_probe_run(tm_membw_probe *p, int reps); /* best GB/s of reps reads (after one unmeasured read) */
void tm_membw_probe_free(tm_membw_probe *p);

#endif /* TM_MEMBW_H */
