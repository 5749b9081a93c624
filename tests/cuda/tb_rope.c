/* tb_rope.c -- test bed of tm_cuda_rope_kv_write: double-precision reference, poisoned cache, both versions, timing. */
#include "tb_common.h"

#include "backend/cuda/tm_cuda_kernels.h"
#include "core/tm_fp8.h"

typedef struct {
    const char *name;
    bool neox;
    int n_heads, n_kv, hd, rope_dim, n_tokens, block_size, n_blocks;
    bool padding; /* some tokens get slot -1 */
} rope_cfg;

static void set_version(int v) {
    if (v == 1)
        setenv("TM_CUDA_ROPE_V", "1", 1);
    else
        unsetenv("TM_CUDA_ROPE_V");
}

static void make_inv_freq(float *inv, int rope_dim) {
    for (int j = 0; j < rope_dim / 2; j++) inv[j] = (float)pow(500000.0, -2.0 * j / rope_dim);
}

/* rotate one head of bf16 input x (hd) into ref (hd floats) in double: the f32 angle of the kernel and the CPU */
static void ref_head(const uint16_t *x, float *ref, const float *inv, int pos, int hd, int rope_dim, bool neox) {
    int half = rope_dim / 2;
    for (int d = 0; d < hd; d++) ref[d] = tb_bf16_to_f32(x[d]);
    for (int j = 0; j < half; j++) {
        float th = (float)pos * inv[j];
        double c = cos((double)th), s = sin((double)th);
        int ia = neox ? j : 2 * j, ib = neox ? j + half : 2 * j + 1;
        double a = tb_bf16_to_f32(x[ia]), b = tb_bf16_to_f32(x[ib]);
        ref[ia] = (float)(a * c - b * s);
        ref[ib] = (float)(a * s + b * c);
    }
}

static void check_cfg(const rope_cfg *c, int version) {
    const int T = c->n_tokens, H = c->n_heads, KV = c->n_kv, hd = c->hd, rd = c->rope_dim;
    const size_t nq = (size_t)T * H * hd, nk = (size_t)T * KV * hd;
    const size_t n_slots = (size_t)c->n_blocks * c->block_size, ncache = n_slots * KV * hd;
    uint16_t *q = malloc(nq * 2), *k = malloc(nk * 2), *v = malloc(nk * 2), *q_out = malloc(nq * 2);
    uint16_t *kc = malloc(ncache * 2), *vc = malloc(ncache * 2);
    float *inv = calloc(rd / 2 + 1, sizeof(float));
    int32_t *pos = malloc(T * sizeof(int32_t));
    int64_t *slot = malloc(T * sizeof(int64_t));
    int64_t *perm = malloc(n_slots * sizeof(int64_t));
    int32_t *owner = malloc(n_slots * sizeof(int32_t)); /* token written to each slot, -1 none */
    float *ref_q = malloc(nq * sizeof(float)), *got_q = malloc(nq * sizeof(float));
    float *ref_k = malloc(nk * sizeof(float)), *got_k = malloc(nk * sizeof(float));
    float *row = malloc(hd * sizeof(float));
    tb_fill_bf16(q, NULL, nq, 1.0f);
    tb_fill_bf16(k, NULL, nk, 1.0f);
    tb_fill_bf16(v, NULL, nk, 1.0f);
    make_inv_freq(inv, rd);
    /* distinct random slots over the whole pool; positions from 0 to beyond 128k (large angles) */
    for (size_t s = 0; s < n_slots; s++) perm[s] = (int64_t)s, owner[s] = -1;
    for (size_t s = n_slots - 1; s > 0; s--) {
        size_t j = tb_rand_u64() % (s + 1);
        int64_t t = perm[s];
        perm[s] = perm[j];
        perm[j] = t;
    }
    for (int t = 0; t < T; t++) {
        slot[t] = perm[t];
        if (c->padding && t % 4 == 2) slot[t] = -1;
        pos[t] = T > 2 && t < 2 ? t : (int32_t)(tb_rand_u64() % 140000);
        if (slot[t] >= 0) owner[slot[t]] = t;
    }

    uint16_t *d_q = tb_upload(q, nq * 2), *d_k = tb_upload(k, nk * 2), *d_v = tb_upload(v, nk * 2);
    uint16_t *d_kc = tb_dev(ncache * 2), *d_vc = tb_dev(ncache * 2);
    float *d_inv = tb_upload(inv, (rd / 2 + 1) * sizeof(float));
    int32_t *d_pos = tb_upload(pos, T * sizeof(int32_t));
    int64_t *d_slot = tb_upload(slot, T * sizeof(int64_t));
    tb_poison(d_kc, ncache * 2);
    tb_poison(d_vc, ncache * 2);
    tm_cuda_rope_args a = {T, H, KV, hd, rd, c->block_size, c->neox, d_inv, d_pos, d_slot, d_q, d_k, d_v, d_kc, d_vc,
                           false, NULL, 0, NULL, NULL};
    set_version(version);
    TB_RUN(tm_cuda_rope_kv_write(&a, 0));
    set_version(2);
    tb_download(q_out, d_q, nq * 2);
    tb_download(kc, d_kc, ncache * 2);
    tb_download(vc, d_vc, ncache * 2);

    size_t bad = 0, nkc = 0; /* bitwise mismatches; rotated k rows compared */
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            size_t o = ((size_t)t * H + h) * hd;
            ref_head(q + o, ref_q + o, inv, pos[t], hd, rd, c->neox);
            for (int d = 0; d < hd; d++) {
                got_q[o + d] = tb_bf16_to_f32(q_out[o + d]);
                if (d >= rd && q_out[o + d] != q[o + d]) bad++; /* pass-through dims untouched */
            }
        }
    for (size_t s = 0; s < n_slots; s++) {
        size_t blk = s / c->block_size, off = s % c->block_size;
        for (int h = 0; h < KV; h++) {
            size_t co = ((blk * KV + h) * c->block_size + off) * hd;
            int t = owner[s];
            if (t < 0) { /* not in the mapping: still poisoned */
                for (int d = 0; d < hd; d++) bad += (kc[co + d] != 0xFFFF) + (vc[co + d] != 0xFFFF);
                continue;
            }
            size_t ko = ((size_t)t * KV + h) * hd;
            ref_head(k + ko, row, inv, pos[t], hd, rd, c->neox);
            for (int d = 0; d < hd; d++) {
                ref_k[nkc] = row[d];
                got_k[nkc++] = tb_bf16_to_f32(kc[co + d]);
                if (d >= rd && kc[co + d] != k[ko + d]) bad++;
                if (vc[co + d] != v[ko + d]) bad++;
            }
        }
    }
    double eq = tb_rel_err(got_q, ref_q, nq), ek = nkc ? tb_rel_err(got_k, ref_k, nkc) : 0.0;
    if (bad)
        printf("# %s: %zu bitwise mismatches (pass-through dims, v, or slots outside the mapping)\n", c->name, bad);
    char name[96];
    snprintf(name, sizeof name, "v%d %s q", version, c->name);
    tb_result("rope_kv_write", name, bad ? INFINITY : eq, 1e-2, 0, 0, 0, 'm');
    snprintf(name, sizeof name, "v%d %s k-cache", version, c->name);
    tb_result("rope_kv_write", name, bad ? INFINITY : ek, 1e-2, 0, 0, 0, 'm');

    /* fp8 e4m3 caches: every written byte is the e4m3 rounding of what the bf16 cache holds, others untouched */
    uint8_t *kc8 = malloc(ncache), *vc8 = malloc(ncache);
    TB_CHECK(cudaMemcpy(d_q, q, nq * 2, cudaMemcpyHostToDevice));
    tb_poison(d_kc, ncache);
    tb_poison(d_vc, ncache);
    a.kv_fp8 = true;
    set_version(version);
    TB_RUN(tm_cuda_rope_kv_write(&a, 0));
    set_version(2);
    tb_download(kc8, d_kc, ncache);
    tb_download(vc8, d_vc, ncache);
    size_t bad8 = 0;
    for (size_t s = 0; s < n_slots; s++) {
        size_t blk = s / c->block_size, off = s % c->block_size;
        for (int h = 0; h < KV; h++) {
            size_t co = ((blk * KV + h) * c->block_size + off) * hd;
            for (int d = 0; d < hd; d++) {
                const bool w = owner[s] >= 0;
                const uint8_t ek8 = w ? tm_fp8_from_f32(tb_bf16_to_f32(kc[co + d])) : 0xFF;
                const uint8_t ev8 = w ? tm_fp8_from_f32(tb_bf16_to_f32(vc[co + d])) : 0xFF;
                bad8 += (kc8[co + d] != ek8) + (vc8[co + d] != ev8);
            }
        }
    }
    if (bad8) printf("# %s fp8: %zu bytes differ from the e4m3 rounding of the bf16 cache\n", c->name, bad8);
    snprintf(name, sizeof name, "v%d %s fp8 k/v-cache", version, c->name);
    tb_result("rope_kv_write", name, bad8 ? 1.0 : 0.0, 0.0, 0, 0, 0, 'm');
    free(kc8);
    free(vc8);

    /* q, k, v as rows of one fused product (q_src, src_stride): q (every dim) and the bf16 caches bit for bit
     * those of the run above */
    const int W = (H + 2 * KV) * hd;
    uint16_t *t = malloc((size_t)T * W * 2), *q2 = malloc(nq * 2), *kc2 = malloc(ncache * 2), *vc2 = malloc(ncache * 2);
    for (int i = 0; i < T; i++) {
        memcpy(t + (size_t)i * W, q + (size_t)i * H * hd, (size_t)H * hd * 2);
        memcpy(t + (size_t)i * W + H * hd, k + (size_t)i * KV * hd, (size_t)KV * hd * 2);
        memcpy(t + (size_t)i * W + (H + KV) * hd, v + (size_t)i * KV * hd, (size_t)KV * hd * 2);
    }
    uint16_t *d_t = tb_upload(t, (size_t)T * W * 2);
    tb_poison(d_q, nq * 2);
    tb_poison(d_kc, ncache * 2);
    tb_poison(d_vc, ncache * 2);
    tm_cuda_rope_args af = a;
    af.kv_fp8 = false;
    af.q_src = d_t;
    af.k = d_t + H * hd;
    af.v = d_t + (H + KV) * hd;
    af.src_stride = W;
    set_version(version);
    TB_RUN(tm_cuda_rope_kv_write(&af, 0));
    set_version(2);
    tb_download(q2, d_q, nq * 2);
    tb_download(kc2, d_kc, ncache * 2);
    tb_download(vc2, d_vc, ncache * 2);
    size_t badf = 0;
    for (size_t i = 0; i < nq; i++) badf += q2[i] != q_out[i];
    for (size_t i = 0; i < ncache; i++) badf += (kc2[i] != kc[i]) + (vc2[i] != vc[i]);
    snprintf(name, sizeof name, "v%d %s fused q|k|v rows", version, c->name);
    tb_result("rope_kv_write", name, (double)badf, 0.0, 0, 0, 0, 'm');

    /* k_out, v_out: the fused rows themselves (in place) get what each token's cache slot holds (bf16, or the e4m3
     * byte widened), bit for bit; a padding token's rows stay as they were */
    uint16_t *t2 = malloc((size_t)T * W * 2), *kcx = malloc(ncache * 2), *vcx = malloc(ncache * 2);
    for (int f8 = 0; f8 < 2; f8++) {
        TB_CHECK(cudaMemcpy(d_t, t, (size_t)T * W * 2, cudaMemcpyHostToDevice));
        tb_poison(d_q, nq * 2);
        tb_poison(d_kc, ncache * 2);
        tb_poison(d_vc, ncache * 2);
        tm_cuda_rope_args ao = af;
        ao.kv_fp8 = f8 != 0;
        ao.k_out = d_t + H * hd;
        ao.v_out = d_t + (H + KV) * hd;
        set_version(version);
        TB_RUN(tm_cuda_rope_kv_write(&ao, 0));
        set_version(2);
        tb_download(t2, d_t, (size_t)T * W * 2);
        tb_download(kcx, d_kc, ncache * (f8 ? 1 : 2));
        tb_download(vcx, d_vc, ncache * (f8 ? 1 : 2));
        size_t bado = 0;
        for (int i = 0; i < T; i++)
            for (int h = 0; h < KV; h++) {
                const size_t ro = (size_t)i * W + (size_t)H * hd + (size_t)h * hd, vo = ro + (size_t)KV * hd;
                const size_t co = slot[i] < 0 ? 0
                                              : (((size_t)(slot[i] / c->block_size) * KV + h) * c->block_size +
                                                 (size_t)(slot[i] % c->block_size)) * hd;
                for (int d = 0; d < hd; d++) {
                    uint16_t ek = t[ro + d], ev = t[vo + d];
                    if (slot[i] >= 0 && f8) {
                        ek = tb_f32_to_bf16(tm_fp8_to_f32(((const uint8_t *)kcx)[co + d]));
                        ev = tb_f32_to_bf16(tm_fp8_to_f32(((const uint8_t *)vcx)[co + d]));
                    } else if (slot[i] >= 0) {
                        ek = kcx[co + d];
                        ev = vcx[co + d];
                    }
                    bado += (t2[ro + d] != ek) + (t2[vo + d] != ev);
                }
            }
        snprintf(name, sizeof name, "v%d %s k/v rows out%s", version, c->name, f8 ? " fp8" : "");
        tb_result("rope_kv_write", name, (double)bado, 0.0, 0, 0, 0, 'm');
    }
    free(t2);
    free(kcx);
    free(vcx);
    cudaFree(d_t);
    free(t);
    free(q2);
    free(kc2);
    free(vc2);

    cudaFree(d_q);
    cudaFree(d_k);
    cudaFree(d_v);
    cudaFree(d_kc);
    cudaFree(d_vc);
    cudaFree(d_inv);
    cudaFree(d_pos);
    cudaFree(d_slot);
    free(q);
    free(k);
    free(v);
    free(q_out);
    free(kc);
    free(vc);
    free(inv);
    free(pos);
    free(slot);
    free(perm);
    free(owner);
    free(ref_q);
    free(got_q);
    free(ref_k);
    free(got_k);
    free(row);
}

static void run_rope(void *p) { TB_CHECK(tm_cuda_rope_kv_write((const tm_cuda_rope_args *)p, 0)); }

/* prefill / decode timing: consecutive slots, positions 0..n-1 (q is rotated again on each repeat: harmless) */
static void time_cfg(const char *label, bool neox, int T, int H, int KV, int hd, int version) {
    const int bs = 16, n_blocks = (T + bs - 1) / bs;
    size_t nq = (size_t)T * H * hd, nk = (size_t)T * KV * hd, ncache = (size_t)n_blocks * bs * KV * hd;
    float *inv = malloc(hd / 2 * sizeof(float));
    int32_t *pos = malloc(T * sizeof(int32_t));
    int64_t *slot = malloc(T * sizeof(int64_t));
    make_inv_freq(inv, hd);
    for (int t = 0; t < T; t++) pos[t] = t, slot[t] = t;
    uint16_t *d_q = tb_dev(nq * 2), *d_k = tb_dev(nk * 2), *d_v = tb_dev(nk * 2);
    uint16_t *d_kc = tb_dev(ncache * 2), *d_vc = tb_dev(ncache * 2);
    TB_CHECK(cudaMemset(d_q, 0x3c, nq * 2));
    TB_CHECK(cudaMemset(d_k, 0x3c, nk * 2));
    TB_CHECK(cudaMemset(d_v, 0x3c, nk * 2));
    float *d_inv = tb_upload(inv, hd / 2 * sizeof(float));
    int32_t *d_pos = tb_upload(pos, T * sizeof(int32_t));
    int64_t *d_slot = tb_upload(slot, T * sizeof(int64_t));
    tm_cuda_rope_args a = {T, H, KV, hd, hd, bs, neox, d_inv, d_pos, d_slot, d_q, d_k, d_v, d_kc, d_vc, false, NULL, 0, NULL, NULL};
    set_version(version);
    double us = tb_time_us(run_rope, &a, 3, T >= 1024 ? 50 : 200);
    set_version(2);
    /* q read + write, k read + cache write, v read + cache write, positions and slots */
    double bytes = 2.0 * nq * 2 + 2.0 * nk * 2 * 2 + T * 12.0 + hd / 2 * 4.0;
    char name[96];
    snprintf(name, sizeof name, "v%d %s T=%d", version, label, T);
    tb_result("rope_kv_write", name, 0, 0, us, bytes, 0, 'm');
    cudaFree(d_q);
    cudaFree(d_k);
    cudaFree(d_v);
    cudaFree(d_kc);
    cudaFree(d_vc);
    cudaFree(d_inv);
    cudaFree(d_pos);
    cudaFree(d_slot);
    free(inv);
    free(pos);
    free(slot);
}

int main(void) {
    tb_seed();
    static const rope_cfg cfgs[] = {
        {"llama-8B", false, 32, 8, 128, 128, 37, 16, 12, true},
        {"neox-1B", true, 32, 8, 64, 64, 5, 16, 4, true},
        {"llama-partial-gqa3", false, 12, 4, 128, 64, 19, 8, 8, true},
        {"neox-partial", true, 8, 2, 64, 32, 7, 4, 5, false},
        {"neox-rd24-scalar", true, 4, 1, 40, 24, 6, 4, 3, true},
        {"llama-hd36-scalar", false, 6, 2, 36, 36, 9, 4, 4, false},
        {"llama-decode-1", false, 32, 8, 128, 128, 1, 16, 3, false},
        {"llama-mha", false, 4, 4, 64, 64, 11, 16, 2, false},
        {"no-rope", false, 2, 1, 16, 0, 3, 4, 2, false},
        {"neox-hd128-ratio8", true, 64, 8, 128, 128, 13, 32, 3, true},
    };
    for (int v = 1; v <= 2; v++)
        for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) check_cfg(&cfgs[i], v);
    if (getenv("TB_CHECK_ONLY")) return tb_finish("tb_rope"); /* correctness only, no timing */
    for (int v = 2; v >= 1; v--) time_cfg("8B-prefill", false, 4096, 32, 8, 128, v);
    time_cfg("1B-prefill", false, 4096, 32, 8, 64, 2);
    time_cfg("8B-prefill-neox", true, 4096, 32, 8, 128, 2);
    time_cfg("8B-decode", false, 64, 32, 8, 128, 2);
    time_cfg("8B-decode", false, 1, 32, 8, 128, 2);
    return tb_finish("tb_rope");
}
