/* tm_gguf_print.c -- human-readable dump of a GGUF file's metadata and tensor table (`tokenmill inspect`). */
#include "gguf/tm_gguf.h"

#include <inttypes.h>

#define PRINT_STR_CHARS 120    /* a string value is cut after this many characters */
#define PRINT_ARR_ELEMS 8      /* an array shows at most this many elements, then its count */
#define PRINT_ELEM_CHARS 32    /* a string array element is cut after this many characters */

static void print_scalar(FILE *f, tm_gguf_type t, uint64_t u, int64_t i, double d) {
    switch (t) {
    case TM_GGUF_BOOL: fputs(u ? "true" : "false", f); break;
    case TM_GGUF_U8: case TM_GGUF_U16: case TM_GGUF_U32: case TM_GGUF_U64: fprintf(f, "%" PRIu64, u); break;
    case TM_GGUF_I8: case TM_GGUF_I16: case TM_GGUF_I32: case TM_GGUF_I64: fprintf(f, "%" PRId64, i); break;
    case TM_GGUF_F32: fprintf(f, "%.9g", d); break;
    case TM_GGUF_F64: fprintf(f, "%.17g", d); break;
    default: fputs("?", f); break;
    }
}

static void print_string(FILE *f, tm_str s, size_t max_chars) {
    char buf[4 * PRINT_STR_CHARS + 16];
    fprintf(f, "\"%s\"", tm_str_escape(buf, sizeof buf, s, max_chars));
    if (s.len > max_chars) fprintf(f, " (%" PRIu64 " bytes)", s.len);
}

static void print_array(FILE *f, const tm_gguf_kv *kv) {
    uint64_t n = kv->v.arr.n;
    uint64_t shown = n < PRINT_ARR_ELEMS ? n : PRINT_ARR_ELEMS;
    fprintf(f, "[%s x %" PRIu64 "] [", tm_gguf_type_name(kv->v.arr.type), n);
    for (uint64_t i = 0; i < shown; i++) {
        if (i) fputs(", ", f);
        if (kv->v.arr.type == TM_GGUF_STRING) {
            char buf[4 * PRINT_ELEM_CHARS + 16];
            fprintf(f, "\"%s\"", tm_str_escape(buf, sizeof buf, kv->v.arr.strs[i], PRINT_ELEM_CHARS));
        } else {
            int64_t iv = 0;
            double dv = 0;
            uint64_t uv = 0;
            if (tm_gguf_arr_int(kv, i, &iv)) uv = (uint64_t)iv;
            else if (kv->v.arr.type == TM_GGUF_U64) memcpy(&uv, (const uint8_t *)kv->v.arr.data + i * 8, 8);
            tm_gguf_arr_float(kv, i, &dv);
            print_scalar(f, kv->v.arr.type, uv, iv, dv);
        }
    }
    if (shown < n) fprintf(f, ", ... %" PRIu64 " more", n - shown);
    fputc(']', f);
}

static void print_dims(FILE *f, const tm_gguf_tensor *t) {
    char buf[96];
    size_t o = 0;
    for (uint32_t d = 0; d < t->n_dims && d < 4; d++) {
        int k = snprintf(buf + o, sizeof buf - o, d ? " x %" PRIu64 : "%" PRIu64, t->ne[d]);
        if (k < 0 || (size_t)k >= sizeof buf - o) break;
        o += (size_t)k;
    }
    buf[o] = '\0';
    fprintf(f, "%-24s", buf);
}

void tm_gguf_print(const tm_gguf *g, FILE *f, bool show_tensors) {
    if (!g || !f) return;
    uint64_t total = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) total += g->tensors[i].nbytes;
    fprintf(f, "GGUF v%" PRIu32 ": %" PRIu64 " bytes, %" PRIu64 " metadata keys, %" PRIu64 " tensors (%" PRIu64
            " bytes of data at offset %" PRIu64 ", alignment %" PRIu64 ")\n",
            g->version, g->size, g->n_kv, g->n_tensors, total, g->data_offset, g->alignment);

    fprintf(f, "metadata:\n");
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const tm_gguf_kv *kv = &g->kv[i];
        char key[4 * 96 + 16];
        fprintf(f, "  %s = ", tm_str_escape(key, sizeof key, kv->key, 96));
        switch (kv->type) {
        case TM_GGUF_STRING: print_string(f, kv->v.s, PRINT_STR_CHARS); break;
        case TM_GGUF_ARRAY: print_array(f, kv); break;
        default: print_scalar(f, kv->type, kv->v.u, kv->v.i, kv->v.f); break;
        }
        fputc('\n', f);
    }

    if (!show_tensors) return;
    fprintf(f, "tensors:\n");
    fprintf(f, "  %5s  %-48s %-6s %-24s %12s %12s\n", "#", "name", "type", "dims", "bytes", "offset");
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tm_gguf_tensor *t = &g->tensors[i];
        char name[4 * 64 + 16];
        fprintf(f, "  %5" PRIu64 "  %-48s %-6s ", i, tm_str_escape(name, sizeof name, t->name, 64),
                tm_dtype_name(t->type));
        print_dims(f, t);
        fprintf(f, " %12" PRIu64 " %12" PRIu64 "\n", t->nbytes, t->offset);
    }
}
