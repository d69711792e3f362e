// The target is chosen once, when the bridge library loads: before the
// static initializers of the other translation units (ops.cpp registers
// every overload of the runtime's op table, which the target provides), so
// this runs at a higher constructor priority than theirs (the default).
#include <stdexcept>

#include "bridge.h"

namespace {
tpu_status_t g_target_status = nullptr;
bool g_target_chosen = false;

__attribute__((constructor(101))) void choose_target() {
  g_target_status = tpu_targets_select_from_env();
  g_target_chosen = true;
}
}  // namespace

namespace torch_tpu {

void ensure_target() {
  if (!g_target_chosen) choose_target();
  // std::runtime_error: RuntimeError from a call, ImportError from the
  // module's initialization (pybind11), without a C++ backtrace.
  if (g_target_status) throw std::runtime_error(tpu_status_message(g_target_status));
}

}  // namespace torch_tpu
