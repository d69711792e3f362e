/* The headers that generated fused-kernel sources #include, embedded in the
 * library at build time (tools/embed_headers.py writes the table from the
 * files in runtime/targets/host/kernels/). A compile writes them into its
 * temporary directory and passes -I to it; the cache key hashes these texts,
 * so a kernel is compiled from exactly the headers the library kernels were
 * built with, and nothing reads the source tree at run time. */
#ifndef TPU_TARGETS_HOST_FUSE_HEADERS_H_
#define TPU_TARGETS_HOST_FUSE_HEADERS_H_

#include <stddef.h>

typedef struct tpu_fuse_header {
  const char* name; /* as the generated source #includes it */
  const char* text; /* NUL-terminated; len excludes the NUL */
  size_t len;
} tpu_fuse_header_t;

extern const tpu_fuse_header_t tpu_fuse_headers[];
extern const int tpu_fuse_nheaders;

#endif /* TPU_TARGETS_HOST_FUSE_HEADERS_H_ */
