/* tm_bench_serve_util.c -- bench serve's pure helpers: SSE parsing, chunk reading, goodput SLOs, Poisson arrivals. */
#include "tm_bench_serve.h"

#include "engine/tm_sampler.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- SSE ------------------------------------------------------------------------------------------------ */

void tm_bs_sse_init(tm_bs_sse *p, size_t max_line) {
    memset(p, 0, sizeof *p);
    p->max_line = max_line ? max_line : (size_t)1 << 20;
}

void tm_bs_sse_free(tm_bs_sse *p) {
    free(p->line);
    free(p->data);
    memset(p, 0, sizeof *p);
}

/* Grow *buf (capacity *cap) to hold need bytes; false when need exceeds limit or memory runs out. */
static bool grow(char **buf, size_t *cap, size_t need, size_t limit) {
    if (need <= *cap) return true;
    if (need > limit) return false;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    if (c > limit) c = limit;
    char *nb = realloc(*buf, c);
    if (!nb) return false;
    *buf = nb;
    *cap = c;
    return true;
}

static int dispatch(tm_bs_sse *p, tm_bs_event_fn fn, void *ud) {
    if (!p->has_data) return 0;
    if (!grow(&p->data, &p->data_cap, p->data_len + 1, p->max_line + 1)) return -1;
    p->data[p->data_len] = '\0';
    size_t len = p->data_len;
    p->data_len = 0;
    p->has_data = false;
    return fn(ud, p->data, len);
}

/* One complete line without its terminator (a trailing '\r' is dropped here). */
static int process_line(tm_bs_sse *p, const char *s, size_t len, tm_bs_event_fn fn, void *ud) {
    if (len && s[len - 1] == '\r') len--;
    if (len == 0) return dispatch(p, fn, ud);
    if (s[0] == ':') return 0; /* comment (keep-alive) */
    const char *colon = memchr(s, ':', len);
    size_t flen = colon ? (size_t)(colon - s) : len;
    if (flen != 4 || memcmp(s, "data", 4) != 0) return 0; /* event:, id:, retry:, unknown fields */
    const char *v = colon ? colon + 1 : s + len;
    size_t vlen = (size_t)(s + len - v);
    if (vlen && *v == ' ') v++, vlen--;
    size_t need = p->data_len + (p->has_data ? 1 : 0) + vlen + 1;
    if (!grow(&p->data, &p->data_cap, need, p->max_line + 1)) return -1;
    if (p->has_data) p->data[p->data_len++] = '\n';
    memcpy(p->data + p->data_len, v, vlen);
    p->data_len += vlen;
    p->has_data = true;
    return 0;
}

int tm_bs_sse_feed(tm_bs_sse *p, const char *buf, size_t n, tm_bs_event_fn fn, void *ud) {
    while (n > 0) {
        const char *nl = memchr(buf, '\n', n);
        size_t seg = nl ? (size_t)(nl - buf) : n;
        if (!nl || p->line_len) {
            /* the line continues (or started) in the buffer: copy */
            if (!grow(&p->line, &p->line_cap, p->line_len + seg, p->max_line)) return -1;
            memcpy(p->line + p->line_len, buf, seg);
            p->line_len += seg;
            if (nl) {
                size_t ll = p->line_len;
                p->line_len = 0;
                int rc = process_line(p, p->line, ll, fn, ud);
                if (rc) return rc;
            }
        } else {
            if (seg > p->max_line) return -1;
            int rc = process_line(p, buf, seg, fn, ud);
            if (rc) return rc;
        }
        if (!nl) break;
        buf += seg + 1;
        n -= seg + 1;
    }
    return 0;
}

int tm_bs_sse_finish(tm_bs_sse *p, tm_bs_event_fn fn, void *ud) {
    if (p->line_len) {
        size_t ll = p->line_len;
        p->line_len = 0;
        int rc = process_line(p, p->line, ll, fn, ud);
        if (rc) return rc;
    }
    return dispatch(p, fn, ud);
}

/* ---- chunks --------------------------------------------------------------------------------------------- */

/* Copy up to cap-1 bytes of s (len bytes) into out, replacing control bytes and quotes by '?'. */
static void printable(char *out, size_t cap, const char *s, size_t len) {
    size_t n = len < cap - 1 ? len : cap - 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        out[i] = (c < 0x20 || c == 0x7f || c == '"' || c == '\\') ? '?' : (char)c;
    }
    out[n] = '\0';
}

static bool nonempty_string(const cJSON *j) {
    return cJSON_IsString(j) && j->valuestring && j->valuestring[0];
}

static int64_t usage_count(const cJSON *usage, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(usage, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > 1e15) return -1;
    return (int64_t)v->valuedouble;
}

void tm_bs_parse_chunk(const char *data, size_t len, tm_bs_chunk *out) {
    memset(out, 0, sizeof *out);
    out->prompt_tokens = out->completion_tokens = -1;
    while (len && (*data == ' ' || *data == '\t' || *data == '\r' || *data == '\n')) data++, len--;
    while (len && (data[len - 1] == ' ' || data[len - 1] == '\t' || data[len - 1] == '\r' || data[len - 1] == '\n')) len--;
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        out->kind = TM_BS_CHUNK_DONE;
        return;
    }
    cJSON *j = cJSON_ParseWithLength(data, len);
    if (!cJSON_IsObject(j)) {
        out->kind = TM_BS_CHUNK_BAD;
        printable(out->msg, sizeof out->msg, data, len < 80 ? len : 80);
        cJSON_Delete(j);
        return;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
    if (e && !cJSON_IsNull(e)) {
        out->kind = TM_BS_CHUNK_ERROR;
        const cJSON *m = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : e;
        if (cJSON_IsString(m) && m->valuestring) printable(out->msg, sizeof out->msg, m->valuestring, strlen(m->valuestring));
        else snprintf(out->msg, sizeof out->msg, "error object without a message");
        cJSON_Delete(j);
        return;
    }
    out->kind = TM_BS_CHUNK_DATA;
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(j, "choices");
    const cJSON *c;
    if (!cJSON_IsArray(choices)) choices = NULL;
    cJSON_ArrayForEach(c, choices) {
        if (nonempty_string(cJSON_GetObjectItemCaseSensitive(c, "text"))) out->has_content = true;
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(c, "delta");
        if (cJSON_IsObject(d) && (nonempty_string(cJSON_GetObjectItemCaseSensitive(d, "content")) ||
                                  nonempty_string(cJSON_GetObjectItemCaseSensitive(d, "reasoning_content")) ||
                                  nonempty_string(cJSON_GetObjectItemCaseSensitive(d, "reasoning"))))
            out->has_content = true;
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "usage");
    if (cJSON_IsObject(u)) {
        out->prompt_tokens = usage_count(u, "prompt_tokens");
        out->completion_tokens = usage_count(u, "completion_tokens");
    }
    cJSON_Delete(j);
}

/* ---- goodput -------------------------------------------------------------------------------------------- */

bool tm_bs_parse_goodput(const char *spec, tm_bs_slo *out, char *err, size_t err_cap) {
    memset(out, 0, sizeof *out);
    if (!spec || !*spec) {
        snprintf(err, err_cap, "empty goodput spec (want ttft:MS,tpot:MS,e2e:MS)");
        return false;
    }
    const char *s = spec;
    while (*s) {
        const char *end = strchr(s, ',');
        size_t n = end ? (size_t)(end - s) : strlen(s);
        char item[64];
        if (n == 0 || n >= sizeof item) {
            snprintf(err, err_cap, "bad goodput item in '%s' (want ttft:MS,tpot:MS,e2e:MS)", spec);
            return false;
        }
        memcpy(item, s, n);
        item[n] = '\0';
        char *colon = strchr(item, ':');
        if (!colon) {
            snprintf(err, err_cap, "goodput item '%s' has no ':' (want NAME:MS)", item);
            return false;
        }
        *colon = '\0';
        const char *val = colon + 1;
        double *slot = !strcmp(item, "ttft") ? &out->ttft_ms
                       : !strcmp(item, "tpot") ? &out->tpot_ms
                       : (!strcmp(item, "e2e") || !strcmp(item, "e2el")) ? &out->e2e_ms
                       : NULL;
        if (!slot) {
            snprintf(err, err_cap, "unknown goodput metric '%s' (ttft, tpot or e2e)", item);
            return false;
        }
        if (*slot > 0) {
            snprintf(err, err_cap, "goodput metric '%s' given twice", item);
            return false;
        }
        errno = 0;
        char *vend;
        double v = *val ? strtod(val, &vend) : NAN;
        if (!*val || errno || *vend || !isfinite(v) || v <= 0) {
            snprintf(err, err_cap, "bad goodput value '%s' for %s (milliseconds > 0)", val, item);
            return false;
        }
        *slot = v;
        if (!end) break;
        s = end + 1;
        if (!*s) {
            snprintf(err, err_cap, "trailing ',' in goodput spec '%s'", spec);
            return false;
        }
    }
    return true;
}

bool tm_bs_meets_slo(const tm_bs_slo *slo, double ttft_ms, double tpot_ms, double e2e_ms) {
    if (slo->ttft_ms > 0 && !(ttft_ms <= slo->ttft_ms)) return false;
    if (slo->tpot_ms > 0 && tpot_ms >= 0 && !(tpot_ms <= slo->tpot_ms)) return false;
    if (slo->e2e_ms > 0 && !(e2e_ms <= slo->e2e_ms)) return false;
    return true;
}

/* ---- arrivals ------------------------------------------------------------------------------------------- */

void tm_bs_arrivals(double rate, size_t n, uint64_t seed, double *t) {
    if (n == 0) return;
    if (!(rate > 0) || isinf(rate)) {
        for (size_t i = 0; i < n; i++) t[i] = 0.0;
        return;
    }
    tm_rng rng;
    tm_rng_seed(&rng, seed);
    t[0] = 0.0;
    for (size_t i = 1; i < n; i++) {
        double u = tm_rng_uniform_f64(&rng);     /* [0, 1) */
        t[i] = t[i - 1] - log1p(-u) / rate;      /* -ln(1 - u) / rate: exponential, mean 1/rate */
    }
}
