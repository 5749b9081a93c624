/* tm_cli.h -- strict number parsing for the command line: the whole string, in range, or false. */
#ifndef TM_CLI_H
#define TM_CLI_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* a base-10 integer in [lo, hi] */
static inline bool tm_cli_parse_ll(const char *s, long long lo, long long hi, long long *out) {
    if (!s || !*s) return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static inline bool tm_cli_parse_i32(const char *s, int32_t lo, int32_t hi, int32_t *out) {
    long long v;
    if (!tm_cli_parse_ll(s, lo, hi, &v)) return false;
    *out = (int32_t)v;
    return true;
}

static inline bool tm_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    long long v;
    if (!tm_cli_parse_ll(s, lo, hi, &v)) return false;
    *out = (int64_t)v;
    return true;
}

#endif /* TM_CLI_H */
