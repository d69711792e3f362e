/* The pjrt target's plugin client (see pjrt_client.h).
 *
 * Written against the PJRT C API header of the installed `xla-cpu-pjrt`
 * package (found by the Makefile; TPU_HAVE_PJRT is then defined). Every
 * argument struct is zeroed and gets its STRUCT_SIZE, so a plugin built for a
 * newer minor version sees an older caller, and before calling a function
 * the plugin's table is checked to be long enough to hold it (an older
 * plugin may lack newer entries).
 */
#include "targets/pjrt/pjrt_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TPU_HAVE_PJRT
#include <dlfcn.h>
#include <fcntl.h>
#include <stddef.h>
#include <unistd.h>

#include "base/env.h"
#include "pjrt_c_api.h"

struct tpu_pjrt {
  const PJRT_Api* api;
  PJRT_Client* client;
  char* path;
  char* platform;
  char* version;
  int ndev;
  PJRT_Device** devices;
  char** kinds;
};

struct tpu_pjrt_exe {
  PJRT_LoadedExecutable* exe;
  int nouts;
};

/* A buffer handle is the plugin's PJRT_Buffer itself. */
#define BUF(b) ((PJRT_Buffer*)(b))

bool tpu_pjrt_available(void) { return true; }

/* Whether the plugin's function table reaches entry `fn`. */
#define HAS(api, fn) ((api)->struct_size >= offsetof(PJRT_Api, fn) + sizeof(void*) && (api)->fn)

static tpu_status_code_t code_of(PJRT_Error_Code c) {
  switch (c) {
    case PJRT_Error_Code_INVALID_ARGUMENT: return TPU_CODE_INVALID_ARGUMENT;
    case PJRT_Error_Code_OUT_OF_RANGE: return TPU_CODE_OUT_OF_RANGE;
    case PJRT_Error_Code_RESOURCE_EXHAUSTED: return TPU_CODE_RESOURCE_EXHAUSTED;
    case PJRT_Error_Code_UNIMPLEMENTED: return TPU_CODE_UNIMPLEMENTED;
    default: return TPU_CODE_INTERNAL;
  }
}

/* Turns a PJRT error into a status "<what>: <plugin message>" and frees it. */
static tpu_status_t take_error(const PJRT_Api* api, PJRT_Error* err, const char* what) {
  if (!err) return TPU_OK;
  PJRT_Error_Message_Args m = {.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE, .error = err};
  api->PJRT_Error_Message(&m);
  PJRT_Error_GetCode_Args c = {.struct_size = PJRT_Error_GetCode_Args_STRUCT_SIZE, .error = err};
  PJRT_Error_Code code = PJRT_Error_Code_INTERNAL;
  PJRT_Error* cerr = api->PJRT_Error_GetCode(&c);
  if (!cerr) code = c.code;
  tpu_status_t st = tpu_status_make(code_of(code), "%s: %.*s", what, (int)m.message_size,
                                    m.message ? m.message : "");
  PJRT_Error_Destroy_Args d = {.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE, .error = err};
  api->PJRT_Error_Destroy(&d);
  if (cerr) {
    PJRT_Error_Destroy_Args d2 = {.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE,
                                  .error = cerr};
    api->PJRT_Error_Destroy(&d2);
  }
  return st;
}

static char* dup_n(const char* s, size_t n) {
  char* r = malloc(n + 1);
  if (!r) return NULL;
  if (n) memcpy(r, s, n);
  r[n] = 0;
  return r;
}

/* Waits for an event and destroys it; its error, if any, as a status. */
static tpu_status_t await_event(const PJRT_Api* api, PJRT_Event* ev, const char* what) {
  if (!ev) return TPU_OK;
  PJRT_Event_Await_Args a = {.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE, .event = ev};
  tpu_status_t st = take_error(api, api->PJRT_Event_Await(&a), what);
  PJRT_Event_Destroy_Args d = {.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE, .event = ev};
  tpu_status_free(take_error(api, api->PJRT_Event_Destroy(&d), what));
  return st;
}

/* ---- the plugin's start-up log ---- */
/* Plugins log to stderr (absl) while they load and create a client. The
 * lines go to a temporary file instead: the user's console stays clean, and
 * a failure can quote them. */
typedef struct {
  int saved, tmp;
} quiet_t;

static void quiet_begin(quiet_t* q) {
  q->saved = q->tmp = -1;
  if (tpu_env_bool("TORCH_TPU_PJRT_VERBOSE", false)) return;
  char path[512];
  const char* dir = tpu_env_str("TMPDIR");
  snprintf(path, sizeof path, "%s/torch_tpu_pjrt_log_XXXXXX", dir ? dir : "/tmp");
  int fd = mkstemp(path);
  if (fd < 0) return;
  unlink(path);
  fflush(stderr);
  q->saved = dup(2);
  if (q->saved < 0 || dup2(fd, 2) < 0) {
    if (q->saved >= 0) close(q->saved);
    close(fd);
    q->saved = -1;
    return;
  }
  q->tmp = fd;
}

/* Restores stderr; the last `cap - 1` bytes of what was logged go to buf. */
static void quiet_end(quiet_t* q, char* buf, size_t cap) {
  if (buf && cap) buf[0] = 0;
  if (q->saved < 0) return;
  fflush(stderr);
  dup2(q->saved, 2);
  close(q->saved);
  off_t end = lseek(q->tmp, 0, SEEK_END);
  if (buf && cap > 1 && end > 0) {
    off_t from = end > (off_t)(cap - 1) ? end - (off_t)(cap - 1) : 0;
    ssize_t n = pread(q->tmp, buf, (size_t)(end - from), from);
    buf[n > 0 ? n : 0] = 0;
  }
  close(q->tmp);
}

/* ---- open / close ---- */
static tpu_status_t open_client(tpu_pjrt_t* p) {
  const PJRT_Api* api = p->api;
  if (HAS(api, PJRT_Plugin_Initialize)) {
    PJRT_Plugin_Initialize_Args a = {.struct_size = PJRT_Plugin_Initialize_Args_STRUCT_SIZE};
    TPU_RETURN_IF_ERROR(take_error(api, api->PJRT_Plugin_Initialize(&a), "plugin initialize"));
  }
  PJRT_Client_Create_Args c = {.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE};
  TPU_RETURN_IF_ERROR(take_error(api, api->PJRT_Client_Create(&c), "client create"));
  p->client = c.client;
  PJRT_Client_PlatformName_Args pn = {.struct_size = PJRT_Client_PlatformName_Args_STRUCT_SIZE,
                                      .client = p->client};
  TPU_RETURN_IF_ERROR(take_error(api, api->PJRT_Client_PlatformName(&pn), "platform name"));
  p->platform = dup_n(pn.platform_name, pn.platform_name_size);
  PJRT_Client_PlatformVersion_Args pv = {
      .struct_size = PJRT_Client_PlatformVersion_Args_STRUCT_SIZE, .client = p->client};
  TPU_RETURN_IF_ERROR(take_error(api, api->PJRT_Client_PlatformVersion(&pv), "platform version"));
  p->version = dup_n(pv.platform_version, pv.platform_version_size);
  PJRT_Client_AddressableDevices_Args ad = {
      .struct_size = PJRT_Client_AddressableDevices_Args_STRUCT_SIZE, .client = p->client};
  TPU_RETURN_IF_ERROR(take_error(api, api->PJRT_Client_AddressableDevices(&ad), "devices"));
  /* TORCH_TPU_VISIBLE_DEVICES picks (and orders) the devices this process uses */
  const int total = (int)ad.num_addressable_devices;
  int* map = calloc((size_t)total + 1, sizeof(int));
  if (!map) return TPU_ERR(RESOURCE_EXHAUSTED, "pjrt: out of host memory");
  tpu_status_t vs = tpu_env_visible_devices(total, map, &p->ndev);
  if (vs) {
    free(map);
    return tpu_status_annotate(vs, "pjrt");
  }
  p->devices = calloc((size_t)p->ndev + 1, sizeof(PJRT_Device*));
  p->kinds = calloc((size_t)p->ndev + 1, sizeof(char*));
  if (!p->devices || !p->kinds || !p->platform || !p->version) {
    free(map);
    return TPU_ERR(RESOURCE_EXHAUSTED, "pjrt: out of host memory");
  }
  for (int i = 0; i < p->ndev; i++) p->devices[i] = ad.addressable_devices[map[i]];
  free(map);
  for (int i = 0; i < p->ndev; i++) {
    PJRT_Device_GetDescription_Args g = {.struct_size = PJRT_Device_GetDescription_Args_STRUCT_SIZE,
                                         .device = p->devices[i]};
    TPU_RETURN_IF_ERROR(take_error(api, api->PJRT_Device_GetDescription(&g), "device description"));
    PJRT_DeviceDescription_Kind_Args k = {
        .struct_size = PJRT_DeviceDescription_Kind_Args_STRUCT_SIZE,
        .device_description = g.device_description};
    TPU_RETURN_IF_ERROR(take_error(api, api->PJRT_DeviceDescription_Kind(&k), "device kind"));
    p->kinds[i] = dup_n(k.device_kind, k.device_kind_size);
    if (!p->kinds[i]) return TPU_ERR(RESOURCE_EXHAUSTED, "pjrt: out of host memory");
  }
  return TPU_OK;
}

static tpu_status_t load_api(const char* path, const PJRT_Api** out) {
  *out = NULL;
  dlerror();
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    return TPU_ERR(INVALID_ARGUMENT, "cannot load it: %s", e ? e : "unknown dlopen error");
  }
  typedef const PJRT_Api* (*get_api_fn)(void);
  get_api_fn get = (get_api_fn)dlsym(h, "GetPjrtApi");
  if (!get) return TPU_ERR(INVALID_ARGUMENT, "it has no GetPjrtApi symbol: not a PJRT plugin");
  const PJRT_Api* api = get();
  if (!api) return TPU_ERR(INVALID_ARGUMENT, "GetPjrtApi returned no API table");
  int major = api->pjrt_api_version.major_version, minor = api->pjrt_api_version.minor_version;
  if (major != PJRT_API_MAJOR)
    return TPU_ERR(INVALID_ARGUMENT,
                   "its PJRT C API version %d.%d is incompatible with this build's %d.%d "
                   "(the major versions differ)",
                   major, minor, PJRT_API_MAJOR, PJRT_API_MINOR);
  /* the entries every path here uses must be present */
  if (!HAS(api, PJRT_Error_Destroy) || !HAS(api, PJRT_Error_Message) ||
      !HAS(api, PJRT_Error_GetCode) || !HAS(api, PJRT_Client_Create) ||
      !HAS(api, PJRT_Client_Compile) || !HAS(api, PJRT_LoadedExecutable_Execute) ||
      !HAS(api, PJRT_Client_BufferFromHostBuffer) || !HAS(api, PJRT_Buffer_ToHostBuffer) ||
      !HAS(api, PJRT_Event_Await) || !HAS(api, PJRT_Executable_NumOutputs))
    return TPU_ERR(INVALID_ARGUMENT, "its PJRT C API %d.%d lacks functions this runtime needs",
                   major, minor);
  *out = api;
  return TPU_OK;
}

tpu_status_t tpu_pjrt_open(const char* path, tpu_pjrt_t** out) {
  *out = NULL;
  if (!path || !*path) return TPU_ERR(INVALID_ARGUMENT, "pjrt: no plugin path given");
  tpu_pjrt_t* p = calloc(1, sizeof(*p));
  if (!p) return TPU_ERR(RESOURCE_EXHAUSTED, "pjrt: out of host memory");
  p->path = dup_n(path, strlen(path));
  quiet_t q;
  quiet_begin(&q);
  tpu_status_t st = load_api(path, &p->api);
  if (!st) st = open_client(p);
  char log[1024];
  quiet_end(&q, log, sizeof log);
  if (st) {
    tpu_status_t full = tpu_status_make(
        tpu_status_code(st), "pjrt plugin %s: %s%s%s", path, tpu_status_message(st),
        log[0] ? "; the plugin logged: " : "", log);
    tpu_status_free(st);
    tpu_pjrt_close(p);
    return full;
  }
  *out = p;
  return TPU_OK;
}

void tpu_pjrt_close(tpu_pjrt_t* p) {
  if (!p) return;
  if (p->client) {
    PJRT_Client_Destroy_Args d = {.struct_size = PJRT_Client_Destroy_Args_STRUCT_SIZE,
                                  .client = p->client};
    tpu_status_free(take_error(p->api, p->api->PJRT_Client_Destroy(&d), "client destroy"));
  }
  for (int i = 0; p->kinds && i < p->ndev; i++) free(p->kinds[i]);
  free(p->kinds);
  free(p->devices);
  free(p->platform);
  free(p->version);
  free(p->path);
  free(p);
}

const char* tpu_pjrt_path(const tpu_pjrt_t* p) { return p->path; }
const char* tpu_pjrt_platform(const tpu_pjrt_t* p) { return p->platform; }
const char* tpu_pjrt_platform_version(const tpu_pjrt_t* p) { return p->version; }

void tpu_pjrt_api_version(const tpu_pjrt_t* p, int* major, int* minor) {
  *major = p->api->pjrt_api_version.major_version;
  *minor = p->api->pjrt_api_version.minor_version;
}

int tpu_pjrt_device_count(const tpu_pjrt_t* p) { return p->ndev; }

const char* tpu_pjrt_device_kind(const tpu_pjrt_t* p, int device) {
  return device >= 0 && device < p->ndev ? p->kinds[device] : NULL;
}

static tpu_status_t check_device(const tpu_pjrt_t* p, int device) {
  if (device < 0 || device >= p->ndev)
    return TPU_ERR(INVALID_ARGUMENT, "pjrt: device %d does not exist (the %s plugin has %d)",
                   device, p->platform, p->ndev);
  return TPU_OK;
}

tpu_status_t tpu_pjrt_device_memory(const tpu_pjrt_t* p, int device, int64_t* in_use,
                                    int64_t* limit) {
  *in_use = *limit = -1;
  TPU_RETURN_IF_ERROR(check_device(p, device));
  if (!HAS(p->api, PJRT_Device_MemoryStats))
    return TPU_ERR(UNIMPLEMENTED, "pjrt: the %s plugin keeps no memory statistics", p->platform);
  PJRT_Device_MemoryStats_Args m = {.struct_size = PJRT_Device_MemoryStats_Args_STRUCT_SIZE,
                                    .device = p->devices[device]};
  TPU_RETURN_IF_ERROR(take_error(p->api, p->api->PJRT_Device_MemoryStats(&m), "memory stats"));
  *in_use = m.bytes_in_use;
  if (m.bytes_limit_is_set) *limit = m.bytes_limit;
  return TPU_OK;
}

/* ---- buffers ---- */
int tpu_pjrt_element_type(tpu_dtype_t dt) {
  switch (dt) {
    case TPU_BOOL: return PJRT_Buffer_Type_PRED;
    case TPU_U8: return PJRT_Buffer_Type_U8;
    case TPU_I8: return PJRT_Buffer_Type_S8;
    case TPU_I16: return PJRT_Buffer_Type_S16;
    case TPU_I32: return PJRT_Buffer_Type_S32;
    case TPU_I64: return PJRT_Buffer_Type_S64;
    case TPU_F16: return PJRT_Buffer_Type_F16;
    case TPU_BF16: return PJRT_Buffer_Type_BF16;
    case TPU_F32: return PJRT_Buffer_Type_F32;
    case TPU_F64: return PJRT_Buffer_Type_F64;
    case TPU_U16: return PJRT_Buffer_Type_U16;
    case TPU_U32: return PJRT_Buffer_Type_U32;
    case TPU_U64: return PJRT_Buffer_Type_U64;
    case TPU_F8E5M2: return PJRT_Buffer_Type_F8E5M2;
    case TPU_F8E4M3FN: return PJRT_Buffer_Type_F8E4M3FN;
    case TPU_F8E5M2FNUZ: return PJRT_Buffer_Type_F8E5M2FNUZ;
    case TPU_F8E4M3FNUZ: return PJRT_Buffer_Type_F8E4M3FNUZ;
    case TPU_F8E8M0FNU: return PJRT_Buffer_Type_F8E8M0FNU;
    /* two float4 codes a byte: moved as bytes (PyTorch does no arithmetic on it) */
    case TPU_F4E2M1FNX2: return PJRT_Buffer_Type_U8;
    default: return -1;
  }
}

static tpu_dtype_t dtype_of(PJRT_Buffer_Type t) {
  static const tpu_dtype_t all[] = {TPU_BOOL,     TPU_U8,       TPU_I8,         TPU_I16,
                                    TPU_I32,      TPU_I64,      TPU_F16,        TPU_BF16,
                                    TPU_F32,      TPU_F64,      TPU_U16,        TPU_U32,
                                    TPU_U64,      TPU_F8E5M2,   TPU_F8E4M3FN,   TPU_F8E5M2FNUZ,
                                    TPU_F8E4M3FNUZ, TPU_F8E8M0FNU};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (tpu_pjrt_element_type(all[i]) == (int)t) return all[i];
  return TPU_DTYPE_NONE;
}

tpu_status_t tpu_pjrt_buffer_from_host(tpu_pjrt_t* p, int device, const void* data, tpu_dtype_t dt,
                                       int ndim, const int64_t* dims, tpu_pjrt_buffer_t** out) {
  *out = NULL;
  TPU_RETURN_IF_ERROR(check_device(p, device));
  int et = tpu_pjrt_element_type(dt);
  if (et < 0)
    return TPU_ERR(UNIMPLEMENTED, "pjrt: no PJRT element type for dtype %s", tpu_dtype_name(dt));
  for (int d = 0; d < ndim; d++)
    if (dims[d] < 0) return TPU_ERR(INVALID_ARGUMENT, "pjrt: negative dimension %lld",
                                    (long long)dims[d]);
  PJRT_Client_BufferFromHostBuffer_Args a = {
      .struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE,
      .client = p->client,
      .data = data,
      .type = (PJRT_Buffer_Type)et,
      .dims = dims,
      .num_dims = (size_t)ndim,
      .host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes,
      .device = p->devices[device]};
  TPU_RETURN_IF_ERROR(
      take_error(p->api, p->api->PJRT_Client_BufferFromHostBuffer(&a), "copy to device"));
  /* the host memory may be reused once the plugin has read it */
  tpu_status_t st = await_event(p->api, a.done_with_host_buffer, "copy to device");
  if (st) {
    tpu_pjrt_buffer_free(p, (tpu_pjrt_buffer_t*)a.buffer);
    return st;
  }
  *out = (tpu_pjrt_buffer_t*)a.buffer;
  return TPU_OK;
}

tpu_status_t tpu_pjrt_buffer_to_host(tpu_pjrt_t* p, tpu_pjrt_buffer_t* b, void* dst, size_t bytes) {
  /* ask the size first: a short destination is an error, not an overrun */
  PJRT_Buffer_ToHostBuffer_Args q = {.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE,
                                     .src = BUF(b)};
  TPU_RETURN_IF_ERROR(take_error(p->api, p->api->PJRT_Buffer_ToHostBuffer(&q), "copy to host"));
  if (q.dst_size != bytes)
    return TPU_ERR(INVALID_ARGUMENT, "pjrt: copy to host of a %zu-byte buffer into %zu bytes",
                   q.dst_size, bytes);
  if (!bytes) return TPU_OK;
  PJRT_Buffer_ToHostBuffer_Args a = {.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE,
                                     .src = BUF(b), .dst = dst, .dst_size = bytes};
  TPU_RETURN_IF_ERROR(take_error(p->api, p->api->PJRT_Buffer_ToHostBuffer(&a), "copy to host"));
  return await_event(p->api, a.event, "copy to host");
}

tpu_dtype_t tpu_pjrt_buffer_dtype(tpu_pjrt_t* p, tpu_pjrt_buffer_t* b) {
  PJRT_Buffer_ElementType_Args a = {.struct_size = PJRT_Buffer_ElementType_Args_STRUCT_SIZE,
                                    .buffer = BUF(b)};
  tpu_status_t st = take_error(p->api, p->api->PJRT_Buffer_ElementType(&a), "element type");
  if (st) {
    tpu_status_free(st);
    return TPU_DTYPE_NONE;
  }
  return dtype_of(a.type);
}

int tpu_pjrt_buffer_dims(tpu_pjrt_t* p, tpu_pjrt_buffer_t* b, int64_t* dims, int cap) {
  PJRT_Buffer_Dimensions_Args a = {.struct_size = PJRT_Buffer_Dimensions_Args_STRUCT_SIZE,
                                   .buffer = BUF(b)};
  tpu_status_t st = take_error(p->api, p->api->PJRT_Buffer_Dimensions(&a), "dimensions");
  if (st) {
    tpu_status_free(st);
    return -1;
  }
  for (size_t i = 0; i < a.num_dims && (int)i < cap; i++) dims[i] = a.dims[i];
  return (int)a.num_dims;
}

void tpu_pjrt_buffer_free(tpu_pjrt_t* p, tpu_pjrt_buffer_t* b) {
  if (!b) return;
  PJRT_Buffer_Destroy_Args d = {.struct_size = PJRT_Buffer_Destroy_Args_STRUCT_SIZE,
                                .buffer = BUF(b)};
  tpu_status_free(take_error(p->api, p->api->PJRT_Buffer_Destroy(&d), "buffer destroy"));
}

/* ---- executables ---- */
/* A serialized xla.CompileOptionsProto: executable_build_options (field 3)
 * with num_replicas (4) = 1 and num_partitions (5) = 1, and
 * compile_portable_executable (4) = true so that one executable runs on any
 * of the client's devices. (XLA aborts the process on empty options.) */
static const char k_compile_options[] = {0x1a, 0x04, 0x20, 0x01, 0x28, 0x01, 0x20, 0x01};

static tpu_status_t wrap_loaded(tpu_pjrt_t* p, PJRT_LoadedExecutable* le, tpu_pjrt_exe_t** out);

tpu_status_t tpu_pjrt_compile(tpu_pjrt_t* p, const char* mlir, size_t len, tpu_pjrt_exe_t** out) {
  *out = NULL;
  if (!mlir || !len) return TPU_ERR(INVALID_ARGUMENT, "pjrt compile: empty module");
  PJRT_Program prog = {.struct_size = PJRT_Program_STRUCT_SIZE,
                       .code = (char*)mlir,
                       .code_size = len,
                       .format = "mlir",
                       .format_size = 4};
  PJRT_Client_Compile_Args a = {.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE,
                                .client = p->client,
                                .program = &prog,
                                .compile_options = k_compile_options,
                                .compile_options_size = sizeof k_compile_options};
  TPU_RETURN_IF_ERROR(take_error(p->api, p->api->PJRT_Client_Compile(&a), "pjrt compile"));
  return wrap_loaded(p, a.executable, out);
}

const void* tpu_pjrt_compile_options(size_t* len) {
  *len = sizeof k_compile_options;
  return k_compile_options;
}

/* The PJRT_Executable behind a loaded one (destroy it with exe_destroy). */
static tpu_status_t exe_of(tpu_pjrt_t* p, PJRT_LoadedExecutable* le, PJRT_Executable** out) {
  PJRT_LoadedExecutable_GetExecutable_Args g = {
      .struct_size = PJRT_LoadedExecutable_GetExecutable_Args_STRUCT_SIZE,
      .loaded_executable = le};
  *out = NULL;
  TPU_RETURN_IF_ERROR(
      take_error(p->api, p->api->PJRT_LoadedExecutable_GetExecutable(&g), "executable"));
  *out = g.executable;
  return TPU_OK;
}

static void exe_destroy(tpu_pjrt_t* p, PJRT_Executable* x) {
  PJRT_Executable_Destroy_Args d = {.struct_size = PJRT_Executable_Destroy_Args_STRUCT_SIZE,
                                    .executable = x};
  tpu_status_free(take_error(p->api, p->api->PJRT_Executable_Destroy(&d), "destroy"));
}

/* Takes ownership of a loaded executable: *out wraps it with its output
 * count (on failure it is destroyed). */
static tpu_status_t wrap_loaded(tpu_pjrt_t* p, PJRT_LoadedExecutable* le, tpu_pjrt_exe_t** out) {
  tpu_pjrt_exe_t* e = calloc(1, sizeof(*e));
  if (!e) {
    PJRT_LoadedExecutable_Destroy_Args d = {
        .struct_size = PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE, .executable = le};
    tpu_status_free(take_error(p->api, p->api->PJRT_LoadedExecutable_Destroy(&d), "destroy"));
    return TPU_ERR(RESOURCE_EXHAUSTED, "pjrt: out of host memory");
  }
  e->exe = le;
  PJRT_Executable* x = NULL;
  tpu_status_t st = exe_of(p, le, &x);
  if (!st) {
    PJRT_Executable_NumOutputs_Args n = {.struct_size = PJRT_Executable_NumOutputs_Args_STRUCT_SIZE,
                                         .executable = x};
    st = take_error(p->api, p->api->PJRT_Executable_NumOutputs(&n), "output count");
    e->nouts = (int)n.num_outputs;
    exe_destroy(p, x);
  }
  if (st) {
    tpu_pjrt_exe_free(p, e);
    return st;
  }
  *out = e;
  return TPU_OK;
}

tpu_status_t tpu_pjrt_exe_serialize(tpu_pjrt_t* p, tpu_pjrt_exe_t* e, void** data, size_t* len) {
  *data = NULL;
  *len = 0;
  if (!HAS(p->api, PJRT_Executable_Serialize) || !HAS(p->api, PJRT_LoadedExecutable_GetExecutable))
    return TPU_ERR(UNIMPLEMENTED, "pjrt: the %s plugin cannot serialize executables", p->platform);
  PJRT_Executable* x = NULL;
  TPU_RETURN_IF_ERROR(exe_of(p, e->exe, &x));
  PJRT_Executable_Serialize_Args a = {.struct_size = PJRT_Executable_Serialize_Args_STRUCT_SIZE,
                                      .executable = x};
  tpu_status_t st = take_error(p->api, p->api->PJRT_Executable_Serialize(&a), "pjrt serialize");
  if (!st && (!a.serialized_bytes || a.serialized_bytes_size == 0))
    st = TPU_ERR(INTERNAL, "pjrt serialize: the %s plugin returned no bytes", p->platform);
  if (!st) {
    *data = malloc(a.serialized_bytes_size);
    if (*data) {
      memcpy(*data, a.serialized_bytes, a.serialized_bytes_size);
      *len = a.serialized_bytes_size;
    } else {
      st = TPU_ERR(RESOURCE_EXHAUSTED, "pjrt serialize: out of host memory (%zu bytes)",
                   a.serialized_bytes_size);
    }
  }
  if (a.serialized_executable && a.serialized_executable_deleter)
    a.serialized_executable_deleter(a.serialized_executable);
  exe_destroy(p, x);
  return st;
}

tpu_status_t tpu_pjrt_exe_deserialize(tpu_pjrt_t* p, const void* data, size_t len,
                                      tpu_pjrt_exe_t** out) {
  *out = NULL;
  if (!HAS(p->api, PJRT_Executable_DeserializeAndLoad))
    return TPU_ERR(UNIMPLEMENTED, "pjrt: the %s plugin cannot load serialized executables",
                   p->platform);
  if (!data || !len) return TPU_ERR(INVALID_ARGUMENT, "pjrt deserialize: no bytes");
  PJRT_Executable_DeserializeAndLoad_Args a = {
      .struct_size = PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE,
      .client = p->client,
      .serialized_executable = data,
      .serialized_executable_size = len};
  TPU_RETURN_IF_ERROR(
      take_error(p->api, p->api->PJRT_Executable_DeserializeAndLoad(&a), "pjrt deserialize"));
  if (!a.loaded_executable)
    return TPU_ERR(INTERNAL, "pjrt deserialize: the %s plugin returned no executable", p->platform);
  return wrap_loaded(p, a.loaded_executable, out);
}

int tpu_pjrt_exe_num_outputs(tpu_pjrt_t* p, tpu_pjrt_exe_t* e) {
  (void)p;
  return e->nouts;
}

void tpu_pjrt_exe_free(tpu_pjrt_t* p, tpu_pjrt_exe_t* e) {
  if (!e) return;
  PJRT_LoadedExecutable_Destroy_Args d = {
      .struct_size = PJRT_LoadedExecutable_Destroy_Args_STRUCT_SIZE, .executable = e->exe};
  tpu_status_free(take_error(p->api, p->api->PJRT_LoadedExecutable_Destroy(&d), "destroy"));
  free(e);
}

tpu_status_t tpu_pjrt_execute(tpu_pjrt_t* p, tpu_pjrt_exe_t* e, int device,
                              tpu_pjrt_buffer_t* const* args, int nargs, tpu_pjrt_buffer_t** outs,
                              int nouts) {
  return tpu_pjrt_execute_keep(p, e, device, args, nargs, outs, nouts, NULL, 0);
}

tpu_status_t tpu_pjrt_execute_keep(tpu_pjrt_t* p, tpu_pjrt_exe_t* e, int device,
                                   tpu_pjrt_buffer_t* const* args, int nargs, tpu_pjrt_buffer_t** outs,
                                   int nouts, const int64_t* keep, size_t nkeep) {
  TPU_RETURN_IF_ERROR(check_device(p, device));
  if (nouts != e->nouts)
    return TPU_ERR(INVALID_ARGUMENT, "pjrt execute: the executable has %d outputs, not %d",
                   e->nouts, nouts);
  for (int i = 0; i < nouts; i++) outs[i] = NULL;
  PJRT_ExecuteOptions opts = {.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE,
                              .non_donatable_input_indices = keep,
                              .num_non_donatable_input_indices = nkeep};
  PJRT_Buffer* const* arg_list = (PJRT_Buffer* const*)args;
  PJRT_Buffer** out_list = (PJRT_Buffer**)outs;
  PJRT_Event* done = NULL;
  PJRT_LoadedExecutable_Execute_Args a = {
      .struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE,
      .executable = e->exe,
      .options = &opts,
      .argument_lists = &arg_list,
      .num_devices = 1,
      .num_args = (size_t)nargs,
      .output_lists = &out_list,
      .device_complete_events = &done,
      .execute_device = p->devices[device]};
  TPU_RETURN_IF_ERROR(take_error(p->api, p->api->PJRT_LoadedExecutable_Execute(&a), "pjrt execute"));
  tpu_status_t st = await_event(p->api, done, "pjrt execute");
  if (st) {
    for (int i = 0; i < nouts; i++) {
      tpu_pjrt_buffer_free(p, outs[i]);
      outs[i] = NULL;
    }
  }
  return st;
}

#else /* !TPU_HAVE_PJRT: built without the PJRT C API header */

struct tpu_pjrt {
  int unused;
};

bool tpu_pjrt_available(void) { return false; }

tpu_status_t tpu_pjrt_open(const char* path, tpu_pjrt_t** out) {
  *out = NULL;
  return TPU_ERR(UNIMPLEMENTED,
                 "pjrt plugin %s: this build of torch_tpu has no pjrt target (the PJRT C API "
                 "header was not found at build time: install xla-cpu-pjrt and rebuild)",
                 path ? path : "(none)");
}
void tpu_pjrt_close(tpu_pjrt_t* p) { (void)p; }
const char* tpu_pjrt_path(const tpu_pjrt_t* p) { return NULL; }
const char* tpu_pjrt_platform(const tpu_pjrt_t* p) { return NULL; }
const char* tpu_pjrt_platform_version(const tpu_pjrt_t* p) { return NULL; }
void tpu_pjrt_api_version(const tpu_pjrt_t* p, int* major, int* minor) { *major = *minor = -1; }
int tpu_pjrt_device_count(const tpu_pjrt_t* p) { return 0; }
const char* tpu_pjrt_device_kind(const tpu_pjrt_t* p, int device) { return NULL; }
tpu_status_t tpu_pjrt_device_memory(const tpu_pjrt_t* p, int device, int64_t* in_use,
                                    int64_t* limit) {
  return TPU_ERR(UNIMPLEMENTED, "pjrt: not built");
}
tpu_status_t tpu_pjrt_buffer_from_host(tpu_pjrt_t* p, int device, const void* data, tpu_dtype_t dt,
                                       int ndim, const int64_t* dims, tpu_pjrt_buffer_t** out) {
  return TPU_ERR(UNIMPLEMENTED, "pjrt: not built");
}
tpu_status_t tpu_pjrt_buffer_to_host(tpu_pjrt_t* p, tpu_pjrt_buffer_t* b, void* dst, size_t bytes) {
  return TPU_ERR(UNIMPLEMENTED, "pjrt: not built");
}
tpu_dtype_t tpu_pjrt_buffer_dtype(tpu_pjrt_t* p, tpu_pjrt_buffer_t* b) { return TPU_DTYPE_NONE; }
int tpu_pjrt_buffer_dims(tpu_pjrt_t* p, tpu_pjrt_buffer_t* b, int64_t* dims, int cap) { return -1; }
void tpu_pjrt_buffer_free(tpu_pjrt_t* p, tpu_pjrt_buffer_t* b) {}
tpu_status_t tpu_pjrt_compile(tpu_pjrt_t* p, const char* mlir, size_t len, tpu_pjrt_exe_t** out) {
  return TPU_ERR(UNIMPLEMENTED, "pjrt: not built");
}
const void* tpu_pjrt_compile_options(size_t* len) {
  *len = 0;
  return NULL;
}
tpu_status_t tpu_pjrt_exe_serialize(tpu_pjrt_t* p, tpu_pjrt_exe_t* e, void** data, size_t* len) {
  *data = NULL;
  *len = 0;
  return TPU_ERR(UNIMPLEMENTED, "pjrt: not built");
}
tpu_status_t tpu_pjrt_exe_deserialize(tpu_pjrt_t* p, const void* data, size_t len,
                                      tpu_pjrt_exe_t** out) {
  *out = NULL;
  return TPU_ERR(UNIMPLEMENTED, "pjrt: not built");
}
int tpu_pjrt_exe_num_outputs(tpu_pjrt_t* p, tpu_pjrt_exe_t* e) { return 0; }
void tpu_pjrt_exe_free(tpu_pjrt_t* p, tpu_pjrt_exe_t* e) {}
tpu_status_t tpu_pjrt_execute(tpu_pjrt_t* p, tpu_pjrt_exe_t* e, int device,
                              tpu_pjrt_buffer_t* const* args, int nargs, tpu_pjrt_buffer_t** outs,
                              int nouts) {
  return TPU_ERR(UNIMPLEMENTED, "pjrt: not built");
}
tpu_status_t tpu_pjrt_execute_keep(tpu_pjrt_t* p, tpu_pjrt_exe_t* e, int device,
                                   tpu_pjrt_buffer_t* const* args, int nargs, tpu_pjrt_buffer_t** outs,
                                   int nouts, const int64_t* keep, size_t nkeep) {
  return TPU_ERR(UNIMPLEMENTED, "pjrt: not built");
}
int tpu_pjrt_element_type(tpu_dtype_t dt) { return -1; }
#endif
