/* tm_tp.c -- tensor parallelism: Megatron-style shard plans and the host copy of a rank's shard of a model. */
#include "tm_tp.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ---- checks and plans -------------------------------------------------------------------------- */

static uint32_t block_of(tm_dtype t) {
    const tm_dtype_info *info = tm_dtype_get((uint32_t)t);
    return info && info->block ? info->block : 0;
}

/* The column slice of a (rows, cols) weight of type t of width `width` must start and end on a block boundary
 * (the slices start at r * width, so width alone decides). */
static tm_status check_cols(const tm_weight *w, int32_t layer, const char *what, int64_t width, const char *unit,
                            tm_error *err) {
    uint32_t blk = block_of(w->type);
    if (blk == 0) return tm_err(err, TM_ERR_UNSUPPORTED, "layer %d: %s has unknown type %u", layer, what, w->type);
    if (width % blk)
        return tm_err(err, TM_ERR_UNSUPPORTED,
                      "layer %d: %s is %s (blocks of %u elements); its column slice per rank, %lld %s, is not a "
                      "multiple of the block, so it cannot be split at this tensor-parallel degree",
                      layer, what, tm_dtype_name(w->type), blk, (long long)width, unit);
    return TM_OK;
}

static bool deferred(const tm_weight *w) { return !w->data && w->dummy; }

tm_status tm_tp_check(const tm_model *m, int32_t n_ranks, tm_error *err) {
    const tm_hparams *hp = &m->hp;
    if (n_ranks < 1) return tm_err(err, TM_ERR_INVALID, "tensor-parallel degree %d must be at least 1", n_ranks);
    if (hp->n_heads % n_ranks || hp->n_kv_heads % n_ranks)
        return tm_err(err, TM_ERR_UNSUPPORTED,
                      "tensor parallelism over %d ranks needs both head counts divisible by %d: the model has %d "
                      "query heads and %d KV heads",
                      n_ranks, n_ranks, hp->n_heads, hp->n_kv_heads);
    if (hp->ffn_dim % n_ranks)
        return tm_err(err, TM_ERR_UNSUPPORTED,
                      "tensor parallelism over %d ranks needs the feed-forward width divisible by %d: it is %d",
                      n_ranks, n_ranks, hp->ffn_dim);
    if (deferred(&m->tok_embd) || deferred(&m->output))
        return tm_err(err, TM_ERR_UNSUPPORTED, "deferred dummy weights cannot be sharded on the host");
    int64_t wo_w = (int64_t)(hp->n_heads / n_ranks) * hp->head_dim, down_w = hp->ffn_dim / n_ranks;
    for (int32_t l = 0; l < hp->n_layers; l++) {
        const tm_layer *L = &m->layers[l];
        if (deferred(&L->wq) || deferred(&L->wo) || deferred(&L->w_down) || deferred(&L->w_gate))
            return tm_err(err, TM_ERR_UNSUPPORTED, "deferred dummy weights cannot be sharded on the host");
        char what[96];
        snprintf(what, sizeof what, "wo (%d heads x %d per rank)", hp->n_heads / n_ranks, hp->head_dim);
        tm_status s = check_cols(&L->wo, l, what, wo_w, "columns", err);
        if (s == TM_OK) s = check_cols(&L->w_down, l, "w_down", down_w, "ffn columns", err);
        if (s != TM_OK) return s;
    }
    return TM_OK;
}

tm_status tm_tp_plan_make(const tm_model *m, int32_t n_ranks, int32_t rank, tm_tp_plan *out, tm_error *err) {
    memset(out, 0, sizeof *out);
    tm_status s = tm_tp_check(m, n_ranks, err);
    if (s != TM_OK) return s;
    if (rank < 0 || rank >= n_ranks) return tm_err(err, TM_ERR_INVALID, "rank %d outside 0..%d", rank, n_ranks - 1);
    const tm_hparams *hp = &m->hp;
    out->n_ranks = n_ranks;
    out->rank = rank;
    out->head_dim = hp->head_dim;
    out->n_q_heads = hp->n_heads / n_ranks;
    out->q_head_begin = rank * out->n_q_heads;
    out->n_kv_heads = hp->n_kv_heads / n_ranks;
    out->kv_head_begin = rank * out->n_kv_heads;
    out->ffn_dim = hp->ffn_dim / n_ranks;
    out->ffn_begin = rank * out->ffn_dim;
    return TM_OK;
}

tm_tp_slice tm_tp_slice_of(const tm_tp_plan *p, tm_tp_tensor t, const tm_weight *w) {
    int64_t hd = p->head_dim;
    int64_t qb = p->q_head_begin * hd, qn = p->n_q_heads * hd, kb = p->kv_head_begin * hd, kn = p->n_kv_heads * hd;
    tm_tp_slice s = {TM_TP_REPLICATED, 0, w->rows};
    switch (t) {
    case TM_TP_WQ: s = (tm_tp_slice){TM_TP_ROWS, qb, qn}; break;
    case TM_TP_WK:
    case TM_TP_WV: s = (tm_tp_slice){TM_TP_ROWS, kb, kn}; break;
    case TM_TP_BQ: s = (tm_tp_slice){TM_TP_COLS, qb, qn}; break;
    case TM_TP_BK:
    case TM_TP_BV: s = (tm_tp_slice){TM_TP_COLS, kb, kn}; break;
    case TM_TP_WO: s = (tm_tp_slice){TM_TP_COLS, qb, qn}; break;
    case TM_TP_W_GATE:
    case TM_TP_W_UP: s = (tm_tp_slice){TM_TP_ROWS, p->ffn_begin, p->ffn_dim}; break;
    case TM_TP_W_DOWN: s = (tm_tp_slice){TM_TP_COLS, p->ffn_begin, p->ffn_dim}; break;
    default: break; /* norms, embedding, output: replicated */
    }
    return s;
}

/* ---- slices ------------------------------------------------------------------------------------ */

uint64_t tm_tp_slice_bytes(const tm_weight *w, tm_tp_slice s) {
    uint64_t rb = tm_dtype_row_bytes(w->type, (uint64_t)w->cols);
    uint32_t blk = block_of(w->type);
    if (rb == 0 || blk == 0 || w->rows < 1) return 0;
    switch (s.split) {
    case TM_TP_REPLICATED: return rb * (uint64_t)w->rows;
    case TM_TP_ROWS:
        if (s.begin < 0 || s.count < 1 || s.begin > w->rows - s.count) return 0;
        return rb * (uint64_t)s.count;
    case TM_TP_COLS:
        if (s.begin < 0 || s.count < 1 || s.begin > w->cols - s.count) return 0;
        if (s.begin % blk || s.count % blk) return 0;
        return tm_dtype_row_bytes(w->type, (uint64_t)s.count) * (uint64_t)w->rows;
    }
    return 0;
}

tm_status tm_tp_slice_copy(const tm_weight *w, tm_tp_slice s, void *dst, uint64_t dst_bytes, tm_error *err) {
    if (!w->data) return tm_err(err, TM_ERR_INVALID, "cannot slice a weight that is not in host memory");
    uint64_t bytes = tm_tp_slice_bytes(w, s);
    if (bytes == 0)
        return tm_err(err, TM_ERR_INVALID, "bad slice [%lld, +%lld) of a (%lld, %lld) %s weight", (long long)s.begin,
                      (long long)s.count, (long long)w->rows, (long long)w->cols, tm_dtype_name(w->type));
    if (dst_bytes < bytes)
        return tm_err(err, TM_ERR_INVALID, "slice needs %llu bytes, destination has %llu", (unsigned long long)bytes,
                      (unsigned long long)dst_bytes);
    const uint8_t *src = w->data; /* (rows, cols) of type */
    uint8_t *d = dst;             /* (rows', cols') of type */
    uint64_t rb = tm_dtype_row_bytes(w->type, (uint64_t)w->cols);
    if (s.split == TM_TP_REPLICATED) {
        memcpy(d, src, bytes);
    } else if (s.split == TM_TP_ROWS) {
        memcpy(d, src + rb * (uint64_t)s.begin, bytes);
    } else {
        uint64_t off = s.begin ? tm_dtype_row_bytes(w->type, (uint64_t)s.begin) : 0; /* block-aligned: exact */
        uint64_t len = tm_dtype_row_bytes(w->type, (uint64_t)s.count);
        for (int64_t r = 0; r < w->rows; r++) memcpy(d + len * (uint64_t)r, src + rb * (uint64_t)r + off, len);
    }
    return TM_OK;
}

/* ---- shard models ------------------------------------------------------------------------------ */

typedef struct tp_entry {
    tm_tp_tensor t;
    const tm_weight *src;
    tm_weight *dst;
} tp_entry;

/* Every weight of m with its slot in s, in a fixed order (3 + 12 per layer). */
static size_t entries(const tm_model *m, tm_model *s, tp_entry *e) {
    size_t k = 0;
    e[k++] = (tp_entry){TM_TP_TOK_EMBD, &m->tok_embd, &s->tok_embd};
    e[k++] = (tp_entry){TM_TP_OUTPUT_NORM, &m->output_norm, &s->output_norm};
    e[k++] = (tp_entry){TM_TP_OUTPUT, &m->output, &s->output};
    for (int32_t l = 0; l < m->hp.n_layers; l++) {
        const tm_layer *L = &m->layers[l];
        tm_layer *D = &s->layers[l];
        e[k++] = (tp_entry){TM_TP_ATTN_NORM, &L->attn_norm, &D->attn_norm};
        e[k++] = (tp_entry){TM_TP_WQ, &L->wq, &D->wq};
        e[k++] = (tp_entry){TM_TP_WK, &L->wk, &D->wk};
        e[k++] = (tp_entry){TM_TP_WV, &L->wv, &D->wv};
        e[k++] = (tp_entry){TM_TP_BQ, &L->bq, &D->bq};
        e[k++] = (tp_entry){TM_TP_BK, &L->bk, &D->bk};
        e[k++] = (tp_entry){TM_TP_BV, &L->bv, &D->bv};
        e[k++] = (tp_entry){TM_TP_WO, &L->wo, &D->wo};
        e[k++] = (tp_entry){TM_TP_FFN_NORM, &L->ffn_norm, &D->ffn_norm};
        e[k++] = (tp_entry){TM_TP_W_GATE, &L->w_gate, &D->w_gate};
        e[k++] = (tp_entry){TM_TP_W_UP, &L->w_up, &D->w_up};
        e[k++] = (tp_entry){TM_TP_W_DOWN, &L->w_down, &D->w_down};
    }
    return k;
}

static uint64_t align64(uint64_t x) { return (x + 63) & ~(uint64_t)63; }

tm_status tm_tp_shard_model(const tm_model *m, int32_t n_ranks, int32_t rank, tm_model **out, tm_error *err) {
    *out = NULL;
    tm_tp_plan p;
    tm_status s = tm_tp_plan_make(m, n_ranks, rank, &p, err);
    if (s != TM_OK) return s;
    tp_entry *e = NULL;
    tm_model *sh = tm_calloc(1, sizeof *sh);
    if (!sh) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    sh->hp = m->hp;
    sh->hp.n_heads = p.n_q_heads;
    sh->hp.n_kv_heads = p.n_kv_heads;
    sh->hp.ffn_dim = p.ffn_dim;
    size_t n_rope = (size_t)(m->hp.rope_dim / 2), cap = 3 + 12 * (size_t)m->hp.n_layers;
    char name[256];
    snprintf(name, sizeof name, "%s [tp %d/%d]", m->name ? m->name : "model", rank, n_ranks);
    sh->name = tm_strndup(name, strlen(name));
    sh->chat_template = m->chat_template ? tm_strndup(m->chat_template, strlen(m->chat_template)) : NULL;
    sh->rope_inv_freq = tm_malloc_array(n_rope, sizeof(float));
    sh->layers = tm_calloc((size_t)m->hp.n_layers, sizeof(tm_layer));
    e = tm_malloc_array(cap, sizeof *e);
    if (!sh->name || (m->chat_template && !sh->chat_template) || !sh->rope_inv_freq || !sh->layers || !e) {
        s = tm_err(err, TM_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    memcpy(sh->rope_inv_freq, m->rope_inv_freq, n_rope * sizeof(float));
    bool tied = m->output.data == m->tok_embd.data;
    size_t n = entries(m, sh, e);
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!e[i].src->data || (e[i].t == TM_TP_OUTPUT && tied)) continue;
        uint64_t b = tm_tp_slice_bytes(e[i].src, tm_tp_slice_of(&p, e[i].t, e[i].src));
        if (b == 0) {
            s = tm_err(err, TM_ERR_UNSUPPORTED, "weight %zu (%s, %lld x %lld) cannot be sliced for rank %d of %d", i,
                       tm_dtype_name(e[i].src->type), (long long)e[i].src->rows, (long long)e[i].src->cols, rank,
                       n_ranks);
            goto cleanup;
        }
        total += align64(b);
    }
    sh->dummy_mem = tm_aligned_alloc(64, (size_t)total);
    if (!sh->dummy_mem) {
        s = tm_err(err, TM_ERR_NOMEM, "cannot allocate %llu bytes of shard weights", (unsigned long long)total);
        goto cleanup;
    }
    sh->dummy_bytes = total;
    uint8_t *mem = sh->dummy_mem; /* (total) bytes: every sliced weight, 64-byte aligned */
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const tm_weight *w = e[i].src;
        tm_weight *d = e[i].dst;
        memset(d, 0, sizeof *d);
        if (!w->data || (e[i].t == TM_TP_OUTPUT && tied)) continue; /* absent bias; tied output set below */
        tm_tp_slice sl = tm_tp_slice_of(&p, e[i].t, w);
        uint64_t b = tm_tp_slice_bytes(w, sl);
        if ((s = tm_tp_slice_copy(w, sl, mem + off, b, err)) != TM_OK) goto cleanup;
        d->data = mem + off;
        d->type = w->type;
        d->rows = sl.split == TM_TP_ROWS ? sl.count : w->rows;
        d->cols = sl.split == TM_TP_COLS ? sl.count : w->cols;
        /* fp8: the per-tensor scales hold for every slice (a row-parallel slice's partial sums are scaled alike, so
         * their sum is the whole product) */
        d->scale = w->scale;
        d->act_scale = w->act_scale;
        off += align64(b);
        sh->weight_bytes += b;
    }
    if (tied) sh->output = sh->tok_embd;
    free(e);
    *out = sh;
    return TM_OK;
cleanup:
    free(e);
    tm_model_free(sh);
    return s;
}

void tm_tp_shard_free(tm_model *shard) { tm_model_free(shard); }

/* ---- KV cache ---------------------------------------------------------------------------------- */

tm_kv_cfg tm_tp_kv_cfg(const tm_tp_plan *p, const tm_kv_cfg *full) {
    tm_kv_cfg c = *full;
    c.n_kv_heads = p->n_kv_heads;
    return c;
}

uint64_t tm_tp_kv_bytes_per_token(const tm_model *m, const tm_tp_plan *p, uint32_t elem_bytes) {
    return 2ull * (uint64_t)m->hp.n_layers * (uint64_t)p->n_kv_heads * (uint64_t)p->head_dim * elem_bytes;
}

/* ---- bootstrap over TCP ------------------------------------------------------------------------ */

#define TP_MAGIC "TMTPID01"
enum { TP_MAGIC_LEN = 8, TP_HELLO_LEN = 16, TP_MAX_ID = 4096 };

static int64_t now_ms(void) { return (int64_t)(tm_time_ns() / 1000000u); }

static void put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}
static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* Wait until fd is ready for `events` or the deadline passes: 1 ready, 0 timed out, -1 error. */
static int wait_fd(int fd, short events, int64_t deadline) {
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0) return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, left > 1000000 ? 1000000 : (int)left);
        if (r > 0) return 1;
        if (r == 0) return 0;
        if (errno != EINTR) return -1;
    }
}

/* Move exactly n bytes (send when out, else receive) before the deadline. */
static tm_status xfer(int fd, void *buf, size_t n, bool out, int64_t deadline, const char *what, tm_error *err) {
    uint8_t *p = buf;
    while (n > 0) {
        int w = wait_fd(fd, out ? POLLOUT : POLLIN, deadline);
        if (w == 0) return tm_err(err, TM_ERR_IO, "tensor-parallel bootstrap: timed out %s", what);
        if (w < 0) return tm_err(err, TM_ERR_IO, "tensor-parallel bootstrap: %s: %s", what, strerror(errno));
        ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (k < 0) return tm_err(err, TM_ERR_IO, "tensor-parallel bootstrap: %s: %s", what, strerror(errno));
        if (k == 0) return tm_err(err, TM_ERR_IO, "tensor-parallel bootstrap: peer closed the connection %s", what);
        p += k;
        n -= (size_t)k;
    }
    return TM_OK;
}

tm_status tm_tp_listen(const char *host, int port, tm_tp_listener *out, tm_error *err) {
    out->fd = -1;
    out->port = 0;
    if (port < 0 || port > 65535) return tm_err(err, TM_ERR_INVALID, "bad port %d", port);
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g != 0) return tm_err(err, TM_ERR_IO, "cannot resolve %s: %s", host ? host : "(any)", gai_strerror(g));
    tm_status s = TM_OK;
    int fd = -1, e = 0;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) break;
        e = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) return tm_err(err, TM_ERR_IO, "cannot listen on port %d: %s", port, strerror(e ? e : EADDRNOTAVAIL));
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) {
        s = tm_err(err, TM_ERR_IO, "getsockname: %s", strerror(errno));
        close(fd);
        return s;
    }
    out->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                         : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    out->fd = fd;
    return TM_OK;
}

void tm_tp_listener_close(tm_tp_listener *l) {
    if (l->fd >= 0) close(l->fd);
    l->fd = -1;
}

tm_status tm_tp_serve_id(tm_tp_listener *l, int32_t n_ranks, const void *id, size_t id_len, int timeout_ms,
                         tm_error *err) {
    if (l->fd < 0) return tm_err(err, TM_ERR_INVALID, "listener is closed");
    if (n_ranks < 1 || n_ranks > 65536 || id_len < 1 || id_len > TP_MAX_ID)
        return tm_err(err, TM_ERR_INVALID, "bad bootstrap (%d ranks, id of %zu bytes)", n_ranks, id_len);
    bool *seen = tm_calloc((size_t)n_ranks, sizeof(bool));
    uint8_t *msg = tm_malloc(TP_MAGIC_LEN + 4 + id_len); /* magic, id_len, id */
    if (!seen || !msg) {
        free(seen);
        free(msg);
        return tm_err(err, TM_ERR_NOMEM, "out of memory");
    }
    memcpy(msg, TP_MAGIC, TP_MAGIC_LEN);
    put_u32(msg + TP_MAGIC_LEN, (uint32_t)id_len);
    memcpy(msg + TP_MAGIC_LEN + 4, id, id_len);
    int64_t deadline = now_ms() + timeout_ms;
    tm_status s = TM_OK;
    for (int32_t got = 0; got < n_ranks - 1 && s == TM_OK; got++) {
        int w = wait_fd(l->fd, POLLIN, deadline);
        if (w <= 0) {
            s = tm_err(err, TM_ERR_IO, "tensor-parallel bootstrap: %d of %d ranks connected before the %d ms deadline",
                       got + 1, n_ranks, timeout_ms);
            break;
        }
        int c = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED) {
                got--;
                continue;
            }
            s = tm_err(err, TM_ERR_IO, "tensor-parallel bootstrap: accept: %s", strerror(errno));
            break;
        }
        uint8_t hello[TP_HELLO_LEN]; /* magic, n_ranks, rank */
        s = xfer(c, hello, sizeof hello, false, deadline, "reading a rank's hello", err);
        if (s == TM_OK) {
            int32_t pn = (int32_t)get_u32(hello + TP_MAGIC_LEN), pr = (int32_t)get_u32(hello + TP_MAGIC_LEN + 4);
            if (memcmp(hello, TP_MAGIC, TP_MAGIC_LEN))
                s = tm_err(err, TM_ERR_FORMAT, "tensor-parallel bootstrap: a connection is not a tokenmill rank");
            else if (pn != n_ranks)
                s = tm_err(err, TM_ERR_INVALID, "tensor-parallel bootstrap: rank %d runs with %d ranks, rank 0 with %d",
                           pr, pn, n_ranks);
            else if (pr < 1 || pr >= n_ranks)
                s = tm_err(err, TM_ERR_INVALID, "tensor-parallel bootstrap: rank %d outside 1..%d", pr, n_ranks - 1);
            else if (seen[pr])
                s = tm_err(err, TM_ERR_INVALID, "tensor-parallel bootstrap: rank %d connected twice", pr);
            else
                seen[pr] = true;
        }
        if (s == TM_OK) s = xfer(c, msg, TP_MAGIC_LEN + 4 + id_len, true, deadline, "sending the id", err);
        close(c);
    }
    free(seen);
    free(msg);
    return s;
}

tm_status tm_tp_fetch_id(const char *host, int port, int32_t n_ranks, int32_t rank, void *id, size_t id_len,
                         int timeout_ms, tm_error *err) {
    if (!host || port < 1 || port > 65535 || n_ranks < 2 || rank < 1 || rank >= n_ranks || id_len < 1 ||
        id_len > TP_MAX_ID)
        return tm_err(err, TM_ERR_INVALID, "bad bootstrap (%s:%d, rank %d of %d, id of %zu bytes)", host ? host : "?",
                      port, rank, n_ranks, id_len);
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int g = getaddrinfo(host, ps, &hints, &ai);
    if (g != 0) return tm_err(err, TM_ERR_IO, "cannot resolve %s: %s", host, gai_strerror(g));
    int64_t deadline = now_ms() + timeout_ms;
    int fd = -1, e = 0;
    while (fd < 0 && now_ms() < deadline) { /* rank 0 may not listen yet: retry */
        for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
            fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
            if (fd < 0) continue;
            if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
            e = errno;
            close(fd);
            fd = -1;
        }
        if (fd < 0) {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return tm_err(err, TM_ERR_IO,
                      "tensor-parallel bootstrap: rank %d cannot reach rank 0 at %s:%d within %d ms: %s",
                      rank, host, port, timeout_ms, strerror(e ? e : ETIMEDOUT));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    uint8_t hello[TP_HELLO_LEN], head[TP_MAGIC_LEN + 4];
    memcpy(hello, TP_MAGIC, TP_MAGIC_LEN);
    put_u32(hello + TP_MAGIC_LEN, (uint32_t)n_ranks);
    put_u32(hello + TP_MAGIC_LEN + 4, (uint32_t)rank);
    tm_status s = xfer(fd, hello, sizeof hello, true, deadline, "sending the hello", err);
    if (s == TM_OK) s = xfer(fd, head, sizeof head, false, deadline, "waiting for the id from rank 0", err);
    if (s == TM_OK && memcmp(head, TP_MAGIC, TP_MAGIC_LEN))
        s = tm_err(err, TM_ERR_FORMAT, "tensor-parallel bootstrap: %s:%d is not a tokenmill rank 0", host, port);
    if (s == TM_OK && get_u32(head + TP_MAGIC_LEN) != id_len)
        s = tm_err(err, TM_ERR_FORMAT, "tensor-parallel bootstrap: rank 0 sent an id of %u bytes, expected %zu",
                   get_u32(head + TP_MAGIC_LEN), id_len);
    if (s == TM_OK) s = xfer(fd, id, id_len, false, deadline, "receiving the id", err);
    close(fd);
    return s;
}
