/* TorchTPU runtime: status objects.
 *
 * Every fallible runtime function returns a tpu_status_t. NULL (TPU_OK) means
 * success; anything else is a heap object carrying a code and a message that
 * names the object and the offending values. The caller owns a returned status
 * and must either propagate it or release it with tpu_status_free().
 */
#ifndef TPU_STATUS_H_
#define TPU_STATUS_H_

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpu_status_code {
  TPU_CODE_OK = 0,
  TPU_CODE_INVALID_ARGUMENT = 1,  /* bad shapes, dtypes, values -> RuntimeError/ValueError */
  TPU_CODE_OUT_OF_RANGE = 2,      /* index out of bounds -> IndexError */
  TPU_CODE_RESOURCE_EXHAUSTED = 3,/* device memory exhausted -> torch.OutOfMemoryError */
  TPU_CODE_UNIMPLEMENTED = 4,     /* op or dtype not implemented -> NotImplementedError */
  TPU_CODE_INTERNAL = 5,          /* runtime bug or system failure -> RuntimeError */
  TPU_CODE_LINALG = 6,            /* a matrix the algorithm cannot take (singular, not
                                     positive-definite) -> torch.linalg.LinAlgError */
} tpu_status_code_t;

typedef struct tpu_status_s* tpu_status_t;

#define TPU_OK ((tpu_status_t)0)

#if defined(__GNUC__)
#define TPU_MUST_USE __attribute__((warn_unused_result))
#define TPU_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TPU_MUST_USE
#define TPU_PRINTF(a, b)
#endif

/* Creates a status with a printf-style message. Never returns NULL for a
 * non-OK code (falls back to a static out-of-memory status). */
tpu_status_t tpu_status_make(tpu_status_code_t code, const char* fmt, ...)
    TPU_PRINTF(2, 3);

/* Prepends "prefix: " to the message of st (st must not be TPU_OK). */
tpu_status_t tpu_status_annotate(tpu_status_t st, const char* prefix);

tpu_status_code_t tpu_status_code(tpu_status_t st);
/* Message owned by st; "" for TPU_OK. */
const char* tpu_status_message(tpu_status_t st);
void tpu_status_free(tpu_status_t st);

#define TPU_RETURN_IF_ERROR(expr)          \
  do {                                     \
    tpu_status_t tpu_st_ = (expr);         \
    if (tpu_st_ != TPU_OK) return tpu_st_; \
  } while (0)

#define TPU_ERR(code, ...) tpu_status_make(TPU_CODE_##code, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif /* TPU_STATUS_H_ */
