// Recurrent ops: lstm (nn.LSTM), gru (nn.GRU) and rnn (nn.RNN), one layer
// each, one direction or two.
//
// x: [b, T, in]; weight_ih [4H, in], weight_hh [4H, H], bias_ih and bias_hh
// [4H], the gates in PyTorch's order (input i, forget f, cell g, output o);
// out: [b, T, H], the hidden state h_t of every step. With h_{-1} = c_{-1} = 0:
//   gates_t = x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh
//   i, f, o = sigmoid(gates_t[i, f, o]),  g = tanh(gates_t[g])
//   c_t = f c_{t-1} + i g,  h_t = o tanh(c_t)
// as ATen's LSTMCell computes it on the CPU (RNN.cpp). The saved "state"
// holds, per sample and step, what autograd keeps there: the activated gates
// [4H], h_{t-1} [H], c_{t-1} [H] and tanh(c_t) [H] (ops_decl.cpp).
//
// Backward runs the steps in reverse with dh and dc carried from step t + 1:
//   dh = dy_t + dh',  dc = dh o (1 - tanh(c_t)^2) + dc'
//   d(gates) = [dc g i (1 - i), dc c_{t-1} f (1 - f), dc i (1 - g^2), dh tanh(c_t) o (1 - o)]
//   dh' = d(gates) W_hh,  dc' = dc f
// then dW_ih += d(gates)^T x, dW_hh += d(gates)^T h_{t-1}, both biases the
// sum of d(gates), and dx += d(gates) W_ih: one GEMM each over all steps.
//
// Bidirectional: a second direction with its own weights (the *_reverse
// parameters) runs the same over the reversed sequence (its h_{t-1} is the
// state after step t + 1), its h_t in columns [H, 2H) of out. The state
// holds both directions' slices, [b, T, 2, 7H]; backward takes one
// direction after the other through the same temporaries.
//
// gru: weight_ih [3H, in], weight_hh [3H, H], biases [3H], the gates in
// PyTorch's order (reset r, update z, new n); with ig = x_t W_ih^T + b_ih
// and hg = h_{t-1} W_hh^T + b_hh:
//   r = sigmoid(ig_r + hg_r),  z = sigmoid(ig_z + hg_z)
//   n = tanh(ig_n + r hg_n),   h_t = (h_{t-1} - n) z + n
// as ATen's GRUCell. Its state slice a step keeps what autograd keeps there
// (ops_decl.cpp): r, z, r hg_n, hg_n, n, h_{t-1} - n and h_{t-1}. Backward:
//   dz = dh (h_{t-1} - n),  dn = dh (1 - z) (1 - n^2),  dr = dn hg_n
//   d(ig) = [dr r (1 - r), dz z (1 - z), dn],  d(hg) = [same r and z, dn r]
//   dh' = dh z + d(hg) W_hh
// then dW_ih += d(ig)^T x, dW_hh += d(hg)^T h_{t-1}, the biases the sums,
// and dx += d(ig) W_ih.
//
// rnn: weight_ih [H, in], weight_hh [H, H], biases [H]; as ATen's SimpleCell
//   h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh),  act tanh or relu.
// Its state is [b, T + 1, dirs, H]: row t holds each direction's h_{t-1} for
// its step at time t, row T each direction's last h; a step's h_t is the
// next step's h_{t-1} (ops_decl.cpp: T + 1 hidden states kept). Backward:
//   da = dh act'(h_t),  dh' = da W_hh
// with act' 1 - h_t^2 (tanh) or [h_t > 0] (relu), then the weights' and the
// input's gradients as above.
#include "cpu/ops.hpp"
#include "cpu/vec_math.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace dlplan::exec::cpu {

namespace {

struct RnnShape {
  int64_t b, T, in, H, dirs;
  int64_t kept = 7;                                 // hidden widths a step and direction keeps: lstm, gru 7; rnn 1
  int64_t slot() const { return kept * H; }         // one direction's slice of a step's state
  int64_t step() const { return dirs * slot(); }    // one step's state, both directions
  int64_t sample() const { return T * step(); }
  int64_t width() const { return dirs * H; }        // a row of out
};

RnnShape rnn_shape(const OpContext& c) {
  const Shape& x = in_shape(c, 0);
  RnnShape s{c.batch, x[0], x[1], c.node->attrs.integer("hidden"), c.node->attrs.flag("bidirectional") ? 2 : 1};
  if (c.node->op == OpKind::rnn) s.kept = 1;
  return s;
}

// Offsets inside one direction's slice of a step's state (lstm).
constexpr int64_t kGates = 0;
inline int64_t h_prev(const RnnShape& s) { return 4 * s.H; }
inline int64_t c_prev(const RnnShape& s) { return 5 * s.H; }
inline int64_t tanh_c(const RnnShape& s) { return 6 * s.H; }

// Direction d's parameters: weight_ih, weight_hh[, bias_ih, bias_hh].
struct RnnParams {
  size_t first, count;
};
RnnParams rnn_params(const OpContext& c, int d) {
  const size_t per = c.node->attrs.flag("bias") ? 4 : 2;
  return {static_cast<size_t>(d) * per, per};
}

// The time of direction d's k-th step (the reverse direction starts at the end).
inline int64_t time_of(const RnnShape& s, int d, int64_t k) { return d == 0 ? k : s.T - 1 - k; }

// Every step's gradients of the input side's and the hidden side's gate
// pre-activations (rows (sample, step), `ld` apart; the same rows for an
// LSTM, two halves of a row for a GRU).
struct GateGrads {
  const float *ih, *hh;
  int64_t ld;
};

// After a direction's steps: dW_ih += d(ig)^T x, dW_hh += d(hg)^T h_{t-1}
// (h_prev: step 0's h_{t-1} in the state, a step's state apart, and
// `h_sample` apart from one sample to the next), bias_ih and bias_hh the
// sums of d(ig) and d(hg), and dx += d(ig) W_ih; one GEMM each over all
// steps (dW_hh one a sample where the samples' states are not one run).
void weight_and_input_grads(OpContext& c, const RnnShape& s, const RnnParams& p, int64_t G, const GateGrads& dg,
                            const float* h_prev, int64_t h_sample) {
  const int64_t R = s.b * s.T;
  if (float* dw = grad_or_null(c.dparams[p.first]))
    gemm(true, false, G, s.in, R, 1.0f, dg.ih, dg.ld, c.in[0].f(), s.in, 1.0f, dw, s.in);
  if (float* dw = grad_or_null(c.dparams[p.first + 1])) {
    if (h_sample == s.T * s.step())
      gemm(true, false, G, s.H, R, 1.0f, dg.hh, dg.ld, h_prev, s.step(), 1.0f, dw, s.H);
    else
      for (int64_t n = 0; n < s.b; ++n)
        gemm(true, false, G, s.H, s.T, 1.0f, dg.hh + n * s.T * dg.ld, dg.ld, h_prev + n * h_sample, s.step(), 1.0f, dw,
             s.H);
  }
  for (size_t q = 2; q < p.count; ++q)
    if (float* db = grad_or_null(c.dparams[p.first + q])) {
      const float* from = q == 2 ? dg.ih : dg.hh;
      for (int64_t r = 0; r < R; ++r)
        for (int64_t j = 0; j < G; ++j) db[j] += from[r * dg.ld + j];
    }
  if (float* dx = grad_or_null(c.din[0]))
    gemm(false, false, R, s.in, G, 1.0f, dg.ih, dg.ld, c.params[p.first].f(), s.in, 1.0f, dx, s.in);
}

}  // namespace

void lstm_forward(OpContext& c) {
  const RnnShape s = rnn_shape(c);
  const int64_t H = s.H, G = 4 * H;
  Tensor state_t = alloc_saved(c, {s.b, s.T, s.step()}, compute(c), "state");
  Fp32Buffer state_b(state_t);
  float* st = state_b.data();
  float* y = c.out.f();
  std::vector<float> cell(static_cast<size_t>(s.b * H));  // c_t, carried in fp32 as stored

  for (int d = 0; d < s.dirs; ++d) {
    const RnnParams p = rnn_params(c, d);
    const float *w_ih = c.params[p.first].f(), *w_hh = c.params[p.first + 1].f();
    const float* b_ih = p.count == 4 ? c.params[p.first + 2].f() : nullptr;
    const float* b_hh = p.count == 4 ? c.params[p.first + 3].f() : nullptr;
    float* base = st + d * s.slot();  // direction d's slice of step 0 of sample 0
    // Every step's x_t W_ih^T at once, into the gates' slots.
    gemm(false, true, s.b * s.T, G, s.in, 1.0f, c.in[0].f(), s.in, w_ih, s.in, 0.0f, base + kGates, s.step());
    std::fill(cell.begin(), cell.end(), 0.0f);
    for (int64_t k = 0; k < s.T; ++k) {
      const int64_t t = time_of(s, d, k), before = k == 0 ? -1 : time_of(s, d, k - 1);
      for (int64_t n = 0; n < s.b; ++n) {  // h_{t-1}, c_{t-1}: zeros at the first step
        float* at = base + n * s.sample() + t * s.step();
        if (before < 0)
          std::fill(at + h_prev(s), at + h_prev(s) + H, 0.0f);
        else
          std::memcpy(at + h_prev(s), y + (n * s.T + before) * s.width() + d * H, static_cast<size_t>(H) * sizeof(float));
        std::memcpy(at + c_prev(s), cell.data() + n * H, static_cast<size_t>(H) * sizeof(float));
      }
      // gates_t += h_{t-1} W_hh^T for every sample (rows a sample apart).
      float* now = base + t * s.step();
      gemm(false, true, s.b, G, H, 1.0f, now + h_prev(s), s.sample(), w_hh, H, 1.0f, now + kGates, s.sample());
      for (int64_t n = 0; n < s.b; ++n) {
        float* at = base + n * s.sample() + t * s.step();
        float* gi = at + kGates;
        for (int64_t j = 0; j < H; ++j) {
          float bias[4] = {0, 0, 0, 0};
          if (b_ih)
            for (int q = 0; q < 4; ++q) bias[q] = b_ih[q * H + j] + b_hh[q * H + j];
          gi[j] = sigmoid(gi[j] + bias[0]);
          gi[H + j] = sigmoid(gi[H + j] + bias[1]);
          gi[2 * H + j] = std::tanh(gi[2 * H + j] + bias[2]);
          gi[3 * H + j] = sigmoid(gi[3 * H + j] + bias[3]);
        }
        state_b.round(gi, G);  // the activated gates as stored
        float* cn = cell.data() + n * H;
        for (int64_t j = 0; j < H; ++j) cn[j] = gi[H + j] * at[c_prev(s) + j] + gi[j] * gi[2 * H + j];
        state_b.round(cn, H);  // c_t as stored (the next step's c_{t-1})
        for (int64_t j = 0; j < H; ++j) at[tanh_c(s) + j] = std::tanh(cn[j]);
        state_b.round(at + tanh_c(s), H);
        float* h = y + (n * s.T + t) * s.width() + d * H;
        for (int64_t j = 0; j < H; ++j) h[j] = gi[3 * H + j] * at[tanh_c(s) + j];
        state_b.round(h, H);
      }
    }
  }
  state_b.store();
  c.saved.push_back(std::move(state_t));
}

void lstm_backward(OpContext& c) {
  const RnnShape s = rnn_shape(c);
  const int64_t H = s.H, G = 4 * H;
  const float* st = saved_named(c, "state").f();
  Tensor dg_t = alloc_temp(c, {s.b, s.T, G}, "dgates");
  Tensor carry_t = alloc_temp(c, {s.b, 2 * H}, "dstate");
  Fp32Buffer dg_b(dg_t), carry_b(carry_t);
  float *dg = dg_b.data(), *carry = carry_b.data();  // carry: [dh', dc'] a sample
  const float* dy = c.dout.f();

  for (int d = 0; d < s.dirs; ++d) {
    const RnnParams p = rnn_params(c, d);
    const float* w_hh = c.params[p.first + 1].f();
    const float* base = st + d * s.slot();
    std::fill(carry, carry + s.b * 2 * H, 0.0f);
    for (int64_t k = s.T - 1; k >= 0; --k) {
      const int64_t t = time_of(s, d, k);
      for (int64_t n = 0; n < s.b; ++n) {
        const float* at = base + n * s.sample() + t * s.step();
        const float *gi = at + kGates, *cp = at + c_prev(s), *tc = at + tanh_c(s);
        const float* dyt = dy + (n * s.T + t) * s.width() + d * H;
        float* dgt = dg + (n * s.T + t) * G;
        float *dh_c = carry + n * 2 * H, *dc_c = dh_c + H;
        for (int64_t j = 0; j < H; ++j) {
          const float i = gi[j], f = gi[H + j], g = gi[2 * H + j], o = gi[3 * H + j];
          const float dh = dyt[j] + dh_c[j];
          const float dc = dh * o * (1.0f - tc[j] * tc[j]) + dc_c[j];
          dgt[j] = dc * g * i * (1.0f - i);
          dgt[H + j] = dc * cp[j] * f * (1.0f - f);
          dgt[2 * H + j] = dc * i * (1.0f - g * g);
          dgt[3 * H + j] = dh * tc[j] * o * (1.0f - o);
          dc_c[j] = dc * f;
        }
      }
      // dh' = d(gates_t) W_hh for every sample, into the carry's first half.
      gemm(false, false, s.b, H, G, 1.0f, dg + t * G, s.T * G, w_hh, H, 0.0f, carry, 2 * H);
    }
    dg_b.store();
    carry_b.store();
    weight_and_input_grads(c, s, p, G, {dg, dg, G}, base + h_prev(s), s.sample());
  }
}

// ---- gru ---------------------------------------------------------------------

namespace {
// Offsets inside one direction's slice of a step's state (gru).
enum GruSlot : int64_t { kR = 0, kZ = 1, kRhn = 2, kHn = 3, kN = 4, kHmn = 5, kHprev = 6 };
}  // namespace

void gru_forward(OpContext& c) {
  const RnnShape s = rnn_shape(c);
  const int64_t H = s.H, G = 3 * H;
  Tensor state_t = alloc_saved(c, {s.b, s.T, s.step()}, compute(c), "state");
  Tensor ig_t = alloc_temp(c, {s.b, s.T, G}, "igates");
  Fp32Buffer state_b(state_t), ig_b(ig_t);
  float *st = state_b.data(), *ig = ig_b.data();
  float* y = c.out.f();
  const auto at_slot = [&](float* at, GruSlot k) { return at + k * H; };

  for (int d = 0; d < s.dirs; ++d) {
    const RnnParams p = rnn_params(c, d);
    const float *w_ih = c.params[p.first].f(), *w_hh = c.params[p.first + 1].f();
    const float* b_ih = p.count == 4 ? c.params[p.first + 2].f() : nullptr;
    const float* b_hh = p.count == 4 ? c.params[p.first + 3].f() : nullptr;
    float* base = st + d * s.slot();
    gemm(false, true, s.b * s.T, G, s.in, 1.0f, c.in[0].f(), s.in, w_ih, s.in, 0.0f, ig, G);  // every step's x W_ih^T
    ig_b.store();
    for (int64_t k = 0; k < s.T; ++k) {
      const int64_t t = time_of(s, d, k), before = k == 0 ? -1 : time_of(s, d, k - 1);
      for (int64_t n = 0; n < s.b; ++n) {  // h_{t-1}: zeros at the first step
        float* hp = at_slot(base + n * s.sample() + t * s.step(), kHprev);
        if (before < 0)
          std::fill(hp, hp + H, 0.0f);
        else
          std::memcpy(hp, y + (n * s.T + before) * s.width() + d * H, static_cast<size_t>(H) * sizeof(float));
      }
      // hg = h_{t-1} W_hh^T for every sample, into the slots r, z, r hg_n (then made what they hold).
      float* now = base + t * s.step();
      gemm(false, true, s.b, G, H, 1.0f, now + kHprev * H, s.sample(), w_hh, H, 0.0f, now, s.sample());
      for (int64_t n = 0; n < s.b; ++n) {
        float* at = base + n * s.sample() + t * s.step();
        const float* igt = ig + (n * s.T + t) * G;
        for (int64_t j = 0; j < H; ++j) {
          float bi[3] = {0, 0, 0}, bh[3] = {0, 0, 0};
          if (b_ih)
            for (int q = 0; q < 3; ++q) bi[q] = b_ih[q * H + j], bh[q] = b_hh[q * H + j];
          const float r = sigmoid(igt[j] + bi[0] + at[j] + bh[0]);
          const float z = sigmoid(igt[H + j] + bi[1] + at[H + j] + bh[1]);
          const float hn = at[2 * H + j] + bh[2];
          at[kR * H + j] = r;
          at[kZ * H + j] = z;
          at[kHn * H + j] = hn;
        }
        state_b.round(at, 2 * H);  // r, z as stored
        state_b.round(at_slot(at, kHn), H);
        for (int64_t j = 0; j < H; ++j) at[kRhn * H + j] = at[kR * H + j] * at[kHn * H + j];
        state_b.round(at_slot(at, kRhn), H);
        for (int64_t j = 0; j < H; ++j) {
          const float bin = b_ih ? b_ih[2 * H + j] : 0.0f;
          at[kN * H + j] = std::tanh(igt[2 * H + j] + bin + at[kRhn * H + j]);
        }
        state_b.round(at_slot(at, kN), H);
        for (int64_t j = 0; j < H; ++j) at[kHmn * H + j] = at[kHprev * H + j] - at[kN * H + j];
        state_b.round(at_slot(at, kHmn), H);
        float* h = y + (n * s.T + t) * s.width() + d * H;
        for (int64_t j = 0; j < H; ++j) h[j] = at[kHmn * H + j] * at[kZ * H + j] + at[kN * H + j];
        state_b.round(h, H);
      }
    }
  }
  state_b.store();
  c.saved.push_back(std::move(state_t));
}

void gru_backward(OpContext& c) {
  const RnnShape s = rnn_shape(c);
  const int64_t H = s.H, G = 3 * H;
  const float* st = saved_named(c, "state").f();
  Tensor dg_t = alloc_temp(c, {s.b, s.T, 2 * G}, "dgates");  // a step: d(ig) [3H], d(hg) [3H]
  Tensor carry_t = alloc_temp(c, {s.b, H}, "dstate");
  Fp32Buffer dg_b(dg_t), carry_b(carry_t);
  float *dg = dg_b.data(), *carry = carry_b.data();  // carry: dh' a sample
  const float* dy = c.dout.f();

  for (int d = 0; d < s.dirs; ++d) {
    const RnnParams p = rnn_params(c, d);
    const float* w_hh = c.params[p.first + 1].f();
    const float* base = st + d * s.slot();
    std::fill(carry, carry + s.b * H, 0.0f);
    for (int64_t k = s.T - 1; k >= 0; --k) {
      const int64_t t = time_of(s, d, k);
      for (int64_t n = 0; n < s.b; ++n) {
        const float* at = base + n * s.sample() + t * s.step();
        const float* dyt = dy + (n * s.T + t) * s.width() + d * H;
        float* dgi = dg + (n * s.T + t) * 2 * G;
        float* dgh = dgi + G;
        float* dh_c = carry + n * H;
        for (int64_t j = 0; j < H; ++j) {
          const float r = at[kR * H + j], z = at[kZ * H + j], nn = at[kN * H + j];
          const float dh = dyt[j] + dh_c[j];
          const float dn = dh * (1.0f - z) * (1.0f - nn * nn);
          const float dr = dn * at[kHn * H + j] * r * (1.0f - r);
          const float dz = dh * at[kHmn * H + j] * z * (1.0f - z);
          dgi[j] = dgh[j] = dr;
          dgi[H + j] = dgh[H + j] = dz;
          dgi[2 * H + j] = dn;
          dgh[2 * H + j] = dn * r;
          dh_c[j] = dh * z;  // then += d(hg) W_hh
        }
      }
      gemm(false, false, s.b, H, G, 1.0f, dg + t * 2 * G + G, s.T * 2 * G, w_hh, H, 1.0f, carry, H);
    }
    dg_b.store();
    carry_b.store();
    weight_and_input_grads(c, s, p, G, {dg, dg + G, 2 * G}, base + kHprev * H, s.sample());
  }
}

// ---- rnn ---------------------------------------------------------------------

namespace {
// Where direction d's h_t of the step at time t is in an rnn's state: the
// row of the next step in that direction, or row T after its last step.
inline int64_t rnn_h_row(const RnnShape& s, int d, int64_t t) {
  if (d == 0) return t + 1;  // (row T after the step at T - 1)
  return t >= 1 ? t - 1 : s.T;
}
}  // namespace

void rnn_forward(OpContext& c) {
  const RnnShape s = rnn_shape(c);
  const int64_t H = s.H, per = (s.T + 1) * s.step();  // a sample's state
  const bool relu = c.node->attrs.text("nonlinearity") == "relu";
  Tensor state_t = alloc_saved(c, {s.b, s.T + 1, s.step()}, compute(c), "state");
  Fp32Buffer state_b(state_t);
  float* st = state_b.data();
  float* y = c.out.f();

  for (int d = 0; d < s.dirs; ++d) {
    const RnnParams p = rnn_params(c, d);
    const float *w_ih = c.params[p.first].f(), *w_hh = c.params[p.first + 1].f();
    const float* b_ih = p.count == 4 ? c.params[p.first + 2].f() : nullptr;
    const float* b_hh = p.count == 4 ? c.params[p.first + 3].f() : nullptr;
    float* base = st + d * H;  // direction d's slice of row 0 of sample 0
    // Every step's x_t W_ih^T at once, into the output's direction d columns.
    gemm(false, true, s.b * s.T, H, s.in, 1.0f, c.in[0].f(), s.in, w_ih, s.in, 0.0f, y + d * H, s.width());
    for (int64_t k = 0; k < s.T; ++k) {
      const int64_t t = time_of(s, d, k), before = k == 0 ? -1 : time_of(s, d, k - 1);
      for (int64_t n = 0; n < s.b; ++n) {  // h_{t-1}: zeros at the first step
        float* hp = base + n * per + t * s.step();
        if (before < 0)
          std::fill(hp, hp + H, 0.0f);
        else
          std::memcpy(hp, y + (n * s.T + before) * s.width() + d * H, static_cast<size_t>(H) * sizeof(float));
      }
      // += h_{t-1} W_hh^T for every sample, then the biases and the activation.
      float* yt = y + t * s.width() + d * H;
      gemm(false, true, s.b, H, H, 1.0f, base + t * s.step(), per, w_hh, H, 1.0f, yt, s.T * s.width());
      for (int64_t n = 0; n < s.b; ++n) {
        float* h = yt + n * s.T * s.width();
        for (int64_t j = 0; j < H; ++j) {
          const float a = h[j] + (b_ih ? b_ih[j] + b_hh[j] : 0.0f);
          h[j] = relu ? std::max(a, 0.0f) : std::tanh(a);
        }
        state_b.round(h, H);  // h_t as stored
      }
    }
    for (int64_t n = 0; n < s.b; ++n)  // the last step's h_t, which no later step reads
      std::memcpy(base + n * per + s.T * s.step(), y + (n * s.T + time_of(s, d, s.T - 1)) * s.width() + d * H,
                  static_cast<size_t>(H) * sizeof(float));
  }
  state_b.store();
  c.saved.push_back(std::move(state_t));
}

void rnn_backward(OpContext& c) {
  const RnnShape s = rnn_shape(c);
  const int64_t H = s.H, per = (s.T + 1) * s.step();
  const bool relu = c.node->attrs.text("nonlinearity") == "relu";
  const float* st = saved_named(c, "state").f();
  Tensor dg_t = alloc_temp(c, {s.b, s.T, H}, "dgates");
  Tensor carry_t = alloc_temp(c, {s.b, H}, "dstate");
  Fp32Buffer dg_b(dg_t), carry_b(carry_t);
  float *dg = dg_b.data(), *carry = carry_b.data();  // carry: dh' a sample
  const float* dy = c.dout.f();

  for (int d = 0; d < s.dirs; ++d) {
    const RnnParams p = rnn_params(c, d);
    const float* w_hh = c.params[p.first + 1].f();
    const float* base = st + d * H;
    std::fill(carry, carry + s.b * H, 0.0f);
    for (int64_t k = s.T - 1; k >= 0; --k) {
      const int64_t t = time_of(s, d, k);
      for (int64_t n = 0; n < s.b; ++n) {
        const float* h = base + n * per + rnn_h_row(s, d, t) * s.step();
        const float* dyt = dy + (n * s.T + t) * s.width() + d * H;
        float* da = dg + (n * s.T + t) * H;
        const float* dh_c = carry + n * H;
        for (int64_t j = 0; j < H; ++j) {
          const float dh = dyt[j] + dh_c[j];
          da[j] = relu ? (h[j] > 0.0f ? dh : 0.0f) : dh * (1.0f - h[j] * h[j]);
        }
      }
      // dh' = da W_hh for every sample.
      gemm(false, false, s.b, H, H, 1.0f, dg + t * H, s.T * H, w_hh, H, 0.0f, carry, H);
    }
    dg_b.store();
    carry_b.store();
    weight_and_input_grads(c, s, p, H, {dg, dg, H}, base, per);
  }
}

}  // namespace dlplan::exec::cpu
