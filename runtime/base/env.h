/* Environment variables: the one place the runtime reads them.
 *
 * Every reader treats an unset and an empty variable alike (the default). A
 * value that does not parse also gives the default. Thread-safe as far as
 * getenv is (the runtime never sets variables).
 */
#ifndef TPU_BASE_ENV_H_
#define TPU_BASE_ENV_H_

#include <stdbool.h>
#include <stdint.h>

#include "tpu/status.h"

/* The variable's value, or NULL when it is unset or empty. */
const char* tpu_env_str(const char* name);
/* A decimal integer, optionally followed by K, M or G (binary multiples, for
 * byte sizes); `dflt` when unset, empty or not a number. */
int64_t tpu_env_int(const char* name, int64_t dflt);
/* A decimal number (strtod); `dflt` when unset, empty or not a number. */
double tpu_env_double(const char* name, double dflt);
/* False for "0" and "false", true for any other value; `dflt` when unset or
 * empty. */
bool tpu_env_bool(const char* name, bool dflt);

/* TORCH_TPU_VISIBLE_DEVICES ("1", "0,2"): which of a target's `total`
 * devices this process uses, in that order, as its devices 0, 1, ...
 * (out_map[i] = the target's index of device i; total entries at most).
 * Unset: all of them. An index out of range, repeated or not a number fails,
 * naming the value. */
tpu_status_t tpu_env_visible_devices(int total, int* out_map, int* out_n) TPU_MUST_USE;

#endif /* TPU_BASE_ENV_H_ */
