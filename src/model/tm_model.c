/* tm_model.c -- model loading: hyper-parameters from GGUF keys, weight binding and checks, dummy models. */
#include "tm_model.h"

#include "backend/cpu/tm_quant.h"
#include "core/tm_fp8.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* ---- dummy shapes ------------------------------------------------------------------------------ */

typedef struct dummy_shape {
    const char *name;
    int32_t n_vocab, dim, n_layers, n_heads, n_kv_heads, ffn_dim, n_ctx;
    float rope_theta;
    bool tied;
    float l3_factor; /* Llama-3.1 style rope scaling factor (0 = none); low 1, high 4, original 8192 */
} dummy_shape;

static const dummy_shape k_dummy[] = {
    {"smollm2-135m", 49152, 576, 30, 9, 3, 1536, 8192, 100000.0f, true, 0.0f},
    {"llama3.2-1b", 128256, 2048, 16, 32, 8, 8192, 131072, 500000.0f, true, 32.0f},
    {"llama3-8b", 128256, 4096, 32, 32, 8, 14336, 8192, 500000.0f, false, 0.0f},
    {"llama2-7b", 32000, 4096, 32, 32, 32, 11008, 4096, 10000.0f, false, 0.0f},
    /* not a real model: small enough that a step costs the engine's and the server's host work, not the forward */
    {"tiny", 512, 64, 2, 4, 2, 128, 8192, 10000.0f, true, 0.0f},
};

/* ---- helpers ----------------------------------------------------------------------------------- */

static tm_status compute_rope(tm_model *m, const float *freq_factors, tm_error *err) {
    int32_t half = m->hp.rope_dim / 2;
    m->rope_inv_freq = tm_malloc_array((size_t)half, sizeof(float));
    if (!m->rope_inv_freq) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < half; i++) {
        double f = 1.0 / pow((double)m->hp.rope_theta, (double)(2 * i) / (double)m->hp.rope_dim);
        if (freq_factors) f /= (double)freq_factors[i];
        f /= (double)m->hp.rope_scale_linear;
        m->rope_inv_freq[i] = (float)f;
    }
    return TM_OK;
}

/* Llama 3.1 frequency factors (as the GGUF converter computes them into rope_freqs.weight). */
static void llama3_freq_factors(float *ff, int32_t half, int32_t rope_dim, float theta, float factor) {
    const double low = 1.0, high = 4.0, orig = 8192.0;
    double low_wavelen = orig / low, high_wavelen = orig / high;
    for (int32_t i = 0; i < half; i++) {
        double freq = 1.0 / pow((double)theta, (double)(2 * i) / (double)rope_dim);
        double wavelen = 2.0 * M_PI / freq;
        if (wavelen < high_wavelen) ff[i] = 1.0f;
        else if (wavelen > low_wavelen) ff[i] = factor;
        else {
            double smooth = (orig / wavelen - low) / (high - low);
            ff[i] = (float)(1.0 / ((1.0 - smooth) / factor + smooth));
        }
    }
}

static uint64_t weight_bytes(const tm_weight *w) {
    if (!w->data && !w->dummy) return 0;
    return tm_dtype_row_bytes(w->type, (uint64_t)w->cols) * (uint64_t)w->rows;
}

static void sum_weight_bytes(tm_model *m) {
    uint64_t b = weight_bytes(&m->tok_embd) + weight_bytes(&m->output_norm);
    if (!m->hp.tied_embeddings) b += weight_bytes(&m->output);
    for (int32_t l = 0; l < m->hp.n_layers; l++) {
        const tm_layer *L = &m->layers[l];
        const tm_weight *ws[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->bq, &L->bk, &L->bv,
                                 &L->wo, &L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) b += weight_bytes(ws[i]);
    }
    m->weight_bytes = b;
}

static tm_status check_hparams(const tm_hparams *hp, tm_error *err) {
    if (hp->n_vocab < 1 || hp->dim < 1 || hp->n_layers < 1 || hp->n_heads < 1 || hp->n_kv_heads < 1 ||
        hp->ffn_dim < 1 || hp->head_dim < 2)
        return tm_err(err, TM_ERR_FORMAT, "bad hyper-parameters (vocab %d, dim %d, layers %d, heads %d/%d, ffn %d)",
                      hp->n_vocab, hp->dim, hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->ffn_dim);
    if (hp->n_heads % hp->n_kv_heads)
        return tm_err(err, TM_ERR_FORMAT, "head_count %d is not a multiple of head_count_kv %d", hp->n_heads,
                      hp->n_kv_heads);
    if (hp->head_dim > 512 || hp->n_heads > 1024 || hp->dim > 65536 || hp->n_layers > 1024 || hp->ffn_dim > 1 << 20)
        return tm_err(err, TM_ERR_UNSUPPORTED, "model dimensions too large (head_dim %d, heads %d, dim %d)",
                      hp->head_dim, hp->n_heads, hp->dim);
    if (hp->rope_dim < 2 || hp->rope_dim > hp->head_dim || hp->rope_dim % 2)
        return tm_err(err, TM_ERR_FORMAT, "rope dimension %d invalid for head_dim %d", hp->rope_dim, hp->head_dim);
    if (!(hp->norm_eps > 0.0f) || !(hp->rope_theta > 0.0f) || !(hp->rope_scale_linear > 0.0f))
        return tm_err(err, TM_ERR_FORMAT, "bad rms eps %g / rope theta %g / rope scale %g", (double)hp->norm_eps,
                      (double)hp->rope_theta, (double)hp->rope_scale_linear);
    return TM_OK;
}

/* ---- GGUF models ------------------------------------------------------------------------------- */

/* Bind a tensor: must exist (unless optional), have a supported type and dims (cols, rows). */
static tm_status bind(const tm_gguf *g, const char *name, int64_t cols, int64_t rows, bool optional, tm_weight *w,
                      tm_error *err) {
    memset(w, 0, sizeof *w);
    const tm_gguf_tensor *t = tm_gguf_tensor_find(g, name);
    if (!t) return optional ? TM_OK : tm_err(err, TM_ERR_FORMAT, "tensor '%s' is missing", name);
    if (!tm_dtype_supported(t->type))
        return tm_err(err, TM_ERR_UNSUPPORTED, "tensor '%s' has type %s, which tokenmill cannot compute with", name,
                      tm_dtype_name(t->type));
    bool ok = (int64_t)t->ne[0] == cols && (int64_t)t->ne[1] == rows && t->ne[2] == 1 && t->ne[3] == 1;
    if (!ok)
        return tm_err(err, TM_ERR_FORMAT, "tensor '%s' has shape [%llu, %llu, %llu, %llu], expected [%lld, %lld]", name,
                      (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
                      (unsigned long long)t->ne[3], (long long)cols, (long long)rows);
    if (rows > 1 && tm_dtype_row_bytes(t->type, (uint64_t)cols) == 0)
        return tm_err(err, TM_ERR_FORMAT, "tensor '%s': row of %lld is not a multiple of the %s block", name,
                      (long long)cols, tm_dtype_name(t->type));
    if ((rows == 1) && t->type != TM_DT_F32)
        return tm_err(err, TM_ERR_UNSUPPORTED, "vector tensor '%s' must be f32, is %s", name, tm_dtype_name(t->type));
    w->data = t->data;
    w->type = t->type;
    w->cols = cols;
    w->rows = rows;
    return TM_OK;
}

static tm_status get_i32_key(const tm_gguf *g, const char *arch, const char *suffix, int32_t def, bool required,
                             int32_t *out, tm_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const tm_gguf_kv *kv = tm_gguf_find(g, key);
    if (!kv) {
        if (required) return tm_err(err, TM_ERR_FORMAT, "metadata key '%s' is missing", key);
        *out = def;
        return TM_OK;
    }
    uint32_t v;
    tm_status s = tm_gguf_get_u32(g, key, &v, err);
    if (s != TM_OK) return s;
    if (v > INT32_MAX) return tm_err(err, TM_ERR_FORMAT, "metadata key '%s' = %u is too large", key, v);
    *out = (int32_t)v;
    return TM_OK;
}

static tm_status get_f32_key(const tm_gguf *g, const char *arch, const char *suffix, float def, float *out,
                             tm_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (!tm_gguf_find(g, key)) {
        *out = def;
        return TM_OK;
    }
    return tm_gguf_get_f32(g, key, out, err);
}

static tm_status load_gguf(const char *path, tm_model *m, tm_error *err) {
    tm_status s = tm_gguf_open(path, &m->gguf, err);
    if (s != TM_OK) return s;
    const tm_gguf *g = m->gguf;
    tm_str arch_s;
    if ((s = tm_gguf_get_str(g, "general.architecture", &arch_s, err)) != TM_OK) return s;
    char arch[64];
    if (arch_s.len >= sizeof arch) return tm_err(err, TM_ERR_FORMAT, "general.architecture is too long");
    memcpy(arch, arch_s.ptr, arch_s.len);
    arch[arch_s.len] = '\0';
    tm_hparams *hp = &m->hp;
    if (!strcmp(arch, "llama")) hp->arch = TM_ARCH_LLAMA;
    else if (!strcmp(arch, "qwen2")) hp->arch = TM_ARCH_QWEN2;
    else return tm_err(err, TM_ERR_UNSUPPORTED, "architecture '%s' is not supported (supported: llama, qwen2)", arch);
    hp->rope_neox = hp->arch == TM_ARCH_QWEN2;
    hp->qkv_bias = hp->arch == TM_ARCH_QWEN2;

    if ((s = get_i32_key(g, arch, "block_count", 0, true, &hp->n_layers, err)) ||
        (s = get_i32_key(g, arch, "embedding_length", 0, true, &hp->dim, err)) ||
        (s = get_i32_key(g, arch, "feed_forward_length", 0, true, &hp->ffn_dim, err)) ||
        (s = get_i32_key(g, arch, "attention.head_count", 0, true, &hp->n_heads, err)) ||
        (s = get_i32_key(g, arch, "attention.head_count_kv", hp->n_heads, false, &hp->n_kv_heads, err)) ||
        (s = get_i32_key(g, arch, "context_length", 2048, false, &hp->n_ctx_train, err)) ||
        (s = get_f32_key(g, arch, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->norm_eps, err)) ||
        (s = get_f32_key(g, arch, "rope.freq_base", 10000.0f, &hp->rope_theta, err)))
        return s;
    if (hp->n_heads < 1) return tm_err(err, TM_ERR_FORMAT, "attention.head_count must be positive");
    int32_t hd_default = hp->dim / hp->n_heads;
    if ((s = get_i32_key(g, arch, "attention.key_length", hd_default, false, &hp->head_dim, err)) ||
        (s = get_i32_key(g, arch, "rope.dimension_count", hp->head_dim, false, &hp->rope_dim, err)))
        return s;
    hp->rope_scale_linear = 1.0f;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    tm_str st;
    float l3_factor = 0.0f; /* llama3 scaling given by keys rather than a rope_freqs tensor */
    if (tm_gguf_find(g, key)) {
        if ((s = tm_gguf_get_str(g, key, &st, err)) != TM_OK) return s;
        if (tm_str_eq(st, "linear")) {
            if ((s = get_f32_key(g, arch, "rope.scaling.factor", 1.0f, &hp->rope_scale_linear, err))) return s;
        } else if (tm_str_eq(st, "llama3")) {
            if ((s = get_f32_key(g, arch, "rope.scaling.factor", 8.0f, &l3_factor, err))) return s;
        } else if (!tm_str_eq(st, "none")) {
            return tm_err(err, TM_ERR_UNSUPPORTED, "rope scaling type '%.*s' is not supported", (int)st.len, st.ptr);
        }
    }
    const tm_gguf_tensor *te = tm_gguf_tensor_find(g, "token_embd.weight");
    if (!te) return tm_err(err, TM_ERR_FORMAT, "tensor 'token_embd.weight' is missing");
    if (te->ne[1] > INT32_MAX) return tm_err(err, TM_ERR_FORMAT, "vocabulary too large");
    hp->n_vocab = (int32_t)te->ne[1];
    if ((s = check_hparams(hp, err)) != TM_OK) return s;

    int64_t dim = hp->dim, qd = (int64_t)hp->n_heads * hp->head_dim, kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    if ((s = bind(g, "token_embd.weight", dim, hp->n_vocab, false, &m->tok_embd, err)) ||
        (s = bind(g, "output_norm.weight", dim, 1, false, &m->output_norm, err)) ||
        (s = bind(g, "output.weight", dim, hp->n_vocab, true, &m->output, err)))
        return s;
    hp->tied_embeddings = m->output.data == NULL;
    if (hp->tied_embeddings) m->output = m->tok_embd;
    m->layers = tm_calloc((size_t)hp->n_layers, sizeof(tm_layer));
    if (!m->layers) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    for (int32_t l = 0; l < hp->n_layers; l++) {
        tm_layer *L = &m->layers[l];
        char n[12][64];
        const char *sfx[12] = {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                               "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.weight",
                               "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"};
        for (int i = 0; i < 12; i++) snprintf(n[i], sizeof n[i], "blk.%d.%s", l, sfx[i]);
        bool bias_opt = !hp->qkv_bias;
        if ((s = bind(g, n[0], dim, 1, false, &L->attn_norm, err)) || (s = bind(g, n[1], dim, qd, false, &L->wq, err)) ||
            (s = bind(g, n[2], dim, kvd, false, &L->wk, err)) || (s = bind(g, n[3], dim, kvd, false, &L->wv, err)) ||
            (s = bind(g, n[4], qd, 1, bias_opt, &L->bq, err)) || (s = bind(g, n[5], kvd, 1, bias_opt, &L->bk, err)) ||
            (s = bind(g, n[6], kvd, 1, bias_opt, &L->bv, err)) || (s = bind(g, n[7], qd, dim, false, &L->wo, err)) ||
            (s = bind(g, n[8], dim, 1, false, &L->ffn_norm, err)) ||
            (s = bind(g, n[9], dim, hp->ffn_dim, false, &L->w_gate, err)) ||
            (s = bind(g, n[10], dim, hp->ffn_dim, false, &L->w_up, err)) ||
            (s = bind(g, n[11], hp->ffn_dim, dim, false, &L->w_down, err)))
            return s;
    }
    /* Llama 3.1+ stores its rope scaling as per-frequency factors. */
    tm_weight ff = {0};
    if ((s = bind(g, "rope_freqs.weight", hp->rope_dim / 2, 1, true, &ff, err)) != TM_OK) return s;
    float *l3 = NULL;
    if (!ff.data && l3_factor > 0.0f) {
        if (!(l3_factor >= 1.0f)) return tm_err(err, TM_ERR_FORMAT, "llama3 rope scaling factor %g < 1", (double)l3_factor);
        l3 = tm_malloc_array((size_t)hp->rope_dim / 2, sizeof(float));
        if (!l3) return tm_err(err, TM_ERR_NOMEM, "out of memory");
        llama3_freq_factors(l3, hp->rope_dim / 2, hp->rope_dim, hp->rope_theta, l3_factor);
    }
    s = compute_rope(m, ff.data ? ff.data : l3, err);
    free(l3);
    if (s != TM_OK) return s;

    if ((s = tm_tok_load_gguf(g, &m->tok, err)) != TM_OK) return tm_err_prefix(err, "tokenizer");
    if (tm_tok_n_vocab(m->tok) > hp->n_vocab)
        return tm_err(err, TM_ERR_FORMAT, "tokenizer has %d tokens but the embedding only %d rows", tm_tok_n_vocab(m->tok),
                      hp->n_vocab);
    if (tm_gguf_find(g, "tokenizer.chat_template")) {
        tm_str ct;
        if ((s = tm_gguf_get_str(g, "tokenizer.chat_template", &ct, err)) != TM_OK) return s;
        m->chat_template = tm_strndup(ct.ptr, (size_t)ct.len);
        if (!m->chat_template) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    }
    tm_str name;
    if (tm_gguf_find(g, "general.name") && tm_gguf_get_str(g, "general.name", &name, NULL) == TM_OK)
        m->name = tm_strndup(name.ptr, (size_t)name.len);
    else
        m->name = tm_strndup(path, strlen(path));
    if (!m->name) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    return TM_OK;
}

/* ---- dummy models ------------------------------------------------------------------------------ */

/* splitmix64 -> uniform in [-1, 1) */
static inline float rnd_uniform(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

typedef struct dummy_alloc {
    uint8_t *base; /* (cap); NULL when the weights are deferred to the backend */
    uint64_t used, cap;
    uint64_t seed;
    float *row;    /* (max_cols) scratch */
} dummy_alloc;

/* fp8 dummies (W8A8, static per-tensor scales as FP8 checkpoints carry them): the weight scale maps the dummy range
 * uniform(-dummy_scale, dummy_scale) onto e4m3's whole range (+-448), byte = e4m3(value / scale). The activation
 * scale is a power of two (so act_scale * e4m3(x / act_scale) is exact in bf16): activations entering a linear come
 * out of an RMSNorm (RMS ~1; the dummy norms are 1) or are smaller (attention output, SwiGLU), and 1/16 keeps them
 * within e4m3's normal range (down to 2^-6 * 1/16 ~ 1e-3) up to 448 / 16 = 28 before they saturate. */
#define TM_DUMMY_FP8_ACT_SCALE (1.0f / 16.0f)

/* rows r0 .. r1 - 1 of a host dummy weight: each row from its own seed (so any split of the rows gives the same
 * bytes), made in f32 in row (cols floats of scratch) and quantized to the weight's type */
typedef struct dummy_rows {
    uint8_t *dst;    /* the weight's first row */
    float *row;      /* (cols) scratch */
    uint64_t seed, used, rb;
    int64_t r0, r1, cols;
    tm_dtype type;
    float scale, constant, w_scale;
} dummy_rows;

static void dummy_rows_make(const dummy_rows *d) {
    for (int64_t r = d->r0; r < d->r1; r++) {
        uint64_t st = d->seed ^ (d->used + (uint64_t)r * 0x9e3779b97f4a7c15ull);
        for (int64_t c = 0; c < d->cols; c++)
            d->row[c] = d->constant != 0.0f ? d->constant : d->scale * rnd_uniform(&st);
        uint8_t *q = d->dst + (uint64_t)r * d->rb;
        if (d->type == TM_DT_FP8_E4M3) {
            for (int64_t c = 0; c < d->cols; c++) q[c] = tm_fp8_from_f32(d->row[c] / d->w_scale); /* (cols) e4m3 */
        } else {
            tm_quant_row(d->type, d->row, q, d->cols);
        }
    }
}

static void *dummy_rows_thread(void *p) {
    dummy_rows_make(p);
    return NULL;
}

/* threads for a host dummy weight of n elements: TM_DUMMY_THREADS, else the online CPUs (at most 32); 1 below a
 * million elements, where a thread's start costs more than it saves */
static int dummy_threads(int64_t n) {
    if (n < ((int64_t)1 << 20)) return 1;
    const char *e = getenv("TM_DUMMY_THREADS");
    long t = e && *e ? strtol(e, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
    return t < 1 ? 1 : t > 32 ? 32 : (int)t;
}

static tm_weight dummy_weight(dummy_alloc *da, tm_dtype type, int64_t rows, int64_t cols, float scale, float constant) {
    tm_weight w = {0};
    uint64_t rb = tm_dtype_row_bytes(type, (uint64_t)cols);
    const bool fp8 = type == TM_DT_FP8_E4M3;
    w.type = type;
    w.rows = rows;
    w.cols = cols;
    if (fp8) {
        w.scale = scale / 448.0f;
        w.act_scale = TM_DUMMY_FP8_ACT_SCALE;
    }
    if (!da->base) { /* deferred: the backend makes it from this recipe (fp8: byte = e4m3((dummy_scale * u) / scale)) */
        w.dummy = true;
        w.dummy_seed = da->seed ^ (da->used * 0x9e3779b97f4a7c15ull);
        w.dummy_scale = scale;
        w.dummy_constant = constant;
        da->used += (rb * (uint64_t)rows + 63) & ~(uint64_t)63;
        return w;
    }
    w.data = da->base + da->used;
    const dummy_rows all = {.dst = da->base + da->used, .row = da->row, .seed = da->seed, .used = da->used, .rb = rb,
                            .r0 = 0, .r1 = rows, .cols = cols, .type = type, .scale = scale, .constant = constant,
                            .w_scale = w.scale};
    /* the rows split over threads (the 8B shape in q4_K took minutes on one core); part 0 is this thread's, with
     * da->row; a thread that cannot start (or get its scratch) leaves its rows to this one */
    int nt = dummy_threads(rows * cols);
    if (nt > rows) nt = (int)rows;
    pthread_t th[32];
    dummy_rows part[32];
    bool started[32] = {false};
    for (int t = 0; t < nt; t++) {
        part[t] = all;
        part[t].r0 = rows * t / nt;
        part[t].r1 = rows * (t + 1) / nt;
        if (t == 0) continue;
        part[t].row = tm_malloc_array((size_t)cols, sizeof(float));
        started[t] = part[t].row && pthread_create(&th[t], NULL, dummy_rows_thread, &part[t]) == 0;
    }
    for (int t = 0; t < nt; t++) {
        if (t == 0 || !started[t]) {
            dummy_rows mine = part[t];
            mine.row = da->row;
            dummy_rows_make(&mine);
        }
    }
    for (int t = 1; t < nt; t++) {
        if (started[t]) pthread_join(th[t], NULL);
        free(part[t].row);
    }
    da->used += (rb * (uint64_t)rows + 63) & ~(uint64_t)63;
    return w;
}

/* Find the shape and weight type of "dummy:NAME[:TYPE]" and fill hp from the shape (nothing allocated). */
static tm_status parse_dummy(const char *spec, const dummy_shape **shape, tm_dtype *wtype, tm_hparams *hp,
                             tm_error *err) {
    if (strncmp(spec, "dummy:", 6)) return tm_err(err, TM_ERR_INVALID, "'%s' is not a dummy model spec", spec);
    const char *name = spec + 6;
    const char *colon = strchr(name, ':');
    size_t nlen = colon ? (size_t)(colon - name) : strlen(name);
    const dummy_shape *sh = NULL;
    for (size_t i = 0; i < sizeof k_dummy / sizeof k_dummy[0]; i++)
        if (strlen(k_dummy[i].name) == nlen && !strncmp(k_dummy[i].name, name, nlen)) sh = &k_dummy[i];
    if (!sh) {
        char known[128] = ""; /* the table's names, so the message lists every shape */
        for (size_t i = 0, at = 0; i < sizeof k_dummy / sizeof k_dummy[0] && at < sizeof known; i++)
            at += (size_t)snprintf(known + at, sizeof known - at, "%s%s", i ? ", " : "", k_dummy[i].name);
        return tm_err(err, TM_ERR_INVALID, "unknown dummy model '%.*s' (known: %s)", (int)nlen, name, known);
    }
    tm_dtype wt = TM_DT_F16;
    if (colon) {
        const char *tn = colon + 1;
        const tm_dtype cand[] = {TM_DT_F32,  TM_DT_F16,  TM_DT_BF16, TM_DT_Q8_0,    TM_DT_Q4_0,
                                 TM_DT_Q4_1, TM_DT_Q4_K, TM_DT_Q6_K, TM_DT_FP8_E4M3};
        bool found = !strcmp(tn, "fp8"); /* short for fp8_e4m3 */
        if (found) wt = TM_DT_FP8_E4M3;
        for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++)
            if (!strcmp(tm_dtype_name(cand[i]), tn)) { wt = cand[i]; found = true; }
        if (!found)
            return tm_err(err, TM_ERR_INVALID,
                          "unknown dummy weight type '%s' (known: f32, f16, bf16, q8_0, q4_0, q4_1, q4_K, q6_K, fp8)",
                          tn);
        /* every matrix's columns (dim, heads x head_dim, ffn) must hold whole blocks of the type */
        const tm_dtype_info *ti = tm_dtype_get((uint32_t)wt);
        const int64_t blk = ti ? ti->block : 1;
        if (sh->dim % blk || sh->ffn_dim % blk)
            return tm_err(err, TM_ERR_UNSUPPORTED, "dummy:%.*s:%s: %d and %d columns are not whole %lld-element blocks",
                          (int)nlen, name, tn, sh->dim, sh->ffn_dim, (long long)blk);
    }
    memset(hp, 0, sizeof *hp);
    hp->arch = TM_ARCH_LLAMA;
    hp->n_vocab = sh->n_vocab;
    hp->dim = sh->dim;
    hp->n_layers = sh->n_layers;
    hp->n_heads = sh->n_heads;
    hp->n_kv_heads = sh->n_kv_heads;
    hp->head_dim = sh->dim / sh->n_heads;
    hp->ffn_dim = sh->ffn_dim;
    hp->n_ctx_train = sh->n_ctx;
    hp->norm_eps = 1e-5f;
    hp->rope_theta = sh->rope_theta;
    hp->rope_dim = hp->head_dim;
    hp->rope_scale_linear = 1.0f;
    hp->tied_embeddings = sh->tied;
    tm_status s = check_hparams(hp, err);
    if (s != TM_OK) return s;
    *shape = sh;
    *wtype = wt;
    return TM_OK;
}

tm_status tm_model_dummy_hparams(const char *spec, tm_hparams *hp, tm_dtype *weight_type, tm_error *err) {
    const dummy_shape *sh;
    if (!spec) return tm_err(err, TM_ERR_INVALID, "no model given");
    return parse_dummy(spec, &sh, weight_type, hp, err);
}

static tm_status load_dummy(const char *spec, bool defer, tm_model *m, tm_error *err) {
    const dummy_shape *sh;
    tm_dtype wt;
    tm_hparams *hp = &m->hp;
    tm_status s = parse_dummy(spec, &sh, &wt, hp, err);
    if (s != TM_OK) return s;

    /* lt: the seven linear weights of a layer; et: the token embedding and the output projection (fp8 dummies keep
     * them bf16, as published FP8 checkpoints do); norms are f32 */
    const tm_dtype lt = wt, et = wt == TM_DT_FP8_E4M3 ? TM_DT_BF16 : wt;
    int64_t dim = hp->dim, qd = (int64_t)hp->n_heads * hp->head_dim, kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    uint64_t rb_dim = tm_dtype_row_bytes(lt, (uint64_t)dim), rb_ffn = tm_dtype_row_bytes(lt, (uint64_t)hp->ffn_dim);
    /* 9 weights a layer, each rounded up to 64 bytes (10 * 64 covers it) */
    uint64_t per_layer = 2 * (uint64_t)dim * 4 + ((uint64_t)qd + 2 * (uint64_t)kvd + 2 * (uint64_t)hp->ffn_dim) * rb_dim +
                         (uint64_t)dim * tm_dtype_row_bytes(lt, (uint64_t)qd) + (uint64_t)dim * rb_ffn + 10 * 64;
    /* embedding, output norm, output: 3 * 63 bytes of rounding in the 256 */
    uint64_t total = (uint64_t)hp->n_layers * per_layer +
                     (uint64_t)hp->n_vocab * tm_dtype_row_bytes(et, (uint64_t)dim) * (sh->tied ? 1 : 2) +
                     (uint64_t)dim * 4 + 256;
    dummy_alloc da = {0};
    da.cap = total;
    da.seed = 0x746f6b656e6d696cull;
    da.base = defer ? NULL : tm_aligned_alloc(64, total);
    da.row = tm_malloc_array((size_t)(hp->ffn_dim > dim ? hp->ffn_dim : dim) + 64, sizeof(float));
    if ((!defer && !da.base) || !da.row) {
        tm_aligned_free(da.base);
        free(da.row);
        return tm_err(err, TM_ERR_NOMEM, "cannot allocate %.2f GB of dummy weights", (double)total / 1e9);
    }
    m->dummy_mem = da.base;
    m->dummy_bytes = total;
    float sc = 0.04f; /* uniform(-0.04, 0.04): std ~ 0.023, like an initialised transformer */
    m->tok_embd = dummy_weight(&da, et, hp->n_vocab, dim, 1.0f, 0.0f);
    m->output_norm = dummy_weight(&da, TM_DT_F32, 1, dim, 0.0f, 1.0f);
    m->output = sh->tied ? m->tok_embd : dummy_weight(&da, et, hp->n_vocab, dim, sc, 0.0f);
    m->layers = tm_calloc((size_t)hp->n_layers, sizeof(tm_layer));
    if (!m->layers) {
        free(da.row);
        return tm_err(err, TM_ERR_NOMEM, "out of memory");
    }
    for (int32_t l = 0; l < hp->n_layers; l++) {
        tm_layer *L = &m->layers[l];
        L->attn_norm = dummy_weight(&da, TM_DT_F32, 1, dim, 0.0f, 1.0f);
        L->wq = dummy_weight(&da, lt, qd, dim, sc, 0.0f);
        L->wk = dummy_weight(&da, lt, kvd, dim, sc, 0.0f);
        L->wv = dummy_weight(&da, lt, kvd, dim, sc, 0.0f);
        L->wo = dummy_weight(&da, lt, dim, qd, sc, 0.0f);
        L->ffn_norm = dummy_weight(&da, TM_DT_F32, 1, dim, 0.0f, 1.0f);
        L->w_gate = dummy_weight(&da, lt, hp->ffn_dim, dim, sc, 0.0f);
        L->w_up = dummy_weight(&da, lt, hp->ffn_dim, dim, sc, 0.0f);
        L->w_down = dummy_weight(&da, lt, dim, hp->ffn_dim, sc, 0.0f);
    }
    free(da.row);
    if (da.used > da.cap) return tm_err(err, TM_ERR_INTERNAL, "dummy weight arena overflow");
    float *ff = NULL;
    if (sh->l3_factor > 0.0f) {
        ff = tm_malloc_array((size_t)hp->rope_dim / 2, sizeof(float));
        if (!ff) return tm_err(err, TM_ERR_NOMEM, "out of memory");
        llama3_freq_factors(ff, hp->rope_dim / 2, hp->rope_dim, hp->rope_theta, sh->l3_factor);
    }
    s = compute_rope(m, ff, err);
    free(ff);
    if (s != TM_OK) return s;
    if ((s = tm_tok_create_bytes(hp->n_vocab, &m->tok, err)) != TM_OK) return s;
    m->name = tm_strndup(spec, strlen(spec));
    if (!m->name) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    return TM_OK;
}

tm_status tm_model_load(const char *spec, tm_model **out, tm_error *err) {
    return tm_model_load_ex(spec, NULL, out, err);
}

tm_status tm_model_load_ex(const char *spec, const tm_model_load_opts *opts, tm_model **out, tm_error *err) {
    *out = NULL;
    bool defer = opts && opts->defer_dummy;
    if (!spec || !*spec) return tm_err(err, TM_ERR_INVALID, "no model given");
    tm_model *m = tm_calloc(1, sizeof *m);
    if (!m) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    tm_status s = !strncmp(spec, "dummy:", 6) ? load_dummy(spec, defer, m, err) : load_gguf(spec, m, err);
    if (s != TM_OK) {
        tm_model_free(m);
        return s;
    }
    sum_weight_bytes(m);
    *out = m;
    return TM_OK;
}

void tm_model_free(tm_model *m) {
    if (!m) return;
    tm_tok_free(m->tok);
    free(m->layers);
    free(m->rope_inv_freq);
    free(m->chat_template);
    free(m->name);
    tm_aligned_free(m->dummy_mem);
    tm_gguf_close(m->gguf);
    free(m);
}

/* ---- placement in backend memory ------------------------------------------------------------------- */

/* Every weight slot of a model, in a fixed order: tok_embd, output_norm, output, then 12 per layer. */
/* Every weight of m, in placement order; group (when not NULL) gets, per slot, how many slots from it on may share
 * one allocation (weight_place_group): 3 at q (q, k, v), 2 at gate (gate, up), else 1. */
static size_t weight_slots(tm_model *m, tm_weight **slots, int8_t *group) {
    size_t k = 0;
    slots[k++] = &m->tok_embd;
    slots[k++] = &m->output_norm;
    slots[k++] = &m->output;
    for (int32_t l = 0; l < m->hp.n_layers; l++) {
        tm_layer *L = &m->layers[l];
        tm_weight *ws[] = {&L->attn_norm, &L->wq, &L->wk, &L->wv, &L->bq, &L->bk,
                           &L->bv,        &L->wo, &L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            if (group) group[k] = ws[i] == &L->wq ? 3 : ws[i] == &L->w_gate ? 2 : 1;
            slots[k++] = ws[i];
        }
    }
    if (group) group[0] = group[1] = group[2] = 1;
    return k;
}

void tm_model_unplace(tm_model *placed, tm_backend *be) {
    if (!placed) return;
    if (placed->layers) {
        size_t cap = 3 + 12 * (size_t)placed->hp.n_layers;
        tm_weight **slots = tm_malloc_array(cap, sizeof *slots);
        if (slots) {
            size_t n = weight_slots(placed, slots, NULL);
            bool tied = placed->output.data == placed->tok_embd.data;
            for (size_t i = 0; i < n; i++) {
                if (i == 2 && tied) continue;
                if (slots[i]->data) be->ops->weight_release(be, slots[i]);
            }
            free(slots);
        }
    }
    free(placed->layers);
    free(placed);
}

/* weights that can share one allocation (backend.h weight_place_group): all present, one type, width and scales */
static bool groupable(const tm_weight *w, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        if (!w[i].data && !w[i].dummy) return false;
        if (i && (w[i].type != w[0].type || w[i].cols != w[0].cols || w[i].scale != w[0].scale ||
                  w[i].act_scale != w[0].act_scale))
            return false;
    }
    return true;
}

/* a slot back to its unplaced weight: a deferred dummy keeps its recipe, anything else has no data yet */
static void unplaced(tm_weight *slot, const tm_weight *orig) {
    *slot = *orig;
    if (!orig->dummy) slot->data = NULL;
}

tm_status tm_model_place(const tm_model *m, tm_backend *be, tm_model **out, tm_error *err) {
    *out = NULL;
    if (!be->ops->weight_place) return tm_err(err, TM_ERR_INVALID, "backend %s has no memory of its own", be->ops->name);
    tm_model *p = tm_calloc(1, sizeof *p);
    tm_weight **slots = tm_malloc_array(3 + 12 * (size_t)m->hp.n_layers, sizeof *slots);
    int8_t *groups = tm_malloc_array(3 + 12 * (size_t)m->hp.n_layers, sizeof *groups);
    tm_weight *orig = NULL;
    if (!p || !slots || !groups) goto nomem;
    *p = *m; /* borrows tokenizer, names, rope table; owns only its layer array */
    p->gguf = NULL;
    p->dummy_mem = NULL;
    p->layers = tm_malloc_array((size_t)m->hp.n_layers, sizeof(tm_layer));
    if (!p->layers) goto nomem;
    memcpy(p->layers, m->layers, (size_t)m->hp.n_layers * sizeof(tm_layer));
    bool tied = m->output.data == m->tok_embd.data && m->output.dummy_seed == m->tok_embd.dummy_seed;
    size_t n = weight_slots(p, slots, groups);
    /* clear first, so a failure part-way releases only what was placed */
    orig = tm_malloc_array(n, sizeof *orig);
    if (!orig) goto nomem;
    for (size_t i = 0; i < n; i++) {
        orig[i] = *slots[i];
        unplaced(slots[i], &orig[i]);
    }
    tm_status s = TM_OK;
    for (size_t i = 0; i < n && s == TM_OK; i++) {
        if (i == 2 && tied) continue;
        if (!orig[i].data && !orig[i].dummy) continue; /* absent (biases) */
        /* a layer's q, k, v and its gate, up in one allocation each where the backend can */
        const int32_t group = groups[i];
        if (group > 1 && be->ops->weight_place_group && groupable(orig + i, group)) {
            for (int32_t g = 0; g < group; g++) *slots[i + (size_t)g] = orig[i + (size_t)g];
            tm_error gerr = {0};
            if (be->ops->weight_place_group(be, slots + i, group, &gerr) == TM_OK) {
                i += (size_t)group - 1;
                continue;
            }
            for (int32_t g = 0; g < group; g++) unplaced(slots[i + (size_t)g], &orig[i + (size_t)g]);
        }
        *slots[i] = orig[i];
        s = be->ops->weight_place(be, slots[i], err);
        if (s != TM_OK) slots[i]->data = NULL;
    }
    if (tied) p->output = p->tok_embd;
    free(orig);
    free(slots);
    free(groups);
    if (s != TM_OK) {
        tm_model_unplace(p, be);
        return tm_err_prefix(err, "placing the weights on %s", be->ops->name);
    }
    *out = p;
    return TM_OK;
nomem:
    if (p) free(p->layers); /* NULL until it was allocated (tm_calloc, or a failed allocation) */
    free(p);
    free(slots);
    free(groups);
    free(orig);
    return tm_err(err, TM_ERR_NOMEM, "out of memory");
}

bool tm_model_has_deferred(const tm_model *m) {
    if (m->tok_embd.dummy || m->output.dummy) return true;
    for (int32_t l = 0; l < m->hp.n_layers; l++)
        if (m->layers[l].wq.dummy) return true;
    return false;
}

tm_attn_cfg tm_model_attn_cfg(const tm_model *m) {
    tm_attn_cfg a = {
        .n_heads = m->hp.n_heads,
        .n_kv_heads = m->hp.n_kv_heads,
        .head_dim = m->hp.head_dim,
        .rope_dim = m->hp.rope_dim,
        .rope_neox = m->hp.rope_neox,
        .rope_inv_freq = m->rope_inv_freq,
        .attn_scale = 1.0f / sqrtf((float)m->hp.head_dim),
    };
    return a;
}
