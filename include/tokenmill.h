/* tokenmill.h -- the public C API of tokenmill (prefix tm_). The only header a library user includes. */
#ifndef TOKENMILL_H
#define TOKENMILL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes ---------------------------------------------------------------------------- */
typedef enum tm_status {
    TM_OK = 0,
    TM_ERR_IO,          /* file or OS error */
    TM_ERR_FORMAT,      /* malformed input file or data */
    TM_ERR_NOMEM,       /* allocation failed */
    TM_ERR_INVALID,     /* bad argument or value */
    TM_ERR_UNSUPPORTED, /* valid but not supported (architecture, tensor type, template) */
    TM_ERR_RANGE,       /* value out of range (prompt longer than the context, ...) */
    TM_ERR_INTERNAL,    /* a bug */
} tm_status;

/* An error: a code and one human-readable line. Every fallible call takes a `tm_error *` (may be NULL). */
typedef struct tm_error {
    tm_status code;
    char msg[512];
} tm_error;

const char *tm_status_name(tm_status s);

#ifdef __cplusplus
}
#endif
#endif /* TOKENMILL_H */
