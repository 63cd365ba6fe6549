// conv2d on the cpu device in fp32 through oneDNN (planner/include/dlplan/
// cpu_conv.hpp): the whole micro-batch in one primitive, in the layouts
// oneDNN's kernels want. Inputs, outputs and weights are reordered into the
// declared temporaries where those layouts differ from dlplan's NCHW, and
// gradients are computed into temporaries and then added (a reorder with a sum
// post-op) to dx and dW, which accumulate as every backward does (ops.hpp).
// The temporaries are exactly the declaration's, allocated in its order.
#include "cpu/ops.hpp"
#include "cpu/parallel.hpp"

#ifdef DLPLAN_HAVE_ONEDNN
#include "dlplan/conv_window.hpp"
#include "dlplan/onednn_conv.hpp"

#include <map>

namespace dlplan::exec::cpu {
namespace {

using dnnl::memory;

ConvGeometry conv_geometry(const OpContext& c) {  // a 1-D convolution's [C, L] as [C, 1, L]
  const Shape& y = out_shape(c);
  const ConvWindow w = conv_window(in_shape(c, 0), c.node->attrs);
  return {c.batch, w.C,  w.H,  w.W,  y[0], w.one_d ? 1 : y[1], y.back(), w.kh, w.kw, w.sh, w.sw, w.ph, w.pw,
          c.node->attrs.integer("groups"), c.node->attrs.flag("bias"), w.dh, w.dw};
}

// The op's declared temporaries by name. A buffer oneDNN wants that the plan
// did not declare (a launcher bound the rank to fewer cores than the plan
// assumed, and a scratchpad changed size) is allocated beside them, so the
// measured memory shows it.
class Buffers {
 public:
  Buffers(OpContext& c, const std::vector<TempTensor>& declared) : c_(c) {
    for (const TempTensor& t : declared) temps_[t.what] = alloc_temp(c, {t.numel}, t.what);
  }
  void* get(const std::string& what, const memory::desc& d) {
    const int64_t bytes = static_cast<int64_t>(d.get_size());
    auto it = temps_.find(what);
    if (it == temps_.end() || it->second.numel() * 4 < bytes)
      it = temps_.insert_or_assign(what + ".undeclared", alloc_temp(c_, {(bytes + 3) / 4}, what + ".undeclared")).first;
    return it->second.f();
  }

 private:
  OpContext& c_;
  std::map<std::string, Tensor> temps_;
};

struct Run {
  dnnl::engine& eng = onednn::cpu_engine();
  dnnl::stream s{eng};

  // `user` in the layout `wanted`: itself, or a reordered copy in buffer `what`.
  memory in_layout(memory& user, const memory::desc& wanted, Buffers& b, const char* what) {
    if (user.get_desc() == wanted) return user;
    memory m(wanted, eng, b.get(what, wanted));
    dnnl::reorder(user, m).execute(s, user, m);
    return m;
  }
  // A result buffer in `layout`: `user` itself when the layouts agree.
  memory out_layout(memory& user, const memory::desc& layout, Buffers& b, const char* what) {
    if (user.get_desc() == layout) return user;
    return memory(layout, eng, b.get(what, layout));
  }
  void copy(memory& from, memory& to) { dnnl::reorder(from, to).execute(s, from, to); }
  // to += from (layouts may differ).
  void accumulate(memory& from, memory& to) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(po);
    dnnl::reorder(dnnl::reorder::primitive_desc(eng, from.get_desc(), eng, to.get_desc(), attr)).execute(s, from, to);
  }
  memory scratchpad(const memory::desc& d, Buffers& b, const char* what) {
    return d.get_size() > 0 ? memory(d, eng, b.get(what, d)) : memory(d, eng, nullptr);
  }
};

// The plan was made where oneDNN had a kernel for this convolution; this
// machine's oneDNN has none (another instruction set) or failed.
[[noreturn]] void onednn_failed(const OpContext& c, const dnnl::error& e) {
  op_error(c, std::string("oneDNN cannot run this convolution here (") + e.what() +
                  "); make the plan on this machine, or with DLPLAN_CPU_CONV=im2col");
}

}  // namespace

void conv2d_forward_onednn(OpContext& c) try {
  const ConvGeometry g = conv_geometry(c);
  const auto p = onednn::make_conv(g, cpu_threads(), false, false);
  Buffers b(c, c.decl->fwd_temps);
  Run r;
  memory x(p.src, r.eng, c.in[0].f()), w(p.weights, r.eng, c.params[0].f()), y(p.dst, r.eng, c.out.f());
  memory xs = r.in_layout(x, p.fwd.src_desc(), b, "onednn.src");
  memory ws = r.in_layout(w, p.fwd.weights_desc(), b, "onednn.weights");
  memory ys = r.out_layout(y, p.fwd.dst_desc(), b, "onednn.dst");
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, xs},
                                       {DNNL_ARG_WEIGHTS, ws},
                                       {DNNL_ARG_DST, ys},
                                       {DNNL_ARG_SCRATCHPAD, r.scratchpad(p.fwd.scratchpad_desc(), b, "onednn.scratchpad")}};
  if (g.bias) args.insert({DNNL_ARG_BIAS, memory(p.bias, r.eng, c.params[1].f())});
  dnnl::convolution_forward(p.fwd).execute(r.s, args);
  if (ys != y) r.copy(ys, y);
  r.s.wait();
} catch (const dnnl::error& e) {
  onednn_failed(c, e);
}

void conv2d_backward_onednn(OpContext& c) try {
  const ConvGeometry g = conv_geometry(c);
  float* dw = grad_or_null(c.dparams[0]);
  float* dx = grad_or_null(c.din[0]);
  const auto p = onednn::make_conv(g, cpu_threads(), dx != nullptr, dw != nullptr);
  Buffers b(c, c.decl->bwd_temps);
  Run r;
  memory dy(p.dst, r.eng, c.dout.f());
  memory dy_w;  // dy in the weight gradient's layout, reused by the input gradient when it is the same
  if (dw) {
    memory x(p.src, r.eng, c.in[0].f()), dw_user(p.weights, r.eng, dw);
    memory xs = r.in_layout(x, p.bwd_weights.src_desc(), b, "onednn.src");
    dy_w = r.in_layout(dy, p.bwd_weights.diff_dst_desc(), b, "onednn.diff_dst");
    memory dws(p.bwd_weights.diff_weights_desc(), r.eng, b.get("onednn.diff_weights", p.bwd_weights.diff_weights_desc()));
    dnnl::convolution_backward_weights(p.bwd_weights)
        .execute(r.s, {{DNNL_ARG_SRC, xs},
                       {DNNL_ARG_DIFF_DST, dy_w},
                       {DNNL_ARG_DIFF_WEIGHTS, dws},
                       {DNNL_ARG_SCRATCHPAD, r.scratchpad(p.bwd_weights.scratchpad_desc(), b, "onednn.scratchpad_w")}});
    r.accumulate(dws, dw_user);
  }
  if (dx) {
    memory w(p.weights, r.eng, c.params[0].f()), dx_user(p.src, r.eng, dx);
    memory ws = r.in_layout(w, p.bwd_data.weights_desc(), b, "onednn.weights");
    memory dys = dw && p.bwd_data.diff_dst_desc() == p.bwd_weights.diff_dst_desc()
                     ? dy_w
                     : r.in_layout(dy, p.bwd_data.diff_dst_desc(), b, "onednn.diff_dst_d");
    memory dxs(p.bwd_data.diff_src_desc(), r.eng, b.get("onednn.diff_src", p.bwd_data.diff_src_desc()));
    dnnl::convolution_backward_data(p.bwd_data)
        .execute(r.s, {{DNNL_ARG_DIFF_DST, dys},
                       {DNNL_ARG_WEIGHTS, ws},
                       {DNNL_ARG_DIFF_SRC, dxs},
                       {DNNL_ARG_SCRATCHPAD, r.scratchpad(p.bwd_data.scratchpad_desc(), b, "onednn.scratchpad_d")}});
    r.accumulate(dxs, dx_user);
  }
  r.s.wait();
  conv2d_bias_grad(c, g.O, g.OH * g.OW);
} catch (const dnnl::error& e) {
  onednn_failed(c, e);
}

}  // namespace dlplan::exec::cpu

#else

namespace dlplan::exec::cpu {
void conv2d_forward_onednn(OpContext& c) { op_error(c, "this build has no oneDNN, but the plan's convolutions use it"); }
void conv2d_backward_onednn(OpContext& c) { op_error(c, "this build has no oneDNN, but the plan's convolutions use it"); }
}  // namespace dlplan::exec::cpu

#endif
