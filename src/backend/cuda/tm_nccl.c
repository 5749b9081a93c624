/* tm_nccl.c -- NCCL for tensor parallelism: loaded at run time; communicators, all-reduce, broadcast. */
#include "backend/cuda/tm_nccl.h"

#include <dlfcn.h>
#include <nccl.h>
#include <stdlib.h>

#include "model/tm_tp.h"

_Static_assert(TM_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "NCCL unique id size");
_Static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES, "NCCL unique id layout");

struct tm_nccl {
    void *lib;
    int version;
    ncclResult_t (*get_version)(int *);
    const char *(*error_string)(ncclResult_t);
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*comm_init_all)(ncclComm_t *, int, const int *);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*comm_abort)(ncclComm_t);
    ncclResult_t (*comm_async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
};

struct tm_nccl_comm {
    tm_nccl *lib;     /* borrowed: outlives the communicator */
    ncclComm_t comm;
    int32_t rank, n_ranks, device;
    bool failed;      /* an asynchronous error was seen: free aborts instead of a destroy that could wait forever */
};

static tm_status nccl_fail(const tm_nccl *n, ncclResult_t r, const char *what, tm_error *err) {
    return tm_err(err, TM_ERR_DEVICE, "NCCL %s: %s (%d)", what, n->error_string ? n->error_string(r) : "error", (int)r);
}

tm_status tm_nccl_open(tm_nccl **out, tm_error *err) {
    *out = NULL;
    /* before the library reads its environment: no NVLink SHARP / multicast */
    if (setenv("NCCL_NVLS_ENABLE", "0", 1) != 0) return tm_err(err, TM_ERR_IO, "cannot set NCCL_NVLS_ENABLE");
    tm_nccl *n = tm_calloc(1, sizeof *n);
    if (!n) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    const char *names[] = {"libnccl.so.2", "libnccl.so", NULL};
    for (int i = 0; names[i] && !n->lib; i++) n->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!n->lib) {
        tm_status s = tm_err(err, TM_ERR_DEVICE, "cannot load NCCL (libnccl.so.2): %s", dlerror());
        free(n);
        return s;
    }
#define SYM(field, name)                                                                                      \
    do {                                                                                                      \
        *(void **)&n->field = dlsym(n->lib, name);                                                            \
        if (!n->field) {                                                                                      \
            tm_status s_ = tm_err(err, TM_ERR_DEVICE, "NCCL lacks %s", name);                                 \
            tm_nccl_close(n);                                                                                 \
            return s_;                                                                                        \
        }                                                                                                     \
    } while (0)
    SYM(get_version, "ncclGetVersion");
    SYM(error_string, "ncclGetErrorString");
    SYM(get_unique_id, "ncclGetUniqueId");
    SYM(comm_init_rank, "ncclCommInitRank");
    SYM(comm_init_all, "ncclCommInitAll");
    SYM(comm_destroy, "ncclCommDestroy");
    SYM(comm_abort, "ncclCommAbort");
    SYM(comm_async_error, "ncclCommGetAsyncError");
    SYM(all_reduce, "ncclAllReduce");
    SYM(broadcast, "ncclBroadcast");
    SYM(group_start, "ncclGroupStart");
    SYM(group_end, "ncclGroupEnd");
#undef SYM
    ncclResult_t r = n->get_version(&n->version);
    if (r != ncclSuccess) {
        tm_status s = nccl_fail(n, r, "version", err);
        tm_nccl_close(n);
        return s;
    }
    if (n->version < 21800) { /* ncclBfloat16 and ncclCommGetAsyncError everywhere; 2.18 is old enough */
        tm_status s = tm_err(err, TM_ERR_UNSUPPORTED, "NCCL %d is too old (2.18 or newer needed)", n->version);
        tm_nccl_close(n);
        return s;
    }
    *out = n;
    return TM_OK;
}

void tm_nccl_close(tm_nccl *n) {
    if (!n) return;
    /* the library stays mapped (RTLD_NODELETE): NCCL's service threads can outlive the communicators, and
     * unmapping their code under them crashes the process at exit */
    if (n->lib) dlclose(n->lib);
    free(n);
}

int tm_nccl_version(const tm_nccl *n) { return n->version; }

static tm_nccl_comm *comm_new(tm_nccl *n, int32_t rank, int32_t n_ranks, int32_t device) {
    tm_nccl_comm *c = tm_calloc(1, sizeof *c);
    if (!c) return NULL;
    c->lib = n;
    c->rank = rank;
    c->n_ranks = n_ranks;
    c->device = device;
    return c;
}

tm_status tm_nccl_init_all(tm_nccl *n, int32_t count, const int32_t *devs, tm_nccl_comm **comms, tm_error *err) {
    if (count < 1 || count > 1024) return tm_err(err, TM_ERR_INVALID, "bad number of devices %d", count);
    for (int32_t i = 0; i < count; i++) comms[i] = NULL;
    ncclComm_t *raw = tm_calloc((size_t)count, sizeof *raw); /* (count) */
    int *dl = tm_malloc_array((size_t)count, sizeof *dl);    /* (count) */
    tm_status s = TM_OK;
    if (!raw || !dl) {
        s = tm_err(err, TM_ERR_NOMEM, "out of memory");
        goto cleanup;
    }
    for (int32_t i = 0; i < count; i++) dl[i] = devs[i];
    ncclResult_t r = n->comm_init_all(raw, count, dl);
    if (r != ncclSuccess) {
        s = nccl_fail(n, r, "communicator init (one process)", err);
        goto cleanup;
    }
    for (int32_t i = 0; i < count; i++) {
        if (!(comms[i] = comm_new(n, i, count, devs[i]))) {
            s = tm_err(err, TM_ERR_NOMEM, "out of memory");
            break;
        }
        comms[i]->comm = raw[i];
        raw[i] = NULL;
    }
    if (s != TM_OK) {
        for (int32_t i = 0; i < count; i++) {
            tm_nccl_comm_free(comms[i]);
            comms[i] = NULL;
            if (raw[i]) n->comm_destroy(raw[i]);
        }
    }
cleanup:
    free(raw);
    free(dl);
    return s;
}

tm_status tm_nccl_unique_id(tm_nccl *n, uint8_t id[TM_NCCL_ID_BYTES], tm_error *err) {
    ncclUniqueId u;
    ncclResult_t r = n->get_unique_id(&u);
    if (r != ncclSuccess) return nccl_fail(n, r, "unique id", err);
    memcpy(id, u.internal, TM_NCCL_ID_BYTES);
    return TM_OK;
}

tm_status tm_nccl_init_rank(tm_nccl *n, int32_t n_ranks, int32_t rank, int32_t device,
                            const uint8_t id[TM_NCCL_ID_BYTES], tm_nccl_comm **out, tm_error *err) {
    *out = NULL;
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks)
        return tm_err(err, TM_ERR_INVALID, "rank %d of %d ranks is out of range", rank, n_ranks);
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return tm_err(err, TM_ERR_DEVICE, "rank %d: cannot use device %d: %s", rank, device, cudaGetErrorString(ce));
    tm_nccl_comm *c = comm_new(n, rank, n_ranks, device);
    if (!c) return tm_err(err, TM_ERR_NOMEM, "out of memory");
    ncclUniqueId u;
    memcpy(u.internal, id, TM_NCCL_ID_BYTES);
    ncclResult_t r = n->comm_init_rank(&c->comm, n_ranks, u, rank);
    if (r != ncclSuccess) {
        tm_status s = nccl_fail(n, r, "communicator init (rank)", err);
        free(c);
        return s;
    }
    *out = c;
    return TM_OK;
}

tm_status tm_nccl_init_tcp(tm_nccl *n, int32_t n_ranks, int32_t rank, int32_t device, const char *host, int port,
                           int timeout_ms, tm_nccl_comm **out, tm_error *err) {
    *out = NULL;
    uint8_t id[TM_NCCL_ID_BYTES];
    tm_status s;
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks)
        return tm_err(err, TM_ERR_INVALID, "rank %d of %d ranks is out of range", rank, n_ranks);
    if (rank == 0) {
        tm_tp_listener l;
        if ((s = tm_nccl_unique_id(n, id, err)) != TM_OK) return s;
        if ((s = tm_tp_listen(host, port, &l, err)) != TM_OK) return s;
        s = tm_tp_serve_id(&l, n_ranks, id, sizeof id, timeout_ms, err);
        tm_tp_listener_close(&l);
    } else {
        s = tm_tp_fetch_id(host, port, n_ranks, rank, id, sizeof id, timeout_ms, err);
    }
    if (s != TM_OK) return s;
    return tm_nccl_init_rank(n, n_ranks, rank, device, id, out, err);
}

void tm_nccl_comm_free(tm_nccl_comm *c) {
    if (!c) return;
    if (c->comm) (c->failed ? c->lib->comm_abort : c->lib->comm_destroy)(c->comm);
    free(c);
}

int32_t tm_nccl_comm_rank(const tm_nccl_comm *c) { return c->rank; }
int32_t tm_nccl_comm_size(const tm_nccl_comm *c) { return c->n_ranks; }

tm_status tm_nccl_group_start(tm_nccl *n, tm_error *err) {
    ncclResult_t r = n->group_start();
    return r == ncclSuccess ? TM_OK : nccl_fail(n, r, "group start", err);
}

tm_status tm_nccl_group_end(tm_nccl *n, tm_error *err) {
    ncclResult_t r = n->group_end();
    return r == ncclSuccess ? TM_OK : nccl_fail(n, r, "group end", err);
}

tm_status tm_nccl_all_reduce_sum(tm_nccl_comm *c, const void *send, void *recv, size_t count, tm_nccl_type type,
                                 cudaStream_t stream, tm_error *err) {
    ncclDataType_t dt = type == TM_NCCL_BF16 ? ncclBfloat16 : ncclFloat32;
    if (type != TM_NCCL_BF16 && type != TM_NCCL_F32) return tm_err(err, TM_ERR_INVALID, "bad all-reduce type %d", type);
    ncclResult_t r = c->lib->all_reduce(send, recv, count, dt, ncclSum, c->comm, stream);
    return r == ncclSuccess ? TM_OK : nccl_fail(c->lib, r, "all-reduce", err);
}

tm_status tm_nccl_broadcast(tm_nccl_comm *c, void *buf, size_t bytes, int32_t root, cudaStream_t stream,
                            tm_error *err) {
    if (root < 0 || root >= c->n_ranks) return tm_err(err, TM_ERR_INVALID, "broadcast root %d out of range", root);
    ncclResult_t r = c->lib->broadcast(buf, buf, bytes, ncclUint8, root, c->comm, stream);
    return r == ncclSuccess ? TM_OK : nccl_fail(c->lib, r, "broadcast", err);
}

tm_status tm_nccl_check(tm_nccl_comm *c, tm_error *err) {
    ncclResult_t a = ncclSuccess;
    ncclResult_t r = c->lib->comm_async_error(c->comm, &a);
    if (r != ncclSuccess) return nccl_fail(c->lib, r, "async error query", err);
    if (a != ncclSuccess && a != ncclInProgress) {
        c->failed = true;
        return nccl_fail(c->lib, a, "rank failed asynchronously", err);
    }
    return TM_OK;
}
