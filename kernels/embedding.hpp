// embedding.hpp: the input layer of a GPT, token and position embeddings added together
// (nanoGPT's transformer.wte(idx) + transformer.wpe(pos)).
//
//   embedding_forward(tokens, wte, wpe, out)
//     tokens: [B, T]     i32, each in [0, V)                 one sequence per row
//     wte:    [V, C]     f32/f16/bf16 (f64 on the CPU)      the token table
//     wpe:    [P, C]     the dtype of wte, P >= T            the position table
//     out:    [B, T, C]  the dtype of wte
//       out[b][t][c] = wte[tokens[b][t]][c] + wpe[t][c]     (=)
//
//   embedding_backward(tokens, dout, dwte, dwpe)
//     dout:   [B, T, C]  f32/f16/bf16 (f64 on the CPU)      the gradient of out
//     dwte:   [V, C]     f32 (f64 for f64 dout)              dwte[tokens[b][t]] += dout[b][t]  (+=)
//     dwpe:   [P, C]     f32 (f64 for f64 dout)              dwpe[t] += dout[b][t]           (+=)
//
// Arithmetic. The forward adds the two table entries in float (double for f64) and rounds
// the sum once to the dtype. The backward is a scatter-add, and its order is the contract
// that makes accumulation exact: for every position (b, t) in row-major order (b outer, t
// inner), each channel c does
//     dwte[tokens[b][t]][c] = dwte[tokens[b][t]][c] + dout[b][t][c]
//     dwpe[t][c]            = dwpe[t][c]            + dout[b][t][c]
// one rounded float addition per term, from the buffer's current value. A token that
// occurs many times collects its terms in the order of its positions, so micro-batches of
// sequences 0..3, 4..7, ... run in order into the same buffers perform exactly the
// additions of one backward over all sequences: the big batch's bits. (An atomicAdd
// scatter, the usual GPU embedding backward, adds in whatever order the threads arrive and
// promises nothing of the kind.)
//
// Both backends keep that order and so compute the same bits. The CPU splits the channels
// across threads (each thread walks every position in order). CUDA gives one thread to
// each (table row, channel): it walks the positions in order, adding the terms whose
// token is its row, in a register that starts from the buffer's value. That reads the
// B x T tokens once per table row, O(V B T) token reads: cheap for the byte-level
// vocabulary (V = 256) this project trains; a large vocabulary would sort the positions by
// token first (a stable sort keeps the order).
//
// Tokens. A token outside [0, V) is an error, never a silent wrong read: the CPU checks
// every token before anything is written. CUDA tokens are checked where they are placed on
// the device (checking here would copy them back in every step); the kernels never read
// outside a table: such a token's forward row is NaN, and its backward adds nothing.
#pragma once

#include "common/tensor.hpp"

namespace bigbatch {

/// out[b][t] = wte[tokens[b][t]] + wpe[t] (=); shapes and dtypes above. Throws for a token
/// outside [0, V) on the CPU (a NaN row on CUDA).
void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& out);
/// dwte[tokens[b][t]] += dout[b][t] and dwpe[t] += dout[b][t] (+=), position by position in
/// row-major order on both backends.
void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dwte,
                        const Tensor& dwpe);

namespace cpu {
/// The CPU reference of bigbatch::embedding_forward.
void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& out);
/// The CPU reference of bigbatch::embedding_backward.
void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dwte,
                        const Tensor& dwpe);
}  // namespace cpu

namespace cuda {
/// The CUDA implementation of bigbatch::embedding_forward.
void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& out);
/// The CUDA implementation of bigbatch::embedding_backward.
void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dwte,
                        const Tensor& dwpe);
}  // namespace cuda

}  // namespace bigbatch
