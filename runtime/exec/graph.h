/* A flushed trace as a graph: its kept nodes in program order, the target's
 * executable for it (tpu/target.h: graph_prepare), execution on a stream,
 * the StableHLO printer, and the repeated-sequence detector. */
#ifndef TPU_EXEC_GRAPH_H_
#define TPU_EXEC_GRAPH_H_

#include "exec/internal.h"
#include "tpu/target.h"

typedef struct tpu_graph {
  tpu_call_t** nodes; /* owned; pointers still placeholders until patched */
  int n;
  int device;
  void* exe; /* the target's object from graph_prepare (owned); NULL: none */
  uint32_t* visible; /* per node, bit o: output o outlives the graph (live
                        buffer or memory from before it); NULL: all (owned) */
} tpu_graph_t;

/* Asks the target to prepare g (fills g->exe; nothing runs). */
tpu_status_t tpu_graph_prepare(tpu_graph_t* g) TPU_MUST_USE;
/* Releases g->exe (through the target) and sets it NULL. */
void tpu_graph_release_exe(tpu_graph_t* g);
/* The prepared graph's facts (tpu_target_iface_t's optional entries, with
 * their meanings when the target leaves them NULL). */
bool tpu_graph_is_internal(const tpu_graph_t* g, const void* base);
int tpu_graph_run_position(const tpu_graph_t* g, int node);
void tpu_graph_info(const tpu_graph_t* g, tpu_target_graph_info_t* out_info);
/* Queues the graph on s as one unit of work that the target runs; takes the
 * nodes and the executable, also when it fails. */
tpu_status_t tpu_graph_enqueue(tpu_graph_t* g, tpu_stream_t* s) TPU_MUST_USE;

/* Printer (stablehlo.c): the graph as a StableHLO module; parameters are the
 * memory it reads that no node wrote, results the values it leaves in
 * visible memory. */
void tpu_graph_print(const tpu_graph_t* g, FILE* f);
/* The graph as one function of a module a target composes (the pjrt target
 * wraps it in a @main over its storage buffers). With func_name NULL it is
 * tpu_graph_print. on_value reports each parameter (is_result false) and
 * result in order, with its memory geometry: address of element 0, dtype,
 * sizes, strides in elements. */
typedef struct tpu_graph_print_opts {
  const char* func_name; /* printed as "func.func private @<func_name>" */
  void (*on_value)(void* ctx, bool is_result, int index, const void* data, tpu_dtype_t dt, int nd,
                   const int64_t* sizes, const int64_t* strides);
  void* ctx;
  int* out_custom_calls; /* ops without a mapping (custom_call @aten.*) */
  bool* out_oom;         /* the host ran out of memory printing: the text is incomplete */
  /* Floating Python numbers that a lowering uses as values (TPU_ARG_DOUBLE
   * arguments, and floating CPU scalars such as the wrapped number of
   * `x * lr`: tpu_lower_lifts_scalar) become 0-d parameters over the call's
   * own memory (tpu_arg_t.v.d, the tensor's data), reported through on_value
   * like any host value, so that a learning rate that changes every step
   * leaves the program as it is. A number a lowering reads as a constant of
   * the program instead (through tpu_arg_f64/_i64/_bool: a branch, a
   * literal) is reported to on_baked with the address and size of its value;
   * a program keyed without the values of its numbers may be reused only
   * where those values are the same. */
  bool lift_numbers;
  void (*on_baked)(void* ctx, const void* value, size_t bytes);
  /* Device-side checks of data-dependent errors (an index out of range):
   * when set, the lowerings that can fail on their data compute whether
   * they do, and the function gets one more result, last: a tensor<i32>
   * that is 0 when every check passed, else k + 1 for the first check k
   * that failed, in the order of the on_check calls. Each reports the node,
   * what it checks (tpu_check_kind_t) and, for an index, the dimension (-1:
   * a flat index, as take/put's) and its size. */
  void (*on_check)(void* ctx, int node, int kind, int dim, int64_t size);
} tpu_graph_print_opts_t;

/* What a device-side check (tpu_graph_print_opts_t.on_check) checks, and so
 * the error CPU raises when it fails. */
typedef enum {
  TPU_CHECK_INDEX = 0, /* an index in range: IndexError */
  TPU_CHECK_INDEX_RT,  /* the same where CPU raises RuntimeError (gather, scatter, index_add) */
  TPU_CHECK_PROB,      /* probabilities in [0, 1] (bernoulli): RuntimeError */
} tpu_check_kind_t;
void tpu_graph_print_func(const tpu_graph_t* g, FILE* f, const tpu_graph_print_opts_t* o);
/* Structural checks: known ops, argument kinds, outputs that alias no
 * input they are not meant to, dtypes supported. */
tpu_status_t tpu_graph_verify(const tpu_graph_t* g) TPU_MUST_USE;
void tpu_graph_init_dump_from_env(void);
/* True while graphs are dumped (the flush then records tpu_graph_t.visible). */
bool tpu_graph_dumping(void);

/* Repeated op sequences: the detector watches the ops (overloads); when the last W ops
 * equal the W before them (a repeating block such as a transformer layer)
 * it asks for a flush at the boundary, so one executable serves every
 * repetition. */
#define TPU_REPEAT_HIST 4096
typedef struct tpu_repeat {
  uint32_t hist[TPU_REPEAT_HIST]; /* op keys since the last flush */
  int n;
  int period; /* detected block length, 0 if none */
} tpu_repeat_t;
bool tpu_repeat_observe(tpu_repeat_t* r, const tpu_op_t* op);
void tpu_repeat_reset_window(tpu_repeat_t* r);

#endif
