/* tm_metrics.c -- lock-free counters, gauges, histograms, per-request timing, Prometheus text, percentiles. */
#include "metrics/tm_metrics.h"

#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- metric objects ------------------------------------------------------------------------ */

struct tm_counter {
    _Atomic uint64_t v;
};

struct tm_gauge {
    _Atomic uint64_t bits; /* bit pattern of a double */
};

struct tm_histogram {
    size_t n_bounds;
    double bounds[TM_HIST_MAX_BOUNDS];              /* (n_bounds) strictly increasing, finite */
    _Atomic uint64_t counts[TM_HIST_MAX_BOUNDS + 1]; /* (n_bounds + 1) per bucket; last = +Inf */
    _Atomic uint64_t sum_bits;                       /* bit pattern of the double sum */
};

static inline uint64_t d2u(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}
static inline double u2d(uint64_t u) {
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static void atomic_add_double(_Atomic uint64_t *bits, double delta) {
    uint64_t old = atomic_load_explicit(bits, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(bits, &old, d2u(u2d(old) + delta), memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
}

void tm_counter_add(tm_counter *c, uint64_t n) { atomic_fetch_add_explicit(&c->v, n, memory_order_relaxed); }
uint64_t tm_counter_get(const tm_counter *c) {
    return atomic_load_explicit((_Atomic uint64_t *)&c->v, memory_order_relaxed);
}

void tm_gauge_set(tm_gauge *g, double v) { atomic_store_explicit(&g->bits, d2u(v), memory_order_relaxed); }
void tm_gauge_add(tm_gauge *g, double delta) { atomic_add_double(&g->bits, delta); }
double tm_gauge_get(const tm_gauge *g) {
    return u2d(atomic_load_explicit((_Atomic uint64_t *)&g->bits, memory_order_relaxed));
}

void tm_histogram_observe(tm_histogram *h, double v) {
    if (!isfinite(v)) return;
    /* first i with v <= bounds[i]; n_bounds when v is above every bound */
    size_t lo = 0, hi = h->n_bounds;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v <= h->bounds[mid]) hi = mid;
        else lo = mid + 1;
    }
    atomic_fetch_add_explicit(&h->counts[lo], 1, memory_order_relaxed);
    atomic_add_double(&h->sum_bits, v);
}

void tm_histogram_snapshot(const tm_histogram *h, tm_hist_snapshot *s) {
    tm_histogram *hm = (tm_histogram *)h; /* atomic loads want a non-const object */
    s->n_bounds = h->n_bounds;
    memcpy(s->bounds, h->bounds, h->n_bounds * sizeof(double));
    s->count = 0;
    for (size_t i = 0; i <= h->n_bounds; i++) {
        s->counts[i] = atomic_load_explicit(&hm->counts[i], memory_order_relaxed);
        s->count += s->counts[i];
    }
    s->sum = u2d(atomic_load_explicit(&hm->sum_bits, memory_order_relaxed));
}

/* ---- registry --------------------------------------------------------------------------------- */

typedef enum { TM_MT_COUNTER, TM_MT_GAUGE, TM_MT_HISTOGRAM } tm_metric_type;

typedef struct tm_metric_series {
    char *label_value; /* NULL when the family is unlabeled */
    void *metric;      /* tm_counter / tm_gauge / tm_histogram, by the family's type */
} tm_metric_series;

typedef struct tm_metric_family {
    char *name;
    char *help;
    char *label_name; /* NULL: unlabeled */
    tm_metric_type type;
    tm_metric_series *series; /* (n_series), capacity cap_series */
    size_t n_series, cap_series;
} tm_metric_family;

struct tm_metrics {
    tm_metric_family *fam; /* (n_fam), capacity cap_fam, in registration order */
    size_t n_fam, cap_fam;
    locale_t c_numeric;    /* "C" LC_NUMERIC, used by the renderer through uselocale() */
    bool has_std;
    tm_metrics_std std;
};

const char *tm_finish_reason_name(tm_finish_reason r) {
    switch (r) {
    case TM_FINISH_STOP: return "stop";
    case TM_FINISH_LENGTH: return "length";
    case TM_FINISH_ABORT: return "abort";
    case TM_FINISH_COUNT: break;
    }
    return "unknown";
}

static bool valid_metric_name(const char *s) {
    if (!s || !*s) return false;
    for (size_t i = 0; s[i]; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                  (i > 0 && c >= '0' && c <= '9');
        if (!ok) return false;
    }
    return true;
}

static bool valid_label_name(const char *s) {
    if (!s || !*s) return false;
    if (s[0] == '_' && s[1] == '_') return false; /* reserved */
    for (size_t i = 0; s[i]; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (i > 0 && c >= '0' && c <= '9');
        if (!ok) return false;
    }
    return true;
}

static bool str_eq_opt(const char *a, const char *b) {
    if (!a || !b) return a == b;
    return strcmp(a, b) == 0;
}

static void family_free(tm_metric_family *f) {
    for (size_t i = 0; i < f->n_series; i++) {
        free(f->series[i].label_value);
        free(f->series[i].metric);
    }
    free(f->series);
    free(f->name);
    free(f->help);
    free(f->label_name);
}

void tm_metrics_free(tm_metrics *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n_fam; i++) family_free(&m->fam[i]);
    free(m->fam);
    if (m->c_numeric != (locale_t)0) freelocale(m->c_numeric);
    free(m);
}

tm_status tm_metrics_create_empty(tm_metrics **out, tm_error *err) {
    if (!out) return tm_err(err, TM_ERR_INVALID, "metrics: NULL output pointer");
    *out = NULL;
    tm_metrics *m = tm_calloc(1, sizeof *m);
    if (!m) return tm_err(err, TM_ERR_NOMEM, "metrics: out of memory");
    m->c_numeric = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (m->c_numeric == (locale_t)0) {
        free(m);
        return tm_err(err, TM_ERR_NOMEM, "metrics: cannot create the C numeric locale");
    }
    *out = m;
    return TM_OK;
}

/* Validate d and find or create its family and a new series in it; the series' metric is allocated
 * here (zeroed) with `size` bytes. */
static tm_status add_series(tm_metrics *m, tm_metric_type type, const tm_metric_desc *d, size_t size, void **out,
                            tm_error *err) {
    if (!m || !d || !out) return tm_err(err, TM_ERR_INVALID, "metrics: NULL argument");
    *out = NULL;
    if (!valid_metric_name(d->name))
        return tm_err(err, TM_ERR_INVALID, "metrics: invalid metric name '%s'", d->name ? d->name : "(null)");
    const char *help = d->help ? d->help : "";
    if (d->label_name) {
        if (!valid_label_name(d->label_name) || (type == TM_MT_HISTOGRAM && strcmp(d->label_name, "le") == 0))
            return tm_err(err, TM_ERR_INVALID, "metrics: %s: invalid label name '%s'", d->name, d->label_name);
        if (!d->label_value) return tm_err(err, TM_ERR_INVALID, "metrics: %s: label value missing", d->name);
    } else if (d->label_value) {
        return tm_err(err, TM_ERR_INVALID, "metrics: %s: label value without a label name", d->name);
    }

    tm_metric_family *f = NULL;
    bool new_family = false;
    for (size_t i = 0; i < m->n_fam; i++)
        if (strcmp(m->fam[i].name, d->name) == 0) f = &m->fam[i];
    if (f) {
        if (f->type != type || strcmp(f->help, help) != 0 || !str_eq_opt(f->label_name, d->label_name))
            return tm_err(err, TM_ERR_INVALID, "metrics: %s: registered again with another type, help or label",
                          d->name);
        if (!f->label_name) return tm_err(err, TM_ERR_INVALID, "metrics: %s: registered twice", d->name);
        for (size_t i = 0; i < f->n_series; i++)
            if (strcmp(f->series[i].label_value, d->label_value) == 0)
                return tm_err(err, TM_ERR_INVALID, "metrics: %s{%s=\"%s\"}: registered twice", d->name,
                              d->label_name, d->label_value);
    } else {
        if (m->n_fam == m->cap_fam) {
            size_t cap = m->cap_fam ? 2 * m->cap_fam : 16;
            tm_metric_family *nf = realloc(m->fam, cap * sizeof *nf);
            if (!nf) return tm_err(err, TM_ERR_NOMEM, "metrics: out of memory");
            m->fam = nf;
            m->cap_fam = cap;
        }
        tm_metric_family nf = {0};
        nf.type = type;
        nf.name = tm_strndup(d->name, strlen(d->name));
        nf.help = tm_strndup(help, strlen(help));
        nf.label_name = d->label_name ? tm_strndup(d->label_name, strlen(d->label_name)) : NULL;
        if (!nf.name || !nf.help || (d->label_name && !nf.label_name)) {
            family_free(&nf);
            return tm_err(err, TM_ERR_NOMEM, "metrics: out of memory");
        }
        m->fam[m->n_fam++] = nf;
        f = &m->fam[m->n_fam - 1];
        new_family = true;
    }

    tm_metric_series s = {0};
    if (f->n_series == f->cap_series) {
        size_t cap = f->cap_series ? 2 * f->cap_series : 4;
        tm_metric_series *ns = realloc(f->series, cap * sizeof *ns);
        if (!ns) goto nomem;
        f->series = ns;
        f->cap_series = cap;
    }
    s.metric = tm_calloc(1, size);
    s.label_value = d->label_value ? tm_strndup(d->label_value, strlen(d->label_value)) : NULL;
    if (!s.metric || (d->label_value && !s.label_value)) goto nomem;
    f->series[f->n_series++] = s;
    *out = s.metric;
    return TM_OK;
nomem:
    free(s.metric);
    free(s.label_value);
    if (new_family) family_free(&m->fam[--m->n_fam]); /* leave no empty family behind */
    return tm_err(err, TM_ERR_NOMEM, "metrics: out of memory");
}

tm_status tm_metrics_add_counter(tm_metrics *m, const tm_metric_desc *d, tm_counter **out, tm_error *err) {
    void *p = NULL;
    tm_status st = add_series(m, TM_MT_COUNTER, d, sizeof(tm_counter), &p, err);
    if (out) *out = p;
    return st;
}

tm_status tm_metrics_add_gauge(tm_metrics *m, const tm_metric_desc *d, tm_gauge **out, tm_error *err) {
    void *p = NULL;
    tm_status st = add_series(m, TM_MT_GAUGE, d, sizeof(tm_gauge), &p, err);
    if (out) *out = p;
    return st;
}

tm_status tm_metrics_add_histogram(tm_metrics *m, const tm_metric_desc *d, const double *bounds, size_t n_bounds,
                                   tm_histogram **out, tm_error *err) {
    if (out) *out = NULL;
    const char *name = d && d->name ? d->name : "(null)";
    if (!bounds || n_bounds == 0 || n_bounds > TM_HIST_MAX_BOUNDS)
        return tm_err(err, TM_ERR_INVALID, "metrics: %s: need 1..%d bucket bounds, got %zu", name,
                      TM_HIST_MAX_BOUNDS, n_bounds);
    for (size_t i = 0; i < n_bounds; i++) {
        if (!isfinite(bounds[i]))
            return tm_err(err, TM_ERR_INVALID, "metrics: %s: bucket bound %zu is not finite (+Inf is implicit)",
                          name, i);
        if (i > 0 && !(bounds[i] > bounds[i - 1]))
            return tm_err(err, TM_ERR_INVALID, "metrics: %s: bucket bounds not strictly increasing at %zu", name, i);
    }
    void *p = NULL;
    tm_status st = add_series(m, TM_MT_HISTOGRAM, d, sizeof(tm_histogram), &p, err);
    if (st != TM_OK) return st;
    tm_histogram *h = p;
    h->n_bounds = n_bounds;
    memcpy(h->bounds, bounds, n_bounds * sizeof(double));
    atomic_store_explicit(&h->sum_bits, d2u(0.0), memory_order_relaxed);
    if (out) *out = h;
    return TM_OK;
}

/* ---- the standard set ---------------------------------------------------------------------------- */

const double tm_metrics_ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                         1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const size_t tm_metrics_ttft_bounds_n = sizeof tm_metrics_ttft_bounds / sizeof tm_metrics_ttft_bounds[0];
const double tm_metrics_tpot_bounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                         0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const size_t tm_metrics_tpot_bounds_n = sizeof tm_metrics_tpot_bounds / sizeof tm_metrics_tpot_bounds[0];
const double tm_metrics_latency_bounds[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                            30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const size_t tm_metrics_latency_bounds_n = sizeof tm_metrics_latency_bounds / sizeof tm_metrics_latency_bounds[0];

size_t tm_metrics_buckets_1_2_5(uint64_t max_value, double *out, size_t cap) {
    static const uint64_t mant[3] = {1, 2, 5};
    size_t n = 0;
    uint64_t pow10 = 1;
    for (;;) {
        for (int i = 0; i < 3; i++) {
            uint64_t v;
            if (!tm_mul_u64(mant[i], pow10, &v) || v > max_value || n == cap) return n;
            out[n++] = (double)v;
        }
        if (!tm_mul_u64(pow10, 10, &pow10)) return n;
    }
}

tm_status tm_metrics_create(uint64_t max_model_len, tm_metrics **out, tm_error *err) {
    if (!out) return tm_err(err, TM_ERR_INVALID, "metrics: NULL output pointer");
    *out = NULL;
    if (max_model_len == 0) return tm_err(err, TM_ERR_INVALID, "metrics: max_model_len must be >= 1");
    double tok_bounds[TM_HIST_MAX_BOUNDS];
    size_t n_tok = tm_metrics_buckets_1_2_5(max_model_len, tok_bounds, TM_HIST_MAX_BOUNDS);

    tm_metrics *m = NULL;
    tm_status st = tm_metrics_create_empty(&m, err);
    if (st != TM_OK) return st;
    tm_metrics_std *s = &m->std;
#define TM_H(field, nm, hp, b, nb)                                                                                 \
    if ((st = tm_metrics_add_histogram(m, &(tm_metric_desc){.name = nm, .help = hp}, b, nb, &s->field, err)))     \
        goto fail;
#define TM_G(field, nm, hp)                                                                                        \
    if ((st = tm_metrics_add_gauge(m, &(tm_metric_desc){.name = nm, .help = hp}, &s->field, err))) goto fail;
#define TM_C(field, nm, hp)                                                                                        \
    if ((st = tm_metrics_add_counter(m, &(tm_metric_desc){.name = nm, .help = hp}, &s->field, err))) goto fail;

    TM_H(ttft, "tokenmill:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
         tm_metrics_ttft_bounds, tm_metrics_ttft_bounds_n)
    TM_H(tpot, "tokenmill:time_per_output_token_seconds",
         "Histogram of time per output token in seconds (per request: decode time / (generated tokens - 1)).",
         tm_metrics_tpot_bounds, tm_metrics_tpot_bounds_n)
    TM_H(itl, "tokenmill:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
         tm_metrics_tpot_bounds, tm_metrics_tpot_bounds_n)
    TM_H(e2e, "tokenmill:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
         tm_metrics_latency_bounds, tm_metrics_latency_bounds_n)
    TM_H(queue, "tokenmill:request_queue_time_seconds", "Histogram of time spent waiting in the queue in seconds.",
         tm_metrics_latency_bounds, tm_metrics_latency_bounds_n)
    TM_H(prompt_tokens, "tokenmill:request_prompt_tokens", "Number of prompt tokens per finished request.",
         tok_bounds, n_tok)
    TM_H(gen_tokens, "tokenmill:request_generation_tokens", "Number of generated tokens per finished request.",
         tok_bounds, n_tok)
    TM_G(running, "tokenmill:num_requests_running", "Number of requests in model execution batches.")
    TM_G(waiting, "tokenmill:num_requests_waiting", "Number of requests waiting to be processed.")
    TM_G(kv_usage, "tokenmill:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
    TM_C(prefix_queries, "tokenmill:prefix_cache_queries_total",
         "Prefix cache queries, in terms of number of queried tokens.")
    TM_C(prefix_hits, "tokenmill:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.")
    TM_C(preemptions, "tokenmill:num_preemptions_total", "Cumulative number of preemptions by the scheduler.")
    TM_C(prompt_tokens_total, "tokenmill:prompt_tokens_total", "Number of prefill tokens processed.")
    TM_C(gen_tokens_total, "tokenmill:generation_tokens_total", "Number of generation tokens processed.")
#undef TM_H
#undef TM_G
#undef TM_C
    for (int r = 0; r < TM_FINISH_COUNT; r++) {
        tm_metric_desc d = {.name = "tokenmill:request_success_total",
                            .help = "Count of finished requests, by finish reason.",
                            .label_name = "finished_reason",
                            .label_value = tm_finish_reason_name((tm_finish_reason)r)};
        if ((st = tm_metrics_add_counter(m, &d, &s->success[r], err))) goto fail;
    }
    m->has_std = true;
    *out = m;
    return TM_OK;
fail:
    tm_metrics_free(m);
    return st;
}

tm_metrics_std *tm_metrics_get_std(tm_metrics *m) { return m && m->has_std ? &m->std : NULL; }

void tm_metrics_set_sched(tm_metrics *m, uint64_t n_running, uint64_t n_waiting, double kv_usage) {
    tm_metrics_std *s = tm_metrics_get_std(m);
    if (!s) return;
    tm_gauge_set(s->running, (double)n_running);
    tm_gauge_set(s->waiting, (double)n_waiting);
    tm_gauge_set(s->kv_usage, kv_usage);
}

/* ---- Prometheus text ------------------------------------------------------------------------------ */

/* Appends what fits into buf[0..cap-1) and counts everything, like snprintf. */
typedef struct tm_wbuf {
    char *buf; /* (cap) */
    size_t cap;
    size_t len; /* bytes the full text needs so far */
} tm_wbuf;

static void w_bytes(tm_wbuf *w, const char *s, size_t n) {
    if (w->cap > 0 && w->len < w->cap - 1) {
        size_t room = w->cap - 1 - w->len;
        memcpy(w->buf + w->len, s, n < room ? n : room);
    }
    w->len += n;
}
static void w_str(tm_wbuf *w, const char *s) { w_bytes(w, s, strlen(s)); }

/* escape: for help text \ and newline; for label values also " */
static void w_escaped(tm_wbuf *w, const char *s, bool quote) {
    const char *run = s;
    for (; *s; s++) {
        const char *rep = NULL;
        if (*s == '\\') rep = "\\\\";
        else if (*s == '\n') rep = "\\n";
        else if (quote && *s == '"') rep = "\\\"";
        if (rep) {
            w_bytes(w, run, (size_t)(s - run));
            w_str(w, rep);
            run = s + 1;
        }
    }
    w_bytes(w, run, (size_t)(s - run));
}

static void w_u64(tm_wbuf *w, uint64_t v) {
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%" PRIu64, v);
    w_bytes(w, tmp, (size_t)n);
}

/* Shortest of %.15g..%.17g that reads back exactly; the caller has made LC_NUMERIC "C". */
static void fmt_double(char *tmp, size_t cap, double v) {
    if (isnan(v)) {
        snprintf(tmp, cap, "NaN");
    } else if (isinf(v)) {
        snprintf(tmp, cap, v > 0 ? "+Inf" : "-Inf");
    } else {
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(tmp, cap, "%.*g", prec, v);
            if (strtod(tmp, NULL) == v) break;
        }
    }
}
static void w_double(tm_wbuf *w, double v) {
    char tmp[40];
    fmt_double(tmp, sizeof tmp, v);
    w_str(w, tmp);
}

/* name[suffix]{label="value",le="bound"} */
static void w_series_name(tm_wbuf *w, const tm_metric_family *f, const tm_metric_series *s, const char *suffix,
                          const char *le) {
    w_str(w, f->name);
    w_str(w, suffix);
    bool lab = f->label_name != NULL;
    if (!lab && !le) return;
    w_str(w, "{");
    if (lab) {
        w_str(w, f->label_name);
        w_str(w, "=\"");
        w_escaped(w, s->label_value, true);
        w_str(w, "\"");
    }
    if (le) {
        if (lab) w_str(w, ",");
        w_str(w, "le=\"");
        w_str(w, le);
        w_str(w, "\"");
    }
    w_str(w, "}");
}

static void render_family(tm_wbuf *w, const tm_metric_family *f) {
    static const char *const type_names[] = {"counter", "gauge", "histogram"};
    w_str(w, "# HELP ");
    w_str(w, f->name);
    w_str(w, " ");
    w_escaped(w, f->help, false);
    w_str(w, "\n# TYPE ");
    w_str(w, f->name);
    w_str(w, " ");
    w_str(w, type_names[f->type]);
    w_str(w, "\n");
    for (size_t i = 0; i < f->n_series; i++) {
        const tm_metric_series *s = &f->series[i];
        if (f->type == TM_MT_COUNTER) {
            w_series_name(w, f, s, "", NULL);
            w_str(w, " ");
            w_u64(w, tm_counter_get(s->metric));
            w_str(w, "\n");
        } else if (f->type == TM_MT_GAUGE) {
            w_series_name(w, f, s, "", NULL);
            w_str(w, " ");
            w_double(w, tm_gauge_get(s->metric));
            w_str(w, "\n");
        } else {
            tm_hist_snapshot snap;
            tm_histogram_snapshot(s->metric, &snap);
            uint64_t cum = 0;
            char le[40];
            for (size_t b = 0; b <= snap.n_bounds; b++) {
                cum += snap.counts[b];
                if (b < snap.n_bounds) fmt_double(le, sizeof le, snap.bounds[b]);
                else snprintf(le, sizeof le, "+Inf");
                w_series_name(w, f, s, "_bucket", le);
                w_str(w, " ");
                w_u64(w, cum);
                w_str(w, "\n");
            }
            w_series_name(w, f, s, "_sum", NULL);
            w_str(w, " ");
            w_double(w, snap.sum);
            w_str(w, "\n");
            w_series_name(w, f, s, "_count", NULL);
            w_str(w, " ");
            w_u64(w, snap.count);
            w_str(w, "\n");
        }
    }
}

tm_status tm_metrics_render(const tm_metrics *m, char *buf, size_t cap, size_t *len, tm_error *err) {
    if (len) *len = 0;
    if (!m || (!buf && cap > 0)) return tm_err(err, TM_ERR_INVALID, "metrics: NULL argument");
    tm_wbuf w = {buf, cap, 0};
    locale_t prev = uselocale(m->c_numeric);
    for (size_t i = 0; i < m->n_fam; i++) render_family(&w, &m->fam[i]);
    uselocale(prev);
    if (len) *len = w.len;
    if (cap > 0) buf[w.len < cap ? w.len : cap - 1] = '\0';
    if (w.len >= cap)
        return tm_err(err, TM_ERR_RANGE, "metrics: output needs %zu bytes, buffer has %zu", w.len + 1, cap);
    return TM_OK;
}

tm_status tm_metrics_render_alloc(const tm_metrics *m, char **out, size_t *len, tm_error *err) {
    if (len) *len = 0;
    if (!out) return tm_err(err, TM_ERR_INVALID, "metrics: NULL output pointer");
    *out = NULL;
    size_t cap = 16384, need = 0;
    for (int attempt = 0; attempt < 8; attempt++) {
        char *buf = tm_malloc(cap);
        if (!buf) return tm_err(err, TM_ERR_NOMEM, "metrics: out of memory (%zu bytes)", cap);
        tm_status st = tm_metrics_render(m, buf, cap, &need, NULL);
        if (st == TM_OK) {
            *out = buf;
            if (len) *len = need;
            return TM_OK;
        }
        free(buf);
        if (st != TM_ERR_RANGE) return tm_err(err, st, "metrics: render failed");
        cap = need + 1 + need / 8 + 256; /* slack: values may grow between two passes */
    }
    return tm_err(err, TM_ERR_INTERNAL, "metrics: output kept growing while rendering");
}

/* ---- summaries ------------------------------------------------------------------------------------ */

double tm_hist_snapshot_percentile(const tm_hist_snapshot *s, double p) {
    if (!s || s->count == 0 || !(p >= 0.0 && p <= 100.0) || s->n_bounds == 0) return NAN;
    double rank = p / 100.0 * (double)s->count;
    uint64_t cum = 0;
    for (size_t b = 0; b <= s->n_bounds; b++) {
        uint64_t prev = cum;
        cum += s->counts[b];
        if (s->counts[b] == 0 || (double)cum < rank) continue;
        if (b == s->n_bounds) return s->bounds[s->n_bounds - 1]; /* +Inf bucket: the largest finite bound */
        double upper = s->bounds[b];
        double lower;
        if (b == 0) {
            if (upper <= 0.0) return upper;
            lower = 0.0;
        } else {
            lower = s->bounds[b - 1];
        }
        return lower + (upper - lower) * ((rank - (double)prev) / (double)s->counts[b]);
    }
    return s->bounds[s->n_bounds - 1]; /* not reached: the last non-empty bucket has cum == count >= rank */
}

tm_summary tm_histogram_summary(const tm_histogram *h) {
    tm_summary r = {0, NAN, NAN, NAN, NAN};
    if (!h) return r;
    tm_hist_snapshot s;
    tm_histogram_snapshot(h, &s);
    r.count = s.count;
    if (s.count == 0) return r;
    r.mean = s.sum / (double)s.count;
    r.p50 = tm_hist_snapshot_percentile(&s, 50.0);
    r.p90 = tm_hist_snapshot_percentile(&s, 90.0);
    r.p99 = tm_hist_snapshot_percentile(&s, 99.0);
    return r;
}

static int cmp_double_nan_last(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    bool nx = isnan(x), ny = isnan(y);
    if (nx || ny) return (int)nx - (int)ny;
    return (x > y) - (x < y);
}

/* v sorted ascending, NaNs at the end */
static double sorted_percentile(const double *v, size_t n, double p) {
    if (n == 0 || !(p >= 0.0 && p <= 100.0)) return NAN;
    double pos = p / 100.0 * (double)(n - 1);
    size_t lo = (size_t)floor(pos);
    if (lo >= n - 1) return v[n - 1];
    double frac = pos - (double)lo;
    if (frac == 0.0) return v[lo]; /* exact rank: do not touch the neighbour (it may be NaN) */
    return v[lo] + (v[lo + 1] - v[lo]) * frac;
}

double tm_stats_percentile(double *v, size_t n, double p) {
    if (!v || n == 0 || !(p >= 0.0 && p <= 100.0)) return NAN;
    qsort(v, n, sizeof *v, cmp_double_nan_last);
    return sorted_percentile(v, n, p);
}

tm_summary tm_stats_summary(double *v, size_t n) {
    tm_summary r = {n, NAN, NAN, NAN, NAN};
    if (!v || n == 0) {
        r.count = 0;
        return r;
    }
    qsort(v, n, sizeof *v, cmp_double_nan_last);
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += v[i];
    r.mean = sum / (double)n;
    r.p50 = sorted_percentile(v, n, 50.0);
    r.p90 = sorted_percentile(v, n, 90.0);
    r.p99 = sorted_percentile(v, n, 99.0);
    return r;
}

/* ---- per-request timing ----------------------------------------------------------------------------- */

static inline double nonneg(double d) { return d > 0.0 ? d : 0.0; }

void tm_req_on_arrival(tm_req_timing *t, double now, uint64_t n_prompt) {
    memset(t, 0, sizeof *t);
    t->arrival = now;
    t->n_prompt = n_prompt;
    t->arrived = true;
}

void tm_req_on_scheduled(tm_req_timing *t, double now) {
    if (!t->arrived || t->finished) return;
    if (t->n_scheduled == 0) t->first_scheduled = now;
    t->last_scheduled = now;
    if (t->n_scheduled < UINT32_MAX) t->n_scheduled++;
}

void tm_req_on_tokens(tm_req_timing *t, tm_metrics *m, double now, uint64_t n) {
    if (!t->arrived || t->finished || n == 0) return;
    tm_metrics_std *s = tm_metrics_get_std(m);
    if (t->n_generated == 0) {
        t->first_token = now;
        if (s) {
            tm_histogram_observe(s->ttft, nonneg(now - t->arrival));
            tm_counter_add(s->prompt_tokens_total, t->n_prompt);
        }
    } else {
        double gap = nonneg(now - t->last_token);
        t->itl_sum += gap;
        if (gap > t->itl_max) t->itl_max = gap;
        t->n_itl++;
        if (s) tm_histogram_observe(s->itl, gap);
    }
    t->last_token = now;
    t->n_generated += n;
    if (s) tm_counter_add(s->gen_tokens_total, n);
}

tm_req_stats tm_req_timing_stats(const tm_req_timing *t) {
    tm_req_stats r = {NAN, NAN, NAN, NAN, NAN};
    if (!t->arrived) return r;
    if (t->n_generated > 0) r.ttft = nonneg(t->first_token - t->arrival);
    if (t->n_generated > 1) r.tpot = nonneg(t->last_token - t->first_token) / (double)(t->n_generated - 1);
    if (t->n_itl > 0) r.itl_mean = t->itl_sum / (double)t->n_itl;
    if (t->finished) r.e2e = nonneg(t->finish - t->arrival);
    if (t->n_scheduled > 0) r.queue = nonneg(t->first_scheduled - t->arrival);
    else if (t->finished) r.queue = r.e2e;
    return r;
}

bool tm_req_on_finish(tm_req_timing *t, tm_metrics *m, double now, tm_finish_reason reason) {
    if (!t->arrived || t->finished) return false;
    if ((unsigned)reason >= TM_FINISH_COUNT) reason = TM_FINISH_ABORT;
    t->finish = now;
    t->finished = true;
    t->reason = reason;
    tm_metrics_std *s = tm_metrics_get_std(m);
    if (!s) return true;
    tm_req_stats r = tm_req_timing_stats(t);
    tm_histogram_observe(s->e2e, r.e2e);
    tm_histogram_observe(s->queue, r.queue);
    if (t->n_generated > 1) tm_histogram_observe(s->tpot, r.tpot);
    tm_histogram_observe(s->prompt_tokens, (double)t->n_prompt);
    tm_histogram_observe(s->gen_tokens, (double)t->n_generated);
    tm_counter_inc(s->success[reason]);
    return true;
}
