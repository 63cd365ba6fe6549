// Convolution and pooling over [b, C, H, W] (NCHW, PyTorch's layout).
//
// conv2d lowers to GEMM through im2col (Chellapilla et al. 2006): per sample
// and group g, out_g [O/g, P] = W_g [O/g, K] x col_g [K, P], with
// K = (C/g) kh kw and P = OH OW. The column buffer is the declaration's
// "im2col" temporary (ops_decl.cpp), [C kh kw, P] reused per sample; backward rebuilds it for
// the weight gradient and then reuses it, sample by sample, for the column
// gradient that col2im scatters back into dx. A 1x1 convolution with stride 1
// and no padding needs no columns: the input already is the [C, P] matrix.
#include "cpu/ops.hpp"
#include "cpu/parallel.hpp"
#include "dlplan/conv_window.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace dlplan::exec::cpu {
namespace {

struct ConvGeom {
  int64_t C, H, W, O, OH, OW, kh, kw, sh, sw, ph, pw, groups;
  int64_t dh = 1, dw = 1;  // conv2d's dilation: tap ki reads row oh sh - ph + ki dh
  int64_t Cg() const { return C / groups; }
  int64_t Og() const { return O / groups; }
  int64_t K() const { return Cg() * kh * kw; }  // GEMM depth per group
  int64_t P() const { return OH * OW; }          // output pixels
  int64_t rows() const { return C * kh * kw; }   // column rows, all groups
  bool direct() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
};

// A 1-D convolution's or pooling's [C, L] runs as [C, 1, L] (conv_window.hpp).
ConvGeom geometry(const OpContext& c) {
  const Shape& y = out_shape(c);
  const ConvWindow w = conv_window(in_shape(c, 0), c.node->attrs);
  const int64_t groups = c.node->op == OpKind::conv2d ? c.node->attrs.integer("groups") : 1;
  return {w.C, w.H, w.W, y[0], w.one_d ? 1 : y[1], y.back(), w.kh, w.kw, w.sh, w.sw, w.ph, w.pw, groups, w.dh, w.dw};
}

// The output columns ow whose input column ow*sw - pw + kj*dw lies inside
// [0, W): [lo, hi). Outside it the columns read padding.
struct ValidColumns {
  int64_t lo, hi;
};
ValidColumns valid_columns(const ConvGeom& g, int64_t kj) {
  const int64_t off = kj * g.dw - g.pw;  // iw = ow * sw + off
  const int64_t lo = off >= 0 ? 0 : (-off + g.sw - 1) / g.sw;
  const int64_t hi = off >= g.W ? 0 : std::min(g.OW, (g.W - 1 - off) / g.sw + 1);
  return {std::min(lo, g.OW), std::max(hi, std::min(lo, g.OW))};
}

// col[(ch, ki, kj), (oh, ow)] = x[ch, oh*sh - ph + ki*dh, ow*sw - pw + kj*dw] (0 outside).
// Row by row: the padding ends are zeroed and the inside copied without bounds checks.
void im2col(const ConvGeom& g, const float* x, float* col) {
  parallel_for(g.C, grain_elements() / (g.kh * g.kw * g.P()) + 1, [&](int64_t ch_begin, int64_t ch_end) {
  for (int64_t ch = ch_begin; ch < ch_end; ++ch)
    for (int64_t ki = 0; ki < g.kh; ++ki)
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        float* row = col + ((ch * g.kh + ki) * g.kw + kj) * g.P();
        const auto [lo, hi] = valid_columns(g, kj);
        const int64_t off = kj * g.dw - g.pw;
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          float* out = row + oh * g.OW;
          const int64_t ih = oh * g.sh - g.ph + ki * g.dh;
          if (ih < 0 || ih >= g.H) {
            std::fill(out, out + g.OW, 0.0f);
            continue;
          }
          const float* in = x + (ch * g.H + ih) * g.W;
          std::fill(out, out + lo, 0.0f);
          if (g.sw == 1)
            std::copy(in + lo + off, in + hi + off, out + lo);
          else
            for (int64_t ow = lo; ow < hi; ++ow) out[ow] = in[ow * g.sw + off];
          std::fill(out + hi, out + g.OW, 0.0f);
        }
      }
  });
}

// The adjoint of im2col: dx[ch, ih, iw] += dcol[(ch, ki, kj), (oh, ow)].
void col2im_add(const ConvGeom& g, const float* dcol, float* dx) {
  parallel_for(g.C, grain_elements() / (g.kh * g.kw * g.P()) + 1, [&](int64_t ch_begin, int64_t ch_end) {
  for (int64_t ch = ch_begin; ch < ch_end; ++ch)  // channel ch's rows add into channel ch only
    for (int64_t ki = 0; ki < g.kh; ++ki)
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        const float* row = dcol + ((ch * g.kh + ki) * g.kw + kj) * g.P();
        const auto [lo, hi] = valid_columns(g, kj);
        const int64_t off = kj * g.dw - g.pw;
        for (int64_t oh = 0; oh < g.OH; ++oh) {
          const int64_t ih = oh * g.sh - g.ph + ki * g.dh;
          if (ih < 0 || ih >= g.H) continue;
          const float* in = row + oh * g.OW;
          float* out = dx + (ch * g.H + ih) * g.W;
          for (int64_t ow = lo; ow < hi; ++ow) out[ow * g.sw + off] += in[ow];
        }
      }
  });
}

}  // namespace

// ---- conv2d --------------------------------------------------------------------
// x: [b, C, H, W]; weight: [O, C/groups, kh, kw]; bias: [O]; out: [b, O, OH, OW].

void conv2d_forward(OpContext& c) {
  if (c.decl && c.decl->onednn_conv) return conv2d_forward_onednn(c);
  const ConvGeom g = geometry(c);
  const bool bias = c.node->attrs.flag("bias");
  const int64_t in_sz = g.C * g.H * g.W, out_sz = g.O * g.P();
  Tensor cols;
  if (!g.direct()) cols = alloc_temp(c, {g.rows(), g.P()}, "im2col");  // reused sample by sample
  Fp32Buffer colbuf(cols);
  const float* w = c.params[0].f();
  for (int64_t s = 0; s < c.batch; ++s) {
    const float* x = c.in[0].f() + s * in_sz;
    float* y = c.out.f() + s * out_sz;
    const float* col = x;  // direct: the input is the [C, P] column matrix
    if (!g.direct()) {
      float* cs = colbuf.data();
      im2col(g, x, cs);
      colbuf.store();  // the columns as stored (bf16 under bf16-mixed), read back by the GEMM
      col = cs;
    }
    if (bias)
      for (int64_t o = 0; o < g.O; ++o)
        for (int64_t p = 0; p < g.P(); ++p) y[o * g.P() + p] = c.params[1].f()[o];
    for (int64_t gi = 0; gi < g.groups; ++gi)
      gemm(false, false, g.Og(), g.P(), g.K(), 1.0f, w + gi * g.Og() * g.K(), g.K(), col + gi * g.K() * g.P(), g.P(),
           bias ? 1.0f : 0.0f, y + gi * g.Og() * g.P(), g.P());
  }
}

void conv2d_bias_grad(OpContext& c, int64_t O, int64_t P) {
  if (!c.node->attrs.flag("bias") || !c.dparams[1].defined()) return;
  float* db = c.dparams[1].f();
  for (int64_t s = 0; s < c.batch; ++s)
    for (int64_t o = 0; o < O; ++o) {
      const float* dy = c.dout.f() + (s * O + o) * P;
      float acc = 0;
      for (int64_t p = 0; p < P; ++p) acc += dy[p];
      db[o] += acc;
    }
}

// dW_g += dy_g col_g^T;  dcol_g = W_g^T dy_g, then dx += col2im(dcol);  dbias += sum_P dy.
void conv2d_backward(OpContext& c) {
  if (c.decl && c.decl->onednn_conv) return conv2d_backward_onednn(c);
  const ConvGeom g = geometry(c);
  const int64_t in_sz = g.C * g.H * g.W, out_sz = g.O * g.P();
  const bool need_dx = c.din[0].defined();
  Tensor cols;
  if (!g.direct()) cols = alloc_temp(c, {g.rows(), g.P()}, "im2col");  // reused sample by sample
  Fp32Buffer colbuf(cols);
  const float* w = c.params[0].f();
  float* dw = grad_or_null(c.dparams[0]);  // null: a frozen weight, whose input is not kept
  for (int64_t s = 0; s < c.batch; ++s) {
    const float* dy = c.dout.f() + s * out_sz;
    float* cs = g.direct() ? nullptr : colbuf.data();
    if (dw) {
      const float* x = c.in[0].f() + s * in_sz;
      const float* col = x;
      if (cs) {
        im2col(g, x, cs);
        colbuf.store();
        col = cs;
      }
      for (int64_t gi = 0; gi < g.groups; ++gi)
        gemm(false, true, g.Og(), g.K(), g.P(), 1.0f, dy + gi * g.Og() * g.P(), g.P(), col + gi * g.K() * g.P(), g.P(),
             1.0f, dw + gi * g.Og() * g.K(), g.K());
    }
    if (!need_dx) continue;
    float* dx = c.din[0].f() + s * in_sz;
    // Direct: the column gradient is dx itself (accumulate); else overwrite
    // this sample's columns (no longer needed) with dcol, then scatter.
    float* dcol = cs ? cs : dx;
    for (int64_t gi = 0; gi < g.groups; ++gi)
      gemm(true, false, g.K(), g.P(), g.Og(), 1.0f, w + gi * g.Og() * g.K(), g.K(), dy + gi * g.Og() * g.P(), g.P(),
           cs ? 0.0f : 1.0f, dcol + gi * g.K() * g.P(), g.P());
    if (cs) {
      colbuf.store();  // dcol as stored
      col2im_add(g, cs, dx);
    }
  }
  conv2d_bias_grad(c, g.O, g.P());
}

// ---- conv_transpose2d -----------------------------------------------------------
// x: [b, C, H, W]; weight: [C, O/groups, kh, kw] (PyTorch's layout); bias: [O];
// out: [b, O, OH, OW] with OH = (H - 1) sh - 2 ph + kh + output_padding.
// A transposed convolution is conv2d's input gradient: the convolution with
// the same kernel, stride and padding from out's shape to x's maps y to x,
// and this op maps x back. So it runs on that adjoint convolution's geometry
// (input O x OH x OW, output C x H x W), swapping conv2d's passes: per sample
// and group, columns [O/g kh kw, H W] = W_g^T x_g scattered into y by col2im;
// backward gathers dy's columns by im2col, then dx_g = W_g dcol_g and
// dW_g += x_g dcol_g^T. Output rows and columns no window reaches (an
// output_padding) get the bias alone, as in PyTorch.

namespace {
ConvGeom transposed_geometry(const OpContext& c) {
  const Shape& y = out_shape(c);
  const ConvWindow w = conv_window(in_shape(c, 0), c.node->attrs);
  return {y[0],    w.one_d ? 1 : y[1], y.back(), w.C, w.H, w.W, w.kh, w.kw, w.sh, w.sw, w.ph, w.pw,
          c.node->attrs.integer("groups")};
}
}  // namespace

void conv_transpose2d_forward(OpContext& c) {
  const ConvGeom t = transposed_geometry(c);  // the adjoint convolution: y -> x
  const int64_t x_sz = t.O * t.P(), y_sz = t.C * t.H * t.W, y_plane = t.H * t.W;
  Tensor cols = alloc_temp(c, {t.rows(), t.P()}, "col2im");  // reused sample by sample
  Fp32Buffer colbuf(cols);
  const float* w = c.params[0].f();
  const bool bias = c.node->attrs.flag("bias");
  for (int64_t s = 0; s < c.batch; ++s) {
    const float* x = c.in[0].f() + s * x_sz;
    float* y = c.out.f() + s * y_sz;
    float* cs = colbuf.data();
    for (int64_t gi = 0; gi < t.groups; ++gi)
      gemm(true, false, t.K(), t.P(), t.Og(), 1.0f, w + gi * t.Og() * t.K(), t.K(), x + gi * t.Og() * t.P(), t.P(),
           0.0f, cs + gi * t.K() * t.P(), t.P());
    colbuf.store();  // the columns as stored (bf16 under bf16-mixed)
    for (int64_t o = 0; o < t.C; ++o)
      std::fill(y + o * y_plane, y + (o + 1) * y_plane, bias ? c.params[1].f()[o] : 0.0f);
    col2im_add(t, cs, y);
  }
}

void conv_transpose2d_backward(OpContext& c) {
  const ConvGeom t = transposed_geometry(c);
  const int64_t x_sz = t.O * t.P(), y_sz = t.C * t.H * t.W;
  const bool need_dx = c.din[0].defined();
  float* dw = grad_or_null(c.dparams[0]);  // null: a frozen weight, whose input is not kept
  Tensor cols = alloc_temp(c, {t.rows(), t.P()}, "im2col");  // reused sample by sample
  Fp32Buffer colbuf(cols);
  const float* w = c.params[0].f();
  for (int64_t s = 0; s < c.batch && (need_dx || dw); ++s) {
    float* dcol = colbuf.data();
    im2col(t, c.dout.f() + s * y_sz, dcol);
    colbuf.store();  // dy's columns as stored
    for (int64_t gi = 0; gi < t.groups; ++gi) {
      const float* dcol_g = dcol + gi * t.K() * t.P();
      if (dw)
        gemm(false, true, t.Og(), t.K(), t.P(), 1.0f, c.in[0].f() + s * x_sz + gi * t.Og() * t.P(), t.P(), dcol_g,
             t.P(), 1.0f, dw + gi * t.Og() * t.K(), t.K());
      if (need_dx)
        gemm(false, false, t.Og(), t.P(), t.K(), 1.0f, w + gi * t.Og() * t.K(), t.K(), dcol_g, t.P(), 1.0f,
             c.din[0].f() + s * x_sz + gi * t.Og() * t.P(), t.P());
    }
  }
  conv2d_bias_grad(c, t.C, t.H * t.W);
}

// ---- maxpool2d -----------------------------------------------------------------
// x: [b, C, H, W] -> out: [b, C, OH, OW]; padding counts as -inf (PyTorch).
// Saves argmax, the flat h*W + w of the winner in its plane: int32, or under
// the `eager` attribute int64 as PyTorch keeps it (the input is then kept as
// well, by the step program: ops_decl.cpp).

namespace {

// One output of a window that may reach into the padding: the general form.
// Windows are visited in row-major order and a NaN wins (PyTorch's rule).
template <typename Index>
void maxpool_window(const ConvGeom& g, const float* x, int64_t oh, int64_t ow, float& best_out, Index& arg_out) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t arg = -1;
  for (int64_t ki = 0; ki < g.kh; ++ki) {
    const int64_t ih = oh * g.sh - g.ph + ki;
    if (ih < 0 || ih >= g.H) continue;
    for (int64_t kj = 0; kj < g.kw; ++kj) {
      const int64_t iw = ow * g.sw - g.pw + kj;
      if (iw < 0 || iw >= g.W) continue;
      const float v = x[ih * g.W + iw];
      if (arg < 0 || v > best || v != v) {
        best = v;
        arg = ih * g.W + iw;
      }
    }
  }
  best_out = best;
  arg_out = static_cast<Index>(arg);
}

// The outputs [lo, hi) of row oh, whose windows lie inside the plane: each
// window element is compared across the whole run of outputs with a select
// instead of a branch. A branch on "v > best" mispredicts on most inputs;
// the branchy loop made ResNet-18's max pool (8 x 64 x 112 x 112 in) take
// 14.7 ms on 2 threads, its single largest op. Same order, same winner.
template <typename Index>
void maxpool_interior_row(const ConvGeom& g, const float* __restrict x, int64_t oh, int64_t lo, int64_t hi,
                          float* __restrict y, Index* __restrict am) {
  const int64_t ih0 = oh * g.sh - g.ph;
  for (int64_t ow = lo; ow < hi; ++ow) {
    const int64_t at = ih0 * g.W + ow * g.sw - g.pw;
    y[ow] = x[at];
    am[ow] = static_cast<Index>(at);
  }
  for (int64_t ki = 0; ki < g.kh; ++ki)
    for (int64_t kj = 0; kj < g.kw; ++kj) {
      if (ki == 0 && kj == 0) continue;
      const int64_t offset = (ih0 + ki) * g.W + kj - g.pw;
      for (int64_t ow = lo; ow < hi; ++ow) {
        const int64_t at = offset + ow * g.sw;
        const float v = x[at];
        const bool take = v > y[ow] || v != v;  // NaN propagates, as in PyTorch
        y[ow] = take ? v : y[ow];
        am[ow] = take ? static_cast<Index>(at) : am[ow];
      }
    }
}

template <typename Index>
void maxpool2d_forward_as(OpContext& c, Index* am_all) {
  const ConvGeom g = geometry(c);
  const int64_t planes = c.batch * g.C;
  // The outputs whose windows lie inside the plane's columns: iw0 = ow sw - pw
  // >= 0 and iw0 + kw <= W.
  const int64_t ow_lo = std::min(g.OW, (g.pw + g.sw - 1) / g.sw);
  const int64_t ow_hi = std::max(ow_lo, std::min(g.OW, g.W + g.pw - g.kw >= 0 ? (g.W + g.pw - g.kw) / g.sw + 1 : 0));
  parallel_for(planes, grain_elements() / (g.P() * g.kh * g.kw) + 1, [&](int64_t pl_begin, int64_t pl_end) {
    for (int64_t pl = pl_begin; pl < pl_end; ++pl) {
      const float* x = c.in[0].f() + pl * g.H * g.W;
      float* y = c.out.f() + pl * g.P();
      Index* am = am_all + pl * g.P();
      for (int64_t oh = 0; oh < g.OH; ++oh) {
        float* yr = y + oh * g.OW;
        Index* ar = am + oh * g.OW;
        const int64_t ih0 = oh * g.sh - g.ph;
        const bool rows_inside = ih0 >= 0 && ih0 + g.kh <= g.H;
        const int64_t lo = rows_inside ? ow_lo : g.OW, hi = rows_inside ? ow_hi : g.OW;
        for (int64_t ow = 0; ow < lo; ++ow) maxpool_window(g, x, oh, ow, yr[ow], ar[ow]);
        if (lo < hi) maxpool_interior_row(g, x, oh, lo, hi, yr, ar);
        for (int64_t ow = std::max(lo, hi); ow < g.OW; ++ow) maxpool_window(g, x, oh, ow, yr[ow], ar[ow]);
      }
    }
  });
}

template <typename Index>
void maxpool2d_backward_as(OpContext& c, const Index* am) {
  const ConvGeom g = geometry(c);
  const int64_t planes = c.batch * g.C;
  parallel_for(planes, grain_elements() / g.P() + 1, [&](int64_t pl_begin, int64_t pl_end) {
    for (int64_t pl = pl_begin; pl < pl_end; ++pl) {  // a plane's winners lie in its own input plane
      float* dx = c.din[0].f() + pl * g.H * g.W;
      const float* dy = c.dout.f() + pl * g.P();
      for (int64_t p = 0; p < g.P(); ++p) dx[am[pl * g.P() + p]] += dy[p];
    }
  });
}

bool torch_indices(const OpContext& c) { return c.node->attrs.has("eager") && c.node->attrs.flag("eager"); }

}  // namespace

void maxpool2d_forward(OpContext& c) {
  const Shape shape = batched(c.batch, out_shape(c));
  if (torch_indices(c)) {
    Tensor argmax = alloc_saved_bytes(c, numel(shape) * static_cast<int64_t>(sizeof(int64_t)), "argmax");
    maxpool2d_forward_as(c, static_cast<int64_t*>(argmax.data()));
    c.saved.push_back(std::move(argmax));
  } else {
    Tensor argmax = alloc_saved(c, shape, DType::i32, "argmax");
    maxpool2d_forward_as(c, argmax.i());
    c.saved.push_back(std::move(argmax));
  }
}

void maxpool2d_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  if (torch_indices(c))
    maxpool2d_backward_as(c, static_cast<const int64_t*>(c.saved[0].data()));
  else
    maxpool2d_backward_as(c, c.saved[0].i());
}

// ---- avgpool2d -----------------------------------------------------------------
// count_include_pad = true: every window divides by kh kw (floor mode keeps
// each window inside the padded input, so this equals PyTorch's divisor).

// What output (oh, ow) is multiplied by: 1 / the window's size, or with
// count_include_pad false (PyTorch's nn.AvgPool2d(count_include_pad=False),
// PoolFormer's) 1 / the number of its elements inside the input.
struct AvgpoolScale {
  AvgpoolScale(const OpContext& c, const ConvGeom& g)
      : g_(g),
        include_pad_(!c.node->attrs.has("count_include_pad") || c.node->attrs.flag("count_include_pad")),
        full_(1.0f / static_cast<float>(g.kh * g.kw)) {}
  float operator()(int64_t oh, int64_t ow) const {
    if (include_pad_) return full_;
    const int64_t h0 = std::max<int64_t>(oh * g_.sh - g_.ph, 0), h1 = std::min(oh * g_.sh - g_.ph + g_.kh, g_.H);
    const int64_t w0 = std::max<int64_t>(ow * g_.sw - g_.pw, 0), w1 = std::min(ow * g_.sw - g_.pw + g_.kw, g_.W);
    return 1.0f / static_cast<float>(std::max<int64_t>(h1 - h0, 1) * std::max<int64_t>(w1 - w0, 1));
  }
  const ConvGeom& g_;
  bool include_pad_;
  float full_;
};

void avgpool2d_forward(OpContext& c) {
  const ConvGeom g = geometry(c);
  const AvgpoolScale scale(c, g);
  const int64_t planes = c.batch * g.C;
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* x = c.in[0].f() + pl * g.H * g.W;
    float* y = c.out.f() + pl * g.P();
    for (int64_t oh = 0; oh < g.OH; ++oh)
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        float acc = 0;
        for (int64_t ki = 0; ki < g.kh; ++ki) {
          const int64_t ih = oh * g.sh - g.ph + ki;
          if (ih < 0 || ih >= g.H) continue;
          for (int64_t kj = 0; kj < g.kw; ++kj) {
            const int64_t iw = ow * g.sw - g.pw + kj;
            if (iw >= 0 && iw < g.W) acc += x[ih * g.W + iw];
          }
        }
        y[oh * g.OW + ow] = acc * scale(oh, ow);
      }
  }
}

void avgpool2d_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const ConvGeom g = geometry(c);
  const AvgpoolScale scale(c, g);
  const int64_t planes = c.batch * g.C;
  for (int64_t pl = 0; pl < planes; ++pl) {
    float* dx = c.din[0].f() + pl * g.H * g.W;
    const float* dy = c.dout.f() + pl * g.P();
    for (int64_t oh = 0; oh < g.OH; ++oh)
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const float d = dy[oh * g.OW + ow] * scale(oh, ow);
        for (int64_t ki = 0; ki < g.kh; ++ki) {
          const int64_t ih = oh * g.sh - g.ph + ki;
          if (ih < 0 || ih >= g.H) continue;
          for (int64_t kj = 0; kj < g.kw; ++kj) {
            const int64_t iw = ow * g.sw - g.pw + kj;
            if (iw >= 0 && iw < g.W) dx[ih * g.W + iw] += d;
          }
        }
      }
  }
}

// ---- global_avgpool ------------------------------------------------------------
// x: [b, C, H, W] -> out: [b, C], the mean of each plane.

// The mean of each channel's plane: [H, W], or [L] (1-D).
void global_avgpool_forward(OpContext& c) {
  const Shape& x = in_shape(c, 0);
  const int64_t planes = c.batch * x[0], hw = numel(x) / x[0];
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* xp = c.in[0].f() + pl * hw;
    double acc = 0;
    for (int64_t i = 0; i < hw; ++i) acc += xp[i];
    c.out.f()[pl] = static_cast<float>(acc / static_cast<double>(hw));
  }
}

void global_avgpool_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  const Shape& x = in_shape(c, 0);
  const int64_t planes = c.batch * x[0], hw = numel(x) / x[0];
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float d = c.dout.f()[pl] / static_cast<float>(hw);
    float* dx = c.din[0].f() + pl * hw;
    for (int64_t i = 0; i < hw; ++i) dx[i] += d;
  }
}

// ---- upsample (nearest) ---------------------------------------------------------
// y[c, i, j] = x[c, i / s_h, j / s_w] (ONNX Resize, nearest, asymmetric,
// floor: PyTorch's upsample_nearest2d at a whole factor). Backward adds each
// s_h x s_w block of dy into its source element. [C, L] runs as [C, 1, L].

namespace {
// The input as rows of W (every channel's every row, over the batch); input
// row r becomes the s_h output rows of W s_w starting at r s_h.
struct UpsampleRows {
  int64_t rows, W, sh, sw;
  int64_t out_width() const { return W * sw; }
  int64_t grain() const { return grain_elements() / (W * sh * sw) + 1; }
};
UpsampleRows upsample_rows(const OpContext& c) {
  const Shape& x = in_shape(c, 0);
  const auto s = upsample_factors(x, c.node->attrs);
  return {c.batch * numel(x) / x.back(), x.back(), s[0], s[1]};
}

void nearest_forward(OpContext& c) {
  const UpsampleRows u = upsample_rows(c);
  parallel_for(u.rows, u.grain(), [&](int64_t r_begin, int64_t r_end) {
    for (int64_t r = r_begin; r < r_end; ++r) {
      const float* x = c.in[0].f() + r * u.W;
      float* y = c.out.f() + r * u.sh * u.out_width();
      for (int64_t j = 0; j < u.out_width(); ++j) y[j] = x[j / u.sw];
      for (int64_t k = 1; k < u.sh; ++k) std::copy(y, y + u.out_width(), y + k * u.out_width());
    }
  });
}

void nearest_backward(OpContext& c) {
  const UpsampleRows u = upsample_rows(c);
  parallel_for(u.rows, u.grain(), [&](int64_t r_begin, int64_t r_end) {
    for (int64_t r = r_begin; r < r_end; ++r) {
      const float* dy = c.dout.f() + r * u.sh * u.out_width();
      float* dx = c.din[0].f() + r * u.W;
      for (int64_t j = 0; j < u.W; ++j) {
        float acc = 0;
        for (int64_t k = 0; k < u.sh; ++k)
          for (int64_t l = 0; l < u.sw; ++l) acc += dy[k * u.out_width() + j * u.sw + l];
        dx[j] += acc;
      }
    }
  });
}

// ---- upsample (linear) ----------------------------------------------------------
// PyTorch's upsample_linear1d and upsample_bilinear2d (ATen's UpSample.h,
// area_pixel_compute_source_index and compute_source_index_and_lambda).
// Along an axis of `in` elements grown to `out`, output index o reads the
// source position
//   src = max((o + 0.5) in / out - 0.5, 0)      align_corners false
//   src = o (in - 1) / (out - 1)                align_corners true
// and blends i0 = floor(src) and i1 = min(i0 + 1, in - 1) with weights
// 1 - l and l, l = src - i0; equal sizes copy. Over [H, W] the two axes'
// blends nest: y = lh0 (lw0 x00 + lw1 x01) + lh1 (lw0 x10 + lw1 x11), in
// PyTorch's order. [C, L] runs as [C, 1, L], whose one row copies.
struct LinearTap {
  int64_t i0, i1;
  float l0, l1;
};

std::vector<LinearTap> linear_taps(int64_t in, int64_t out, bool align_corners) {
  std::vector<LinearTap> taps(static_cast<size_t>(out));
  const float scale = align_corners ? (out > 1 ? static_cast<float>(in - 1) / static_cast<float>(out - 1) : 0.f)
                                    : static_cast<float>(in) / static_cast<float>(out);
  for (int64_t o = 0; o < out; ++o) {
    if (in == out) {
      taps[static_cast<size_t>(o)] = {o, o, 1.f, 0.f};
      continue;
    }
    const float of = static_cast<float>(o);
    const float src = align_corners ? scale * of : std::max(scale * (of + 0.5f) - 0.5f, 0.f);
    const auto i0 = static_cast<int64_t>(src);
    const float l1 = std::clamp(src - static_cast<float>(i0), 0.f, 1.f);
    taps[static_cast<size_t>(o)] = {i0, i0 + (i0 < in - 1 ? 1 : 0), 1.f - l1, l1};
  }
  return taps;
}

// Planes of H x W (every channel over the batch) grown to OH x OW.
struct LinearPlanes {
  int64_t planes, H, W, OH, OW;
  std::vector<LinearTap> rows, cols;
};
LinearPlanes linear_planes(const OpContext& c) {
  const Shape& x = in_shape(c, 0);
  const auto s = upsample_factors(x, c.node->attrs);
  const bool corners = c.node->attrs.flag("align_corners");
  const int64_t H = x.size() == 2 ? 1 : x[1], W = x.back();
  return {c.batch * x[0], H, W, H * s[0], W * s[1], linear_taps(H, H * s[0], corners), linear_taps(W, W * s[1], corners)};
}

void resample_linear_forward(OpContext& c) {
  const LinearPlanes p = linear_planes(c);
  const int64_t out_rows = p.planes * p.OH;
  parallel_for(out_rows, grain_elements() / p.OW + 1, [&](int64_t r_begin, int64_t r_end) {
    for (int64_t r = r_begin; r < r_end; ++r) {
      const LinearTap& th = p.rows[static_cast<size_t>(r % p.OH)];
      const float* plane = c.in[0].f() + (r / p.OH) * p.H * p.W;
      const float* x0 = plane + th.i0 * p.W;
      const float* x1 = plane + th.i1 * p.W;
      float* y = c.out.f() + r * p.OW;
      for (int64_t j = 0; j < p.OW; ++j) {
        const LinearTap& tw = p.cols[static_cast<size_t>(j)];
        y[j] = th.l0 * (tw.l0 * x0[tw.i0] + tw.l1 * x0[tw.i1]) + th.l1 * (tw.l0 * x1[tw.i0] + tw.l1 * x1[tw.i1]);
      }
    }
  });
}

// Each output gradient goes back to the (up to) four elements it blended,
// with the same weights. A plane's outputs only reach that plane's inputs, so
// planes run in parallel.
void resample_linear_backward(OpContext& c) {
  const LinearPlanes p = linear_planes(c);
  parallel_for(p.planes, grain_elements() / (p.OH * p.OW) + 1, [&](int64_t pl_begin, int64_t pl_end) {
    for (int64_t pl = pl_begin; pl < pl_end; ++pl) {
      float* dx = c.din[0].f() + pl * p.H * p.W;
      const float* dy = c.dout.f() + pl * p.OH * p.OW;
      for (int64_t i = 0; i < p.OH; ++i) {
        const LinearTap& th = p.rows[static_cast<size_t>(i)];
        float* dx0 = dx + th.i0 * p.W;
        float* dx1 = dx + th.i1 * p.W;
        for (int64_t j = 0; j < p.OW; ++j) {
          const LinearTap& tw = p.cols[static_cast<size_t>(j)];
          const float g = dy[i * p.OW + j];
          dx0[tw.i0] += th.l0 * tw.l0 * g;
          dx0[tw.i1] += th.l0 * tw.l1 * g;
          dx1[tw.i0] += th.l1 * tw.l0 * g;
          dx1[tw.i1] += th.l1 * tw.l1 * g;
        }
      }
    }
  });
}

bool linear_mode(const OpContext& c) { return c.node->attrs.text("mode") == "linear"; }
}  // namespace

void upsample_forward(OpContext& c) { linear_mode(c) ? resample_linear_forward(c) : nearest_forward(c); }

void upsample_backward(OpContext& c) {
  if (!c.din[0].defined()) return;
  linear_mode(c) ? resample_linear_backward(c) : nearest_backward(c);
}

}  // namespace dlplan::exec::cpu
