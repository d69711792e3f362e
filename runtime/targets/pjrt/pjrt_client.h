/* The pjrt target's link to a PJRT C API plugin (libtpu, the XLA CPU plugin,
 * the CUDA plugin): loading it, its client and devices, buffers, compiling
 * StableHLO text, running executables. Every PJRT error comes back as a
 * tpu_status_t carrying the plugin's message; nothing here aborts.
 *
 * Thread-safety: a tpu_pjrt_t may be used from several threads (the PJRT
 * client is thread-safe); open and close are not concurrent with other use.
 */
#ifndef TPU_TARGETS_PJRT_CLIENT_H_
#define TPU_TARGETS_PJRT_CLIENT_H_

#include <stddef.h>
#include <stdint.h>

#include "tpu/status.h"
#include "tpu/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpu_pjrt tpu_pjrt_t;
typedef struct tpu_pjrt_buffer tpu_pjrt_buffer_t; /* one device buffer */
typedef struct tpu_pjrt_exe tpu_pjrt_exe_t;       /* a loaded executable */

/* True when this build has the PJRT C API (the header was found at build
 * time); without it tpu_pjrt_open says so. */
bool tpu_pjrt_available(void);

/* dlopens the plugin at `path`, checks its API version, initializes it and
 * creates a client. The plugin's start-up log lines (absl, to stderr) are
 * captured: on failure they end the error message, on success they are
 * dropped unless TORCH_TPU_PJRT_VERBOSE=1. */
tpu_status_t tpu_pjrt_open(const char* path, tpu_pjrt_t** out) TPU_MUST_USE;
/* Destroys the client. The plugin stays loaded (plugins are not made to be
 * unloaded). NULL is ignored. */
void tpu_pjrt_close(tpu_pjrt_t* p);

const char* tpu_pjrt_path(const tpu_pjrt_t* p);
/* "cpu", "tpu", "cuda", ... and the plugin's version string. */
const char* tpu_pjrt_platform(const tpu_pjrt_t* p);
const char* tpu_pjrt_platform_version(const tpu_pjrt_t* p);
/* The plugin's PJRT C API version. */
void tpu_pjrt_api_version(const tpu_pjrt_t* p, int* major, int* minor);

/* Addressable devices, in the plugin's order. */
int tpu_pjrt_device_count(const tpu_pjrt_t* p);
/* The device's kind ("cpu", "TPU v5 lite", "NVIDIA H200", ...), or NULL
 * for a bad index. */
const char* tpu_pjrt_device_kind(const tpu_pjrt_t* p, int device);
/* Bytes in use and the limit from the plugin's memory statistics;
 * UNIMPLEMENTED when the plugin keeps none (the XLA CPU plugin). */
tpu_status_t tpu_pjrt_device_memory(const tpu_pjrt_t* p, int device, int64_t* in_use,
                                    int64_t* limit) TPU_MUST_USE;

/* A device buffer holding a dense row-major copy of `data` (the host memory
 * may be reused on return). */
tpu_status_t tpu_pjrt_buffer_from_host(tpu_pjrt_t* p, int device, const void* data, tpu_dtype_t dt,
                                       int ndim, const int64_t* dims,
                                       tpu_pjrt_buffer_t** out) TPU_MUST_USE;
/* Copies the buffer into `dst` (row-major, `bytes` must equal its size)
 * and waits for the copy. */
tpu_status_t tpu_pjrt_buffer_to_host(tpu_pjrt_t* p, tpu_pjrt_buffer_t* b, void* dst,
                                     size_t bytes) TPU_MUST_USE;
/* The buffer's element type (TPU_DTYPE_NONE for one we have no dtype for)
 * and dimensions (up to `cap`; returns the rank, -1 on error). */
tpu_dtype_t tpu_pjrt_buffer_dtype(tpu_pjrt_t* p, tpu_pjrt_buffer_t* b);
int tpu_pjrt_buffer_dims(tpu_pjrt_t* p, tpu_pjrt_buffer_t* b, int64_t* dims, int cap);
void tpu_pjrt_buffer_free(tpu_pjrt_t* p, tpu_pjrt_buffer_t* b);

/* Compiles a StableHLO module given as MLIR text for one device (one
 * replica, one partition). Errors carry the compiler's message. */
tpu_status_t tpu_pjrt_compile(tpu_pjrt_t* p, const char* mlir, size_t len,
                              tpu_pjrt_exe_t** out) TPU_MUST_USE;
int tpu_pjrt_exe_num_outputs(tpu_pjrt_t* p, tpu_pjrt_exe_t* e);
/* The serialized compile options every compile uses (part of a cache key). */
const void* tpu_pjrt_compile_options(size_t* len);
/* The plugin's serialization of `e` (PJRT_Executable_Serialize): a malloc()ed
 * copy in *data (the caller frees it), *len bytes. UNIMPLEMENTED when the
 * plugin lacks the entry. Only the same plugin build can load it back. */
tpu_status_t tpu_pjrt_exe_serialize(tpu_pjrt_t* p, tpu_pjrt_exe_t* e, void** data,
                                    size_t* len) TPU_MUST_USE;
/* Loads bytes from tpu_pjrt_exe_serialize (PJRT_Executable_DeserializeAndLoad);
 * bytes the plugin rejects are an error, never an abort. */
tpu_status_t tpu_pjrt_exe_deserialize(tpu_pjrt_t* p, const void* data, size_t len,
                                      tpu_pjrt_exe_t** out) TPU_MUST_USE;
void tpu_pjrt_exe_free(tpu_pjrt_t* p, tpu_pjrt_exe_t* e);
/* Runs `e` on `device` with `nargs` argument buffers and waits until it has
 * finished; outs[0..nouts) receive new buffers (nouts must equal the
 * executable's output count). */
tpu_status_t tpu_pjrt_execute(tpu_pjrt_t* p, tpu_pjrt_exe_t* e, int device,
                              tpu_pjrt_buffer_t* const* args, int nargs, tpu_pjrt_buffer_t** outs,
                              int nouts) TPU_MUST_USE;
/* The same, keeping the arguments listed in keep[0..nkeep) even where the
 * program aliases them to a result (tf.aliasing_output): every other aliased
 * argument is donated, its buffer consumed by the run (the caller then holds
 * a deleted buffer, to be freed as usual). */
tpu_status_t tpu_pjrt_execute_keep(tpu_pjrt_t* p, tpu_pjrt_exe_t* e, int device,
                                   tpu_pjrt_buffer_t* const* args, int nargs, tpu_pjrt_buffer_t** outs,
                                   int nouts, const int64_t* keep, size_t nkeep) TPU_MUST_USE;

/* The PJRT element type for a dtype (-1 when it has none). */
int tpu_pjrt_element_type(tpu_dtype_t dt);

#ifdef __cplusplus
}
#endif
#endif /* TPU_TARGETS_PJRT_CLIENT_H_ */
