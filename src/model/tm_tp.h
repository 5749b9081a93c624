/* tm_tp.h -- tensor parallelism: Megatron-style shard plans of a model over N ranks, and rank shard models. */
#ifndef TM_TP_H
#define TM_TP_H

#include "model/tm_model.h"

/* The split (Megatron-LM): rank r of N holds
 *   query heads [r*H/N, (r+1)*H/N) and KV heads [r*KV/N, (r+1)*KV/N) (H % N == 0, KV % N == 0; the GQA group of
 *   each local query head is then local too): ROW slices of wq, wk, wv (rows = heads x head_dim) and the matching
 *   ranges of bq, bk, bv;
 *   ffn columns [r*F/N, (r+1)*F/N): ROW slices of w_gate and w_up;
 *   COLUMN slices of wo (cols = heads x head_dim) and w_down (cols = ffn): their input dimension is split, so each
 *   rank's product is a partial sum of the full (n, dim) output -- an all-reduce (sum) after wo and after w_down,
 *   before the residual add, gives the unsharded result;
 *   norms, token embedding and output projection replicated.
 * A column slice of a block-quantized matrix must cut at block boundaries: its width must be a multiple of the
 * type's block (32 for Q8_0/Q4_0/Q4_1, 256 for Q4_K/Q6_K). */

typedef enum tm_tp_split {
    TM_TP_REPLICATED = 0, /* the whole tensor */
    TM_TP_ROWS = 1,       /* rows [begin, begin + count) */
    TM_TP_COLS = 2,       /* columns [begin, begin + count) of every row */
} tm_tp_split;

typedef struct tm_tp_slice {
    tm_tp_split split;
    int64_t begin, count; /* rows or columns (elements); REPLICATED: 0 and the row count */
} tm_tp_slice;

/* The tensors of a model, as far as sharding goes. Biases are (1, n) vectors, so their range is a column slice. */
typedef enum tm_tp_tensor {
    TM_TP_TOK_EMBD = 0,
    TM_TP_OUTPUT_NORM,
    TM_TP_OUTPUT,
    TM_TP_ATTN_NORM,
    TM_TP_WQ,
    TM_TP_WK,
    TM_TP_WV,
    TM_TP_BQ,
    TM_TP_BK,
    TM_TP_BV,
    TM_TP_WO,
    TM_TP_FFN_NORM,
    TM_TP_W_GATE,
    TM_TP_W_UP,
    TM_TP_W_DOWN,
    TM_TP_TENSOR_COUNT,
} tm_tp_tensor;

/* Rank `rank`'s share of a model split over n_ranks. */
typedef struct tm_tp_plan {
    int32_t n_ranks, rank;
    int32_t head_dim;
    int32_t q_head_begin, n_q_heads;   /* local query heads */
    int32_t kv_head_begin, n_kv_heads; /* local KV heads (and the rank's KV cache heads) */
    int32_t ffn_begin, ffn_dim;        /* local ffn columns */
} tm_tp_plan;

/* Whether m can be split over n_ranks: head counts and ffn divisible, every column slice of a quantized wo/w_down
 * block-aligned, weights on the host. TM_ERR_UNSUPPORTED with the numbers otherwise. */
tm_status tm_tp_check(const tm_model *m, int32_t n_ranks, tm_error *err);
/* The plan of one rank (runs tm_tp_check). */
tm_status tm_tp_plan_make(const tm_model *m, int32_t n_ranks, int32_t rank, tm_tp_plan *out, tm_error *err);
/* The slice of tensor t (shaped like w: biases are (1, n)) that the plan's rank holds. */
tm_tp_slice tm_tp_slice_of(const tm_tp_plan *p, tm_tp_tensor t, const tm_weight *w);
/* Bytes of slice s of w; 0 when the slice is out of range or a column slice is not block-aligned. */
uint64_t tm_tp_slice_bytes(const tm_weight *w, tm_tp_slice s);
/* Copy slice s of w (host memory) into dst (dst_bytes >= tm_tp_slice_bytes), row-major like a weight of the slice's
 * shape. */
tm_status tm_tp_slice_copy(const tm_weight *w, tm_tp_slice s, void *dst, uint64_t dst_bytes, tm_error *err);

/* Rank `rank`'s shard of m as a model of its own: same hyper-parameters except n_heads, n_kv_heads and ffn_dim
 * divided by n_ranks; every weight (sliced or replicated) copied into one allocation it owns (dummy_mem); its own
 * copies of the name, chat template and rope table; no tokenizer (tok NULL: the scheduling rank tokenizes) and no
 * GGUF. Tied embeddings stay tied. Free with tm_tp_shard_free (or tm_model_free). Running tm_model_forward on a
 * shard alone is NOT the model: the wo and w_down products are partial sums that need the all-reduce. */
tm_status tm_tp_shard_model(const tm_model *m, int32_t n_ranks, int32_t rank, tm_model **out, tm_error *err);
void tm_tp_shard_free(tm_model *shard);

/* A rank's KV cache geometry: full's, with the rank's KV heads. */
tm_kv_cfg tm_tp_kv_cfg(const tm_tp_plan *p, const tm_kv_cfg *full);
/* Bytes of KV cache one token takes on one rank (K and V, every layer) for elements of elem_bytes. */
uint64_t tm_tp_kv_bytes_per_token(const tm_model *m, const tm_tp_plan *p, uint32_t elem_bytes);

/* ---- bootstrap of a multi-node run ---------------------------------------------------------------
 * Rank 0 makes the collective library's id (NCCL: the 128-byte ncclUniqueId) and hands it to the other ranks over
 * TCP: it listens, each other rank connects and says hello (magic, n_ranks, its rank), rank 0 checks the hello
 * (same n_ranks, a rank in 1..n_ranks-1 not seen before) and answers with the id. Plain bytes, no CUDA: the same
 * exchange serves any library. A peer that never comes, or a hello that does not match, is an error (with the
 * numbers) rather than a hang: every wait has a deadline. */
typedef struct tm_tp_listener {
    int fd;   /* listening socket, -1 when closed */
    int port; /* the bound port (the one chosen by the kernel when 0 was asked) */
} tm_tp_listener;

/* Listen on host:port (host NULL: every address; port 0: any free port). */
tm_status tm_tp_listen(const char *host, int port, tm_tp_listener *out, tm_error *err);
/* Accept the n_ranks - 1 other ranks within timeout_ms and send each the id (id_len bytes). */
tm_status tm_tp_serve_id(tm_tp_listener *l, int32_t n_ranks, const void *id, size_t id_len, int timeout_ms,
                         tm_error *err);
void tm_tp_listener_close(tm_tp_listener *l);
/* Rank `rank` (1..n_ranks-1): connect to rank 0 at host:port (retrying until it listens, within timeout_ms), say
 * hello and receive the id (exactly id_len bytes). */
tm_status tm_tp_fetch_id(const char *host, int port, int32_t n_ranks, int32_t rank, void *id, size_t id_len,
                         int timeout_ms, tm_error *err);

#endif /* TM_TP_H */
