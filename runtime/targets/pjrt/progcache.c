/* The pjrt target's program caches (progcache.h). */
#include "targets/pjrt/progcache.h"

#include "lower/lower.h"

#include <stdlib.h>
#include <string.h>

/* ---- the table ---- */
uint64_t pj_hash(const void* p, size_t n) {
  const unsigned char* s = p;
  uint64_t h = 0x243f6a8885a308d3ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) { /* a word at a time: keys are mostly 8-byte fields */
    uint64_t w;
    memcpy(&w, s + i, 8);
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 31;
  }
  for (; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
  h ^= h >> 29;
  return h ? h : 1;
}

void* pj_table_find(const pj_table_t* t, uint64_t h, const void* key, size_t len) {
  if (!t->cap) return NULL;
  for (size_t i = h & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
    const pj_table_entry_t* e = &t->v[i];
    if (!e->hash) return NULL;
    if (e->hash == h && e->len == len && !memcmp(e->key, key, len)) return e->value;
  }
}

bool pj_table_put(pj_table_t* t, uint64_t h, unsigned char* key, size_t len, void* value) {
  if (2 * (t->n + 1) > t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 256;
    pj_table_entry_t* v = calloc(cap, sizeof(*v));
    if (!v) return false;
    for (size_t i = 0; i < t->cap; i++) {
      const pj_table_entry_t* e = &t->v[i];
      if (!e->hash) continue;
      size_t j = e->hash & (cap - 1);
      while (v[j].hash) j = (j + 1) & (cap - 1);
      v[j] = *e;
    }
    free(t->v);
    t->v = v;
    t->cap = cap;
  }
  size_t j = h & (t->cap - 1);
  while (t->v[j].hash) j = (j + 1) & (t->cap - 1);
  t->v[j] = (pj_table_entry_t){h, key, len, value};
  t->n++;
  return true;
}

size_t pj_table_size(const pj_table_t* t) { return t->n; }

/* ---- call keys ---- */
static void put(pj_call_key_t* k, const void* p, size_t n) {
  if (k->oom) return;
  if (k->len + n > k->cap) {
    size_t cap = k->cap ? 2 * k->cap : 512;
    while (cap < k->len + n) cap *= 2;
    unsigned char* b = realloc(k->bytes, cap);
    if (!b) {
      k->oom = true;
      return;
    }
    k->bytes = b;
    k->cap = cap;
  }
  memcpy(k->bytes + k->len, p, n);
  k->len += n;
}

static void put_u64(pj_call_key_t* k, uint64_t v) { put(k, &v, sizeof v); }

static bool grow(void** v, int* cap, int n, size_t elt) {
  if (n < *cap) return true;
  int c = *cap ? 2 * *cap : 8;
  void* nv = realloc(*v, (size_t)c * elt);
  if (!nv) return false;
  *v = nv;
  *cap = c;
  return true;
}

enum { TAG_DEVICE = 1, TAG_HOST = 2, TAG_SCALAR = 3, TAG_NONE = 4 };

/* Host memory p as its slot by first appearance; false when it is distinct
 * from a slot's address but could overlap it (host values are 0-d, at most
 * 8 bytes: the composer takes no other host memory). */
static bool put_host(pj_call_key_t* k, const void* p) {
  int h = 0;
  for (; h < k->nh && k->host[h] != p; h++) {
    uintptr_t a = (uintptr_t)k->host[h], x = (uintptr_t)p;
    if ((a > x ? a - x : x - a) < 8) return false; /* distinct but could overlap */
  }
  if (h == k->nh) {
    if (!grow((void**)&k->host, &k->host_cap, k->nh, sizeof(*k->host))) {
      k->oom = true;
      return false;
    }
    k->host[k->nh++] = p;
  }
  put_u64(k, (uint64_t)TAG_HOST << 32 | (uint32_t)h);
  return true;
}

/* The tensor's canonical form; false when the graph cannot be keyed. */
static bool put_tensor(pj_call_key_t* k, const tpu_tensor_t* t) {
  put_u64(k, (uint64_t)(uint32_t)t->dtype << 32 | (uint32_t)t->ndim);
  if (t->dtype == TPU_DTYPE_NONE) { /* a None entry of a tensor list */
    put_u64(k, TAG_NONE);
    return true;
  }
  put_u64(k, (uint64_t)t->flags << 32 | (uint32_t)t->device);
  const int nd = t->ndim < 0 ? 0 : t->ndim > TPU_MAX_DIMS ? TPU_MAX_DIMS : t->ndim;
  put(k, t->sizes, sizeof(int64_t) * (size_t)nd);
  put(k, t->strides, sizeof(int64_t) * (size_t)nd);
  if (tpu_lower_lifts_scalar(t)) return put_host(k, t->data); /* read, or held: as a number */
  if (t->flags & TPU_TENSOR_CPU_SCALAR) { /* embedded as a constant: its bytes (both parts of a complex one) */
    put_u64(k, TAG_SCALAR);
    put(k, tpu_tensor_elem_ptr(t, 0), tpu_dtype_size(t->dtype));
    return true;
  }
  pj_block_t b;
  if (t->data && pj_storage_find(t->data, 1, false, &b)) {
    int s = 0;
    while (s < k->ns && k->slots[s].base != b.base) s++;
    if (s == k->ns) {
      if (!grow((void**)&k->slots, &k->slots_cap, k->ns, sizeof(*k->slots))) {
        k->oom = true;
        return false;
      }
      k->slots[k->ns++] = b;
    }
    put_u64(k, (uint64_t)TAG_DEVICE << 32 | (uint32_t)s);
    put_u64(k, (uint64_t)((uintptr_t)t->data - b.base));
    put_u64(k, (uint64_t)b.bytes << 8 | (b.buf ? (uint64_t)b.buf_dt + 1 : 0)); /* contents: none, or their type */
    return true;
  }
  return put_host(k, t->data);
}

static bool put_call(pj_call_key_t* k, const tpu_call_t* c, uint32_t visible) {
  if (!c->op) return false;
  put_u64(k, (uint64_t)(uintptr_t)c->op);
  /* a random op's seed and offset: parameters of its program (lower/random.c) */
  if ((c->op->flags & TPU_OP_RANDOM) && !(put_host(k, &c->rng_seed) && put_host(k, &c->rng_offset)))
    return false;
  put_u64(k, (uint64_t)(uint32_t)c->nargs << 32 | (uint32_t)c->nouts);
  put_u64(k, (uint64_t)c->precision << 40 | (uint64_t)c->debug_checks << 32 | visible);
  put_u64(k, c->mutated_args);
  for (int i = 0; i < c->nargs; i++) {
    const tpu_arg_t* a = &c->args[i];
    put_u64(k, (uint64_t)a->kind << 32 | (uint32_t)a->n);
    switch (a->kind) {
      case TPU_ARG_NONE:
        break;
      case TPU_ARG_TENSOR:
        if (!put_tensor(k, a->v.t)) return false;
        break;
      case TPU_ARG_INT:
        put_u64(k, (uint64_t)a->v.i);
        break;
      case TPU_ARG_DOUBLE: /* its address: a program reads it, or holds it (the plan's baked values) */
        if (!put_host(k, &a->v.d)) return false;
        break;
      case TPU_ARG_BOOL:
        put_u64(k, a->v.b);
        break;
      case TPU_ARG_COMPLEX: /* a constant of the program (lower/stablehlo.c, arg_as): by value */
        put(k, a->v.c, sizeof a->v.c);
        break;
      case TPU_ARG_INTLIST:
        put(k, a->v.ilist, sizeof(int64_t) * (size_t)a->n);
        break;
      case TPU_ARG_DOUBLELIST:
        put(k, a->v.dlist, sizeof(double) * (size_t)a->n);
        break;
      case TPU_ARG_BOOLLIST:
        put(k, a->v.blist, sizeof(bool) * (size_t)a->n);
        break;
      case TPU_ARG_STRING: {
        size_t n = a->v.s ? strlen(a->v.s) : 0;
        put_u64(k, n);
        put(k, a->v.s, n);
        break;
      }
      case TPU_ARG_TENSORLIST:
        for (int j = 0; j < a->n; j++)
          if (!put_tensor(k, &a->v.tlist[j])) return false;
        break;
      default:
        return false; /* a kind this key does not know: do not guess */
    }
  }
  for (int o = 0; o < c->nouts; o++)
    if (!put_tensor(k, &c->outs[o])) return false;
  return true;
}

bool pj_call_key_build(const tpu_graph_t* g, pj_call_key_t* k) {
  put_u64(k, (uint64_t)(uint32_t)g->device << 32 | (uint32_t)g->n);
  for (int i = 0; i < g->n; i++)
    if (!put_call(k, g->nodes[i], g->visible ? g->visible[i] : 0xffffffffu)) return false;
  if (k->oom) return false;
  k->hash = pj_hash(k->bytes, k->len);
  return true;
}

void pj_call_key_free(pj_call_key_t* k) {
  free(k->bytes);
  free(k->slots);
  free(k->host);
  memset(k, 0, sizeof(*k));
}

/* ---- call plans ---- */
/* the host slot of address p in k, or -1 */
static int host_index(const pj_call_key_t* k, const void* p) {
  for (int h = 0; h < k->nh; h++)
    if (k->host[h] == p) return h;
  return -1;
}

static int slot_index(const pj_call_key_t* k, uintptr_t base) {
  for (int s = 0; s < k->ns; s++)
    if (k->slots[s].base == base) return s;
  return -1;
}

void pj_call_plan_free(pj_call_plan_t* p) {
  if (!p) return;
  free(p->baked_slot);
  free(p->baked_val);
  free(p->arg);
  free(p->arg_dt);
  free(p->out);
  free(p->out_arg);
  free(p->out_donor);
  free(p->checks);
  free(p);
}

pj_call_plan_t* pj_call_plan_make(const pj_call_key_t* k, const pj_program_t* prog, tpu_pjrt_exe_t* exe) {
  pj_call_plan_t* p = calloc(1, sizeof(*p));
  if (!p) return NULL;
  p->exe = exe;
  p->nargs = prog->nargs;
  p->nouts = prog->nouts;
  p->arg = calloc((size_t)prog->nargs + 1, sizeof(*p->arg));
  p->arg_dt = calloc((size_t)prog->nargs + 1, sizeof(*p->arg_dt));
  p->out = calloc((size_t)prog->nouts + 1, sizeof(*p->out));
  p->out_arg = calloc((size_t)prog->nouts + 1, sizeof(*p->out_arg));
  p->out_donor = calloc((size_t)prog->nouts + 1, sizeof(*p->out_donor));
  if (!p->arg || !p->arg_dt || !p->out || !p->out_arg || !p->out_donor) goto fail;
  if (prog->nouts) {
    memcpy(p->out_arg, prog->out_arg, sizeof(int) * (size_t)prog->nouts);
    memcpy(p->out_donor, prog->out_donor, sizeof(int) * (size_t)prog->nouts);
  }
  for (int i = 0; i < prog->nargs; i++) {
    const pj_arg_t* a = &prog->args[i];
    if (!a->host) {
      int s = slot_index(k, a->base);
      if (s < 0 || k->slots[s].bytes != a->bytes) goto fail;
      p->arg[i] = s;
      continue;
    }
    const int h = host_index(k, a->data);
    if (h < 0) goto fail;
    p->arg[i] = -1 - h;
    p->arg_dt[i] = a->dtype;
  }
  for (int i = 0; i < prog->nouts; i++)
    if ((p->out[i] = slot_index(k, prog->outs[i])) < 0) goto fail;
  if (prog->nchecks) {
    p->checks = malloc(sizeof(*p->checks) * (size_t)prog->nchecks);
    if (!p->checks) goto fail;
    memcpy(p->checks, prog->checks, sizeof(*p->checks) * (size_t)prog->nchecks);
    p->nchecks = prog->nchecks;
  }
  p->nbaked = prog->nbaked;
  p->baked_slot = calloc((size_t)prog->nbaked + 1, sizeof(*p->baked_slot));
  p->baked_val = calloc((size_t)prog->nbaked + 1, sizeof(*p->baked_val));
  if (!p->baked_slot || !p->baked_val) goto fail;
  for (int i = 0; i < prog->nbaked; i++) {
    const int h = host_index(k, prog->baked[i].data);
    if (h < 0 || prog->baked[i].bytes > sizeof p->baked_val[i].v) goto fail;
    p->baked_slot[i] = h;
    p->baked_val[i].bytes = prog->baked[i].bytes;
    memcpy(p->baked_val[i].v, prog->baked[i].data, prog->baked[i].bytes);
  }
  return p;
fail:
  pj_call_plan_free(p);
  return NULL;
}

void pj_call_plan_bind(const pj_call_plan_t* p, const pj_call_key_t* k, pj_arg_t* args, uintptr_t* outs) {
  for (int i = 0; i < p->nargs; i++) {
    const int s = p->arg[i];
    if (s >= 0) {
      args[i] = (pj_arg_t){.host = false, .base = k->slots[s].base, .bytes = k->slots[s].bytes};
    } else {
      const tpu_dtype_t dt = p->arg_dt[i];
      args[i] = (pj_arg_t){.host = true, .data = k->host[-1 - s], .dtype = dt, .bytes = tpu_dtype_size(dt)};
    }
  }
  for (int i = 0; i < p->nouts; i++) outs[i] = k->slots[p->out[i]].base;
}

bool pj_call_plan_matches(const pj_call_plan_t* p, const pj_call_key_t* k) {
  for (int i = 0; i < p->nbaked; i++)
    if (p->baked_slot[i] >= k->nh || memcmp(k->host[p->baked_slot[i]], p->baked_val[i].v, p->baked_val[i].bytes))
      return false;
  return true;
}
