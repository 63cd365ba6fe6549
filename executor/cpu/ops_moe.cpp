// Mixture of experts with top-k routing and a fixed capacity per expert, as
// three kinds of node (ops.hpp, MoeRouting; ops_decl.cpp says what each
// keeps). Per sample, T tokens x of width D, E experts:
//
//   moe_router:  p = softmax_rows(x Wg^T) [T, E]
//   routing (moe_expert and moe_combine, from p alone):
//     chosen_t = the top_k experts of p_t, best first (lower index on ties)
//     places: choice rank j = 0 first, then 1, ...; within a rank, tokens in
//       order (GShard's position-in-expert); a choice whose expert already
//       has C tokens is dropped: that expert adds nothing to the token
//   moe_expert e: X_e = the tokens routed to e, in place order (empty places
//     zero); h1 = X_e W1^T, h3 = X_e W3^T, act = silu(h1) * h3,
//     out_e = act W2^T [C, D]
//   moe_combine: gate_tj = p_t[chosen_tj], divided by sum_j p_t[chosen_tj]
//     if normalize; y_t = sum_j gate_tj out_{chosen_tj}[place_tj] over the
//     choices not dropped
//
// Mixtral trains dropless (every token reaches its k experts); a capacity
// factor of E / k or more drops nothing here and computes the same.
//
// Backward: the combine gives d out_e[place] = gate dy_t and d gate_tj =
// dy_t . out[place], which goes back through the renormalisation
// (d p_j = (d g_j - sum_i d g_i g_i) / S over the chosen j, S their sum) to
// d p; each expert its SwiGLU MLP's gradients, scattering d X_e back to the
// tokens it took; the router the softmax's (d logits = p (d p - sum p d p))
// to Wg and x. The routing itself (a top-k) passes no gradient to p.
#include "cpu/ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

namespace dlplan::exec::cpu {
namespace {

// One sample's routing, found from its probabilities [T, E].
struct SampleRoute {
  std::vector<int32_t> expert;  // [T, k]: the chosen experts, best first
  std::vector<int32_t> place;   // [T, k]: the place in that expert, -1 where dropped
};

SampleRoute route_sample(const float* p, const MoeRouting& r) {
  const int64_t T = r.T, E = r.E, k = r.k;
  SampleRoute s;
  s.expert.resize(static_cast<size_t>(T * k));
  s.place.resize(static_cast<size_t>(T * k));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = p + t * E;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    std::copy(order.begin(), order.begin() + k, s.expert.begin() + t * k);
  }
  std::vector<int64_t> used(static_cast<size_t>(E), 0);
  for (int64_t j = 0; j < k; ++j)
    for (int64_t t = 0; t < T; ++t) {
      int64_t& n = used[static_cast<size_t>(s.expert[static_cast<size_t>(t * k + j)])];
      s.place[static_cast<size_t>(t * k + j)] = n < r.C ? static_cast<int32_t>(n++) : -1;
    }
  return s;
}

// The tokens routed to expert e, by place: token[place] (-1: empty place).
std::vector<int64_t> tokens_of(const SampleRoute& s, const MoeRouting& r, int64_t e) {
  std::vector<int64_t> token(static_cast<size_t>(r.C), -1);
  for (int64_t t = 0; t < r.T; ++t)
    for (int64_t j = 0; j < r.k; ++j) {
      const size_t c = static_cast<size_t>(t * r.k + j);
      if (s.expert[c] == e && s.place[c] >= 0) token[static_cast<size_t>(s.place[c])] = t;
    }
  return token;
}

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

}  // namespace

void moe_router_forward(OpContext& c) {
  const int64_t T = in_shape(c, 0)[0], D = in_shape(c, 0)[1], E = out_shape(c)[1];
  const float* wg = c.params[0].f();
  for (int64_t n = 0; n < c.batch; ++n) {
    float* p = c.out.f() + n * T * E;
    gemm(false, true, T, E, D, 1.0f, c.in[0].f() + n * T * D, D, wg, D, 0.0f, p, E);
    for (int64_t t = 0; t < T; ++t) {
      float* row = p + t * E;
      const float mx = *std::max_element(row, row + E);
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += (row[e] = std::exp(row[e] - mx));
      for (int64_t e = 0; e < E; ++e) row[e] /= sum;
    }
  }
}

void moe_router_backward(OpContext& c) {
  const int64_t b = c.batch, T = in_shape(c, 0)[0], D = in_shape(c, 0)[1], E = out_shape(c)[1];
  Tensor dl_t = alloc_temp(c, {b, T, E}, "dlogits");
  Fp32Buffer dl_b(dl_t);
  float* dl = dl_b.data();
  const float *p = c.out.f(), *dp = c.dout.f();
  for (int64_t r = 0; r < b * T; ++r) {  // d logits = p (dp - sum p dp)
    float dot = 0;
    for (int64_t e = 0; e < E; ++e) dot += p[r * E + e] * dp[r * E + e];
    for (int64_t e = 0; e < E; ++e) dl[r * E + e] = p[r * E + e] * (dp[r * E + e] - dot);
  }
  float* dx = grad_or_null(c.din[0]);
  for (int64_t n = 0; n < b; ++n) {
    if (float* dwg = grad_or_null(c.dparams[0]))
      gemm(true, false, E, D, T, 1.0f, dl + n * T * E, E, c.in[0].f() + n * T * D, D, 1.0f, dwg, D);
    if (dx) gemm(false, false, T, D, E, 1.0f, dl + n * T * E, E, c.params[0].f(), D, 1.0f, dx + n * T * D, D);
  }
}

void moe_expert_forward(OpContext& c) {
  const MoeRouting r = moe_routing(*c.model, *c.node);
  const int64_t b = c.batch, T = r.T, D = in_shape(c, 0)[1], C = r.C, F = c.node->attrs.integer("hidden");
  const int64_t e = c.node->attrs.integer("expert");
  Tensor disp = alloc_saved(c, {b, C, D}, compute(c), "dispatched");
  Tensor h1 = alloc_saved(c, {b, C, F}, compute(c), "h1");
  Tensor silu = alloc_saved(c, {b, C, F}, compute(c), "silu");
  Tensor h3 = alloc_saved(c, {b, C, F}, compute(c), "h3");
  Tensor act = alloc_saved(c, {b, C, F}, compute(c), "act");
  Fp32Buffer disp_b(disp), h1_b(h1), silu_b(silu), h3_b(h3), act_b(act);
  const float *w1 = c.params[0].f(), *w2 = c.params[1].f(), *w3 = c.params[2].f();

  std::fill(disp_b.data(), disp_b.data() + b * C * D, 0.0f);
  for (int64_t n = 0; n < b; ++n) {
    const std::vector<int64_t> token = tokens_of(route_sample(c.in[1].f() + n * T * r.E, r), r, e);
    for (int64_t j = 0; j < C; ++j)
      if (token[static_cast<size_t>(j)] >= 0)
        std::memcpy(disp_b.data() + (n * C + j) * D, c.in[0].f() + (n * T + token[static_cast<size_t>(j)]) * D,
                    static_cast<size_t>(D) * sizeof(float));
  }
  disp_b.store();
  gemm(false, true, b * C, F, D, 1.0f, disp_b.data(), D, w1, D, 0.0f, h1_b.data(), F);
  gemm(false, true, b * C, F, D, 1.0f, disp_b.data(), D, w3, D, 0.0f, h3_b.data(), F);
  h1_b.store();
  h3_b.store();
  for (int64_t i = 0; i < b * C * F; ++i) silu_b.data()[i] = h1_b.data()[i] * sigmoid(h1_b.data()[i]);
  silu_b.store();
  for (int64_t i = 0; i < b * C * F; ++i) act_b.data()[i] = silu_b.data()[i] * h3_b.data()[i];
  act_b.store();
  gemm(false, true, b * C, D, F, 1.0f, act_b.data(), F, w2, F, 0.0f, c.out.f(), D);
  for (Tensor* t : {&disp, &h1, &silu, &h3, &act}) c.saved.push_back(*t);
}

void moe_expert_backward(OpContext& c) {
  const MoeRouting r = moe_routing(*c.model, *c.node);
  const int64_t b = c.batch, T = r.T, D = in_shape(c, 0)[1], C = r.C, F = c.node->attrs.integer("hidden");
  const int64_t e = c.node->attrs.integer("expert");
  const float* disp = saved_named(c, "dispatched").f();
  const float* h1 = saved_named(c, "h1").f();
  const float* silu = saved_named(c, "silu").f();
  const float* h3 = saved_named(c, "h3").f();
  const float* act = saved_named(c, "act").f();
  Tensor dact_t = alloc_temp(c, {b, C, F}, "dact"), dh1_t = alloc_temp(c, {b, C, F}, "dh1");
  Tensor dh3_t = alloc_temp(c, {b, C, F}, "dh3"), ddisp_t = alloc_temp(c, {b, C, D}, "ddispatched");
  Fp32Buffer dact_b(dact_t), dh1_b(dh1_t), dh3_b(dh3_t), ddisp_b(ddisp_t);
  float *dact = dact_b.data(), *dh1 = dh1_b.data(), *dh3 = dh3_b.data(), *ddisp = ddisp_b.data();
  const float *dout = c.dout.f(), *w1 = c.params[0].f(), *w2 = c.params[1].f(), *w3 = c.params[2].f();

  gemm(false, false, b * C, F, D, 1.0f, dout, D, w2, F, 0.0f, dact, F);
  if (float* dw2 = grad_or_null(c.dparams[1])) gemm(true, false, D, F, b * C, 1.0f, dout, D, act, F, 1.0f, dw2, F);
  for (int64_t i = 0; i < b * C * F; ++i) {  // act = silu(h1) h3; silu'(v) = sig(v) (1 + v (1 - sig(v)))
    const float v = h1[i], sg = sigmoid(v);
    dh1[i] = dact[i] * h3[i] * sg * (1.0f + v * (1.0f - sg));
    dh3[i] = dact[i] * silu[i];
  }
  if (float* dw1 = grad_or_null(c.dparams[0])) gemm(true, false, F, D, b * C, 1.0f, dh1, F, disp, D, 1.0f, dw1, D);
  if (float* dw3 = grad_or_null(c.dparams[2])) gemm(true, false, F, D, b * C, 1.0f, dh3, F, disp, D, 1.0f, dw3, D);
  float* dx = grad_or_null(c.din[0]);
  if (!dx) return;
  gemm(false, false, b * C, D, F, 1.0f, dh1, F, w1, D, 0.0f, ddisp, D);
  gemm(false, false, b * C, D, F, 1.0f, dh3, F, w3, D, 1.0f, ddisp, D);
  for (int64_t n = 0; n < b; ++n) {  // each place's input gradient back to its token
    const std::vector<int64_t> token = tokens_of(route_sample(c.in[1].f() + n * T * r.E, r), r, e);
    for (int64_t j = 0; j < C; ++j) {
      if (token[static_cast<size_t>(j)] < 0) continue;
      const float* src = ddisp + (n * C + j) * D;
      float* dst = dx + (n * T + token[static_cast<size_t>(j)]) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] += src[d];
    }
  }
}

namespace {

// The gate of each of a token's k choices: its probability, renormalised
// over the chosen ones when `normalize`.
void gates_of(const float* p, const SampleRoute& s, const MoeRouting& r, int64_t t, float* gate) {
  float sum = 0;
  for (int64_t j = 0; j < r.k; ++j) sum += p[t * r.E + s.expert[static_cast<size_t>(t * r.k + j)]];
  for (int64_t j = 0; j < r.k; ++j) {
    const float pj = p[t * r.E + s.expert[static_cast<size_t>(t * r.k + j)]];
    gate[j] = r.normalize ? pj / sum : pj;
  }
}

}  // namespace

void moe_combine_forward(OpContext& c) {
  const MoeRouting r = moe_routing(*c.model, *c.node);
  const int64_t T = r.T, E = r.E, k = r.k, C = r.C, D = out_shape(c)[1];
  std::vector<float> gate(static_cast<size_t>(k));
  float* y = c.out.f();
  std::fill(y, y + c.batch * T * D, 0.0f);
  for (int64_t n = 0; n < c.batch; ++n) {
    const float* p = c.in[0].f() + n * T * E;
    const SampleRoute s = route_sample(p, r);
    for (int64_t t = 0; t < T; ++t) {
      gates_of(p, s, r, t, gate.data());
      float* yt = y + (n * T + t) * D;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t place = s.place[static_cast<size_t>(t * k + j)];
        if (place < 0) continue;
        const int64_t e = s.expert[static_cast<size_t>(t * k + j)];
        const float* o = c.in[static_cast<size_t>(1 + e)].f() + (n * C + place) * D;
        for (int64_t d = 0; d < D; ++d) yt[d] += gate[static_cast<size_t>(j)] * o[d];
      }
    }
  }
}

void moe_combine_backward(OpContext& c) {
  const MoeRouting r = moe_routing(*c.model, *c.node);
  const int64_t T = r.T, E = r.E, k = r.k, C = r.C, D = out_shape(c)[1];
  std::vector<float> gate(static_cast<size_t>(k)), dgate(static_cast<size_t>(k));
  for (int64_t n = 0; n < c.batch; ++n) {
    const float* p = c.in[0].f() + n * T * E;
    const SampleRoute s = route_sample(p, r);
    float* dp = grad_or_null(c.din[0]);
    for (int64_t t = 0; t < T; ++t) {
      gates_of(p, s, r, t, gate.data());
      const float* dyt = c.dout.f() + (n * T + t) * D;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t place = s.place[static_cast<size_t>(t * k + j)];
        float dg = 0;
        if (place >= 0) {
          const size_t in = static_cast<size_t>(1 + s.expert[static_cast<size_t>(t * k + j)]);
          const float* o = c.in[in].f() + (n * C + place) * D;
          float* dout = grad_or_null(c.din[in]);
          for (int64_t d = 0; d < D; ++d) {
            dg += dyt[d] * o[d];
            if (dout) dout[(n * C + place) * D + d] += gate[static_cast<size_t>(j)] * dyt[d];
          }
        }
        dgate[static_cast<size_t>(j)] = dg;
      }
      if (!dp) continue;
      float sum = 0, dg_dot_g = 0;
      for (int64_t j = 0; j < k; ++j) {
        sum += p[t * E + s.expert[static_cast<size_t>(t * k + j)]];
        dg_dot_g += dgate[static_cast<size_t>(j)] * gate[static_cast<size_t>(j)];
      }
      for (int64_t j = 0; j < k; ++j) {
        const float dg = dgate[static_cast<size_t>(j)];
        dp[(n * T + t) * E + s.expert[static_cast<size_t>(t * k + j)]] += r.normalize ? (dg - dg_dot_g) / sum : dg;
      }
    }
  }
}

}  // namespace dlplan::exec::cpu
