/* tm_sampler.h -- logits processing and sampling: penalties, temperature, top-k, top-p, min-p, seeded RNG. */
#ifndef TM_SAMPLER_H
#define TM_SAMPLER_H

#include "backend/backend.h"
#include "core/tm_core.h"

#define TM_MAX_LOGPROBS 20 /* upper bound of tm_sampling_params.n_logprobs */

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

/* llama.cpp's defaults: temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, repeat_penalty 1 (off),
 * repeat_last_n 64, presence/frequency 0, seed 0, n_logprobs 0. */
tm_sampling_params tm_sampling_default(void);
/* Validate ranges: temperature finite >= 0; top_k >= -1 (0 and -1 = off); top_p in (0,1]; min_p in [0,1];
 * repeat_penalty finite > 0; presence/frequency_penalty in [-2,2] (OpenAI's range); repeat_last_n >= -1;
 * n_logprobs in [0,20]. The message names the parameter, the allowed range and the value given. */
tm_status tm_sampling_validate(const tm_sampling_params *p, tm_error *err);

typedef struct tm_logprob {
    int32_t id;
    float logprob;           /* log-softmax of the raw (unprocessed) logits */
} tm_logprob;

typedef struct tm_sampler tm_sampler;

/* Validates p (see tm_sampling_validate) and n_vocab > 0, allocates every buffer the sampler will ever need
 * (a few arrays of n_vocab entries) and seeds the RNG with p->seed. */
tm_status tm_sampler_create(const tm_sampling_params *p, int32_t n_vocab, tm_sampler **out, tm_error *err);
void tm_sampler_free(tm_sampler *s);
/* Sample one token from logits (n_vocab floats; may be modified in place). `hist` are the ids
 * generated so far (for penalties; prompt ids are not included). When n_logprobs > 0, `chosen` gets
 * the sampled id's logprob and `top` (n_logprobs entries) the most likely ids, both from the raw logits.
 * Deterministic for a given seed and call sequence. No allocation after create.
 *
 * The pipeline, in order (the order of HF transformers' warpers and vLLM):
 *   1. NaN logits become -inf, +inf logits become FLT_MAX (so several +inf share the mass equally).
 *   2. logprobs (when n_logprobs > 0): log-softmax of these logits, max-subtracted, summed in double.
 *      `top` is ordered by decreasing logit, ties by lower id.
 *   3. repeat_penalty over the distinct ids among the last repeat_last_n entries of hist (once per id,
 *      however often it occurs), then logit -= count * frequency_penalty + (count > 0) * presence_penalty
 *      with count over the whole hist. Ids outside [0, n_vocab) in hist are ignored.
 *      On return `logits` holds the result of steps 1 and 3.
 *   4. temperature == 0: return the argmax (ties: lowest id); no random number is drawn.
 *   5. otherwise weights w = exp((logit - max) / T); top-k keeps the k largest (one pass with a k-heap for
 *      k <= 512, quickselect above); top-p keeps the smallest set of the best remaining tokens whose mass
 *      reaches top_p of their total (a quickselect that carries the mass of each side: O(n_vocab) expected,
 *      no sort); min-p keeps tokens with w >= min_p * w_max. Nothing is fully sorted: the kept set is
 *      unordered, and one uniform draw in [0,1) picks from it in proportion to w. Ranking is by logit,
 *      ties by lower id, so top-k = 1 is greedy at any temperature.
 * If every logit is -inf/NaN there is no distribution: the result is id 0 (the argmax of an all-equal
 * vector under the lowest-id rule), no random number is drawn, and the logprobs are those of the uniform
 * distribution (-log n_vocab). `chosen->id` is always set; `chosen->logprob` is 0 when n_logprobs == 0. */
int32_t tm_sampler_sample(tm_sampler *s, float *logits, const int32_t *hist, size_t n_hist, tm_logprob *chosen,
                          tm_logprob *top);
/* The distribution tm_sampler_sample draws from (steps 1, 3, 4, 5 above), written densely into probs
 * (n_vocab floats: 0 outside the kept set, the rest sums to 1; greedy and the all -inf fallback give a
 * one-hot vector). Draws no random number, so it does not disturb the sample sequence. For speculative
 * decoding and tests. */
void tm_sampler_probs(tm_sampler *s, float *logits, const int32_t *hist, size_t n_hist, float *probs);
/* The penalties of p over hist (as tm_sampler_sample takes it) in the backend's form: one entry per distinct id they
 * touch, in order of first occurrence, written to out (room for min(n_hist, n_vocab) entries); returns how many.
 * ahead (0 or 1): the history goes on with that many ids the backend adds itself (tm_sample_row.pen_src), so the
 * repeat window over hist is that much shorter. mark: (n_vocab) int32 scratch, all zero on entry and on return.
 * No entry when no penalty applies. */
size_t tm_sampler_pen_entries(const tm_sampling_params *p, int32_t n_vocab, const int32_t *hist, size_t n_hist,
                              size_t ahead, int32_t *mark, tm_sample_pen *out);
/* Apply entries to logits x as a backend does (tm_sample_row): the same float operations as step 3 of
 * tm_sampler_sample, so the result is bit-identical to it. */
void tm_sampler_pen_apply(const tm_sampling_params *p, float *x, const tm_sample_pen *e, size_t n);
/* The backend's merge of the id in flight (tm_sample_row.pen_src) into a row's entries e (n of them, room for one
 * more), by the row's penalties p (the repeat penalty applies where repeat_penalty != 1): once more in its count
 * when presence or frequency penalties apply, in the window when the repeat penalty does, a new entry when none
 * holds it. Returns the new number of entries. The host's reference for what a backend does. */
size_t tm_sampler_pen_merge(const tm_sampling_params *p, tm_sample_pen *e, size_t n, int32_t id);
/* Does any penalty of p change logits once hist holds at least one id? */
bool tm_sampling_has_penalties(const tm_sampling_params *p);
/* Re-seed the sampler's RNG (a new request reusing a sampler). */
void tm_sampler_reseed(tm_sampler *s, uint64_t seed);

/* The RNG (xoshiro256**, state seeded by four outputs of splitmix64), exposed for tests. */
typedef struct tm_rng { uint64_t s[4]; } tm_rng;
void tm_rng_seed(tm_rng *r, uint64_t seed);
uint64_t tm_rng_next(tm_rng *r);
float tm_rng_uniform(tm_rng *r);   /* [0, 1), 24 random bits */
double tm_rng_uniform_f64(tm_rng *r); /* [0, 1), 53 random bits; what the sampler draws */

#endif /* TM_SAMPLER_H */
