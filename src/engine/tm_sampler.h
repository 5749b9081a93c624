/* tm_sampler.h -- logits processing and sampling: penalties, temperature, top-k, top-p, min-p, seeded RNG. */
#ifndef TM_SAMPLER_H
#define TM_SAMPLER_H

#include "core/tm_core.h"

typedef struct tm_sampling_params {
    float temperature;       /* 0 = greedy (argmax); default 0.8 in CLI */
    int32_t top_k;           /* <= 0: off */
    float top_p;             /* >= 1: off */
    float min_p;             /* <= 0: off */
    float repeat_penalty;    /* 1: off (llama.cpp style: logit/p if >0 else logit*p, over last repeat_last_n) */
    float presence_penalty;  /* 0: off (OpenAI style: -= p if token seen in output) */
    float frequency_penalty; /* 0: off (OpenAI style: -= p * count in output) */
    int32_t repeat_last_n;   /* window for repeat_penalty; 64 default, -1 = all */
    uint64_t seed;           /* per-request RNG seed */
    int32_t n_logprobs;      /* top-N logprobs to report (0..20) */
} tm_sampling_params;

tm_sampling_params tm_sampling_default(void);
/* Validate ranges (temperature >= 0, top_p in (0,1], min_p in [0,1], n_logprobs in [0,20], ...). */
tm_status tm_sampling_validate(const tm_sampling_params *p, tm_error *err);

typedef struct tm_logprob {
    int32_t id;
    float logprob;           /* log-softmax of the raw (unprocessed) logits */
} tm_logprob;

typedef struct tm_sampler tm_sampler;

tm_status tm_sampler_create(const tm_sampling_params *p, int32_t n_vocab, tm_sampler **out, tm_error *err);
void tm_sampler_free(tm_sampler *s);
/* Sample one token from logits (n_vocab floats; may be modified in place). `hist` are the ids
 * generated so far (for penalties; prompt ids are not included). When n_logprobs > 0, `chosen` gets
 * the sampled id's logprob and `top` (n_logprobs entries) the most likely ids, both from the raw logits.
 * Deterministic for a given seed and call sequence. No allocation after create. */
int32_t tm_sampler_sample(tm_sampler *s, float *logits, const int32_t *hist, size_t n_hist, tm_logprob *chosen,
                          tm_logprob *top);

/* The RNG (xoshiro256**), exposed for tests. */
typedef struct tm_rng { uint64_t s[4]; } tm_rng;
void tm_rng_seed(tm_rng *r, uint64_t seed);
uint64_t tm_rng_next(tm_rng *r);
float tm_rng_uniform(tm_rng *r); /* [0, 1) */

#endif /* TM_SAMPLER_H */
