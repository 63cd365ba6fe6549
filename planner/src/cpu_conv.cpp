#include "dlplan/cpu_conv.hpp"

#include "dlplan/ir.hpp"
#include "dlplan/onednn_conv.hpp"

#include <sched.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <cstdlib>
#include <string>

#ifdef DLPLAN_HAVE_ONEDNN
#include <omp.h>
#endif

namespace dlplan {
namespace {

int env_count(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (*end == '\0' && n > 0 && n <= 1024) ? static_cast<int>(n) : 0;
}

}  // namespace

int cpu_threads_per_rank(int local_ranks) {
  for (const char* name : {"DLPLAN_CPU_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"})
    if (const int n = env_count(name)) return n;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const int allowed = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : 1;
  return std::max(1, allowed / std::max(1, local_ranks));
}

#ifdef DLPLAN_HAVE_ONEDNN

bool onednn_conv_enabled() {
  const char* v = std::getenv("DLPLAN_CPU_CONV");
  return !(v && std::string(v) == "im2col");
}

bool onednn_runs_convolutions(const Model& m) {
  const auto convs = std::count_if(m.nodes.begin(), m.nodes.end(), [](const Node& n) { return n.op == OpKind::conv2d; });
  return convs >= 4 && onednn_conv_enabled();
}

namespace onednn {

using dnnl::memory;
using tag = memory::format_tag;

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

ConvPrimitives make_conv(const ConvGeometry& g, int threads, bool dx, bool dw) {
  omp_set_num_threads(std::max(1, threads));
  const memory::dims src{g.N, g.C, g.H, g.W}, dst{g.N, g.O, g.OH, g.OW};
  const memory::dims weights = g.groups == 1 ? memory::dims{g.O, g.C, g.kh, g.kw}
                                             : memory::dims{g.groups, g.O / g.groups, g.C / g.groups, g.kh, g.kw};
  // oneDNN counts dilation from 0 (no gap between taps), PyTorch from 1.
  const memory::dims stride{g.sh, g.sw}, pad{g.ph, g.pw}, dilates{g.dh - 1, g.dw - 1};
  const auto f32 = memory::data_type::f32;
  ConvPrimitives p;
  p.src = memory::desc(src, f32, tag::nchw);
  p.dst = memory::desc(dst, f32, tag::nchw);
  p.weights = memory::desc(weights, f32, g.groups == 1 ? tag::oihw : tag::goihw);
  p.bias = memory::desc({g.O}, f32, tag::x);
  // "any": oneDNN picks the layouts its fastest kernel wants.
  const memory::desc src_any(src, f32, tag::any), dst_any(dst, f32, tag::any), weights_any(weights, f32, tag::any);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const auto algo = dnnl::algorithm::convolution_direct;
  auto& eng = cpu_engine();
  const auto fwd = g.bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src_any,
                                                            weights_any, p.bias, dst_any, stride, dilates, pad, pad)
                          : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src_any,
                                                            weights_any, dst_any, stride, dilates, pad, pad);
  p.fwd = dnnl::convolution_forward::primitive_desc(fwd, attr, eng);
  if (dx)
    p.bwd_data = dnnl::convolution_backward_data::primitive_desc(
        dnnl::convolution_backward_data::desc(algo, src_any, weights_any, dst_any, stride, dilates, pad, pad), attr,
        eng, p.fwd);
  if (dw)  // the bias gradient is a plain sum that the engine does itself
    p.bwd_weights = dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(algo, src_any, weights_any, dst_any, stride, dilates, pad, pad), attr,
        eng, p.fwd);
  return p;
}

}  // namespace onednn

namespace {

using dnnl::memory;

// The buffers' names and order are the contract with executor/cpu/ops_conv_onednn.cpp.
struct Lister {
  std::vector<ConvBuffer> out;
  void copy_if(const char* what, const memory::desc& wanted, const memory::desc& own) {
    if (wanted != own) out.push_back({what, static_cast<int64_t>(wanted.get_size())});
  }
  void always(const char* what, const memory::desc& d) {
    if (d.get_size() > 0) out.push_back({what, static_cast<int64_t>(d.get_size())});
  }
};

// The planner's callers keep their own OpenMP setting.
struct KeepThreads {
  int saved = omp_get_max_threads();
  ~KeepThreads() { omp_set_num_threads(saved); }
};

// A plan search builds a step program per candidate, and each asked oneDNN
// for every convolution again: ResNet-18's cpu search took 2.7 s instead of
// 0.2 s. The answers depend only on the arguments, so they are kept.
using Key = std::array<int64_t, 20>;
Key key_of(const ConvGeometry& g, int threads, int kind) {
  return {g.N,  g.C,  g.H,      g.W,    g.O,     g.OH,  g.OW, g.kh, g.kw, g.sh, g.sw,
          g.ph, g.pw, g.groups, g.bias, threads, kind, 0,    g.dh, g.dw};
}
template <class F>
std::optional<std::vector<ConvBuffer>> remembered(const Key& k, F query) {
  static std::mutex m;
  static std::map<Key, std::optional<std::vector<ConvBuffer>>> seen;
  {
    std::lock_guard lock(m);
    if (auto it = seen.find(k); it != seen.end()) return it->second;
  }
  auto answer = query();
  std::lock_guard lock(m);
  return seen.emplace(k, std::move(answer)).first->second;
}

std::optional<std::vector<ConvBuffer>> forward_buffers(const ConvGeometry& g, int threads) try {
  KeepThreads keep;
  const auto p = onednn::make_conv(g, threads, false, false);
  Lister l;
  l.copy_if("onednn.src", p.fwd.src_desc(), p.src);
  l.copy_if("onednn.weights", p.fwd.weights_desc(), p.weights);
  l.copy_if("onednn.dst", p.fwd.dst_desc(), p.dst);
  l.always("onednn.scratchpad", p.fwd.scratchpad_desc());
  return l.out;
} catch (const dnnl::error&) {
  return std::nullopt;  // no kernel for it (oneDNN says "unimplemented" or "invalid arguments")
}

std::optional<std::vector<ConvBuffer>> backward_buffers(const ConvGeometry& g, int threads, bool dx, bool dw) try {
  KeepThreads keep;
  const auto p = onednn::make_conv(g, threads, dx, dw);
  Lister l;
  if (dw) {
    l.copy_if("onednn.src", p.bwd_weights.src_desc(), p.src);
    l.copy_if("onednn.diff_dst", p.bwd_weights.diff_dst_desc(), p.dst);
    l.always("onednn.diff_weights", p.bwd_weights.diff_weights_desc());  // accumulated into dW afterwards
    l.always("onednn.scratchpad_w", p.bwd_weights.scratchpad_desc());
  }
  if (dx) {
    l.copy_if("onednn.weights", p.bwd_data.weights_desc(), p.weights);
    // The weight gradient's blocked dy serves here too when the layouts agree.
    if (!(dw && p.bwd_data.diff_dst_desc() == p.bwd_weights.diff_dst_desc()))
      l.copy_if("onednn.diff_dst_d", p.bwd_data.diff_dst_desc(), p.dst);
    l.always("onednn.diff_src", p.bwd_data.diff_src_desc());  // accumulated into dx afterwards
    l.always("onednn.scratchpad_d", p.bwd_data.scratchpad_desc());
  }
  return l.out;
} catch (const dnnl::error&) {
  return std::nullopt;
}

}  // namespace

std::optional<std::vector<ConvBuffer>> onednn_conv_forward_buffers(const ConvGeometry& g, int threads) {
  return remembered(key_of(g, threads, 0), [&] { return forward_buffers(g, threads); });
}

std::optional<std::vector<ConvBuffer>> onednn_conv_backward_buffers(const ConvGeometry& g, int threads, bool dx,
                                                                   bool dw) {
  return remembered(key_of(g, threads, 1 + dx + 2 * dw), [&] { return backward_buffers(g, threads, dx, dw); });
}

#else

bool onednn_conv_enabled() { return false; }
bool onednn_runs_convolutions(const Model&) { return false; }
std::optional<std::vector<ConvBuffer>> onednn_conv_forward_buffers(const ConvGeometry&, int) { return std::nullopt; }
std::optional<std::vector<ConvBuffer>> onednn_conv_backward_buffers(const ConvGeometry&, int, bool, bool) {
  return std::nullopt;
}

#endif

}  // namespace dlplan
