/* tm_membw.h -- measured DRAM read bandwidth (best of reps over a buffer far larger than the caches). */
#ifndef TM_MEMBW_H
#define TM_MEMBW_H

#include "core/tm_core.h"

tm_status tm_membw_measure(int n_threads, size_t bytes, int reps, double *gb_s, tm_error *err);

#endif /* TM_MEMBW_H */
