/* tm_cuda_lazy.h -- records of bf16 activations their producer left unwritten, and when to write them after all.
 *
 * In an fp8 model the norms and the SwiGLU leave the e4m3 copy the next fp8 product reads, and their bf16 output
 * is left unwritten (the cuda backend's TM_CUDA_FP8_ONLY). A record says how to make it should anything else read
 * it: from `src` (a norm's f32 input after its add, with the norm's weight; or the [gate | up] product, for the
 * SwiGLU). The backend calls tm_lazy_write for every buffer an op writes (a record of that buffer is void; a record
 * made from it can no longer be remade) and tm_lazy_read before an op reads a buffer as bf16. Pure bookkeeping, no
 * CUDA: the unit tests run it on the host (test_cuda_lazy).
 *
 * A norm's record may also be "raw": its producer wrote the residual itself (rounded to bf16) where the norm's
 * output belongs, for a product that norms its input as it reads it (norm-in, tm_cuda_gemv_job.norm_w);
 * tm_lazy_peek_raw finds such a record without dropping it, so that any other reader still gets the norm made. */
#ifndef TM_CUDA_LAZY_H
#define TM_CUDA_LAZY_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"

#define TM_LAZY_MAX 4 /* records at once; the forward has at most two (the norm's and the SwiGLU's) */

typedef struct tm_lazy_rec {
    const void *buf;      /* (n, dim) bf16 left unwritten; NULL: a free record */
    const void *src;      /* what remakes it; NULL once it was overwritten */
    const tm_weight *w;   /* the norm's weight (src f32 (n, dim)); NULL: the SwiGLU of src (n, 2 dim) bf16 */
    float eps;
    bool raw;             /* a norm's: buf holds src rounded to bf16 (norm-in), not nothing */
    int32_t n, dim;
} tm_lazy_rec;

typedef struct tm_lazy {
    tm_lazy_rec rec[TM_LAZY_MAX];
} tm_lazy;

typedef enum tm_lazy_state {
    TM_LAZY_NONE = 0, /* the buffer holds its bf16 values (or was never left unwritten) */
    TM_LAZY_REMAKE,   /* write it now from the record returned */
    TM_LAZY_LOST,     /* left unwritten, and its source was overwritten since: reading it is an error */
} tm_lazy_state;

static inline void tm_lazy_reset(tm_lazy *l) { memset(l, 0, sizeof *l); }

/* p is being written */
static inline void tm_lazy_write(tm_lazy *l, const void *p) {
    for (int k = 0; k < TM_LAZY_MAX; k++) {
        if (l->rec[k].buf == p) l->rec[k].buf = NULL;
        if (l->rec[k].src == p) l->rec[k].src = NULL;
    }
}

/* p is about to be read as bf16; a record of p is dropped (the caller writes p now, or reports the loss) */
static inline tm_lazy_state tm_lazy_read(tm_lazy *l, const void *p, tm_lazy_rec *out) {
    for (int k = 0; k < TM_LAZY_MAX && p; k++)
        if (l->rec[k].buf == p) {
            *out = l->rec[k];
            l->rec[k].buf = NULL;
            return out->src ? TM_LAZY_REMAKE : TM_LAZY_LOST;
        }
    return TM_LAZY_NONE;
}

/* a raw norm record of p whose source is still there (left in place); false if none */
static inline bool tm_lazy_peek_raw(const tm_lazy *l, const void *p, tm_lazy_rec *out) {
    for (int k = 0; k < TM_LAZY_MAX && p; k++)
        if (l->rec[k].buf == p && l->rec[k].raw && l->rec[k].w && l->rec[k].src) {
            *out = l->rec[k];
            return true;
        }
    return false;
}

/* r.buf was left unwritten (after tm_lazy_write of it); false when every record is taken */
static inline bool tm_lazy_add(tm_lazy *l, tm_lazy_rec r) {
    for (int k = 0; k < TM_LAZY_MAX; k++)
        if (!l->rec[k].buf) {
            l->rec[k] = r;
            return true;
        }
    return false;
}

#endif /* TM_CUDA_LAZY_H */
