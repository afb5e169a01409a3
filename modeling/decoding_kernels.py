"""The CPU kernels of a one-token decoding step, in C++, compiled on first use: its attention, its decoder layers, and
the beam search's choice of continuations.

At a decoding step each hypothesis has one query. torch's CPU attention kernel, built for long sequences of queries,
takes 1.7 to 3 times as long there as `decoding_attention`, which keeps its sums in registers, sixteen numbers at a
time, and attends a sentence's hypotheses to its encoder output in one task. It computes what torch's kernel computes,
with the additions in another order: in float32 (within 1e-6), from float32 or bfloat16 keys and values.
`best_continuations` picks each sentence's best continuations in one pass over the step's log-probabilities, in a
quarter of the time torch's top-k takes over them summed with the hypotheses' scores. `copy_cache_rows` copies the
rows of a beam search's self-attention cache in one pass, each (row, head) one block. `decoder_layers_step` runs the
decoder's layers of a step: the operators their modules call, in the same order, with no Python between them (a
module's Python costs as much as its operators at the few rows of a step), so it gives their results bit for bit.
torch's extension builder compiles the kernels with the machine's C++ compiler and ninja into torch's extension cache,
once per torch version and CPU instruction set (a cache shared by machines of different CPUs stays valid). Where they
cannot be built, decoding uses torch's attention kernel, the layers' modules and torch's top-k, and says so once.
"""

import functools
import logging
import re
import warnings

import torch


# Section 3.2.1's softmax(q K^T * scale) V for a decoding step, section 3.1's decoder layers and section 6.1's beam.
# In this file, not one of their own, so that a saved model's folder, whose code transformers loads file by file
# (configuration_vaswani.remote_code_files), holds them.
SOURCE = r"""
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

// Sixteen floats, one AVX-512 register or two AVX2 ones: the unit of the loops below, which keep their sums in
// registers (GCC's and Clang's vector extension, lowered to the instruction set the kernels are built for).
typedef float floats16 __attribute__((vector_size(64)));
typedef int32_t ints16 __attribute__((vector_size(64)));  // a comparison's lanes: -1 where true, 0 where not

inline floats16 load16(const float* p) {
  floats16 x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

inline floats16 load16(const at::BFloat16* p) {  // a bfloat16 is a float's upper 16 bits
  typedef uint16_t halves16 __attribute__((vector_size(32)));
  typedef uint32_t words16 __attribute__((vector_size(64)));
  halves16 h;
  std::memcpy(&h, p, sizeof h);
  const words16 w = __builtin_convertvector(h, words16) << 16;
  floats16 x;
  std::memcpy(&x, &w, sizeof x);
  return x;
}

inline float sum16(floats16 x) {
  float total = 0.f;
  for (int u = 0; u < 16; ++u) total += x[u];
  return total;
}

// q . k over `size` numbers: sixteen at a time, the rest one by one.
template <typename scalar_t>
inline float dot(const float* q, const scalar_t* k, int64_t size) {
  floats16 partial = {};
  int64_t j = 0;
  for (; j + 16 <= size; j += 16) partial += load16(q + j) * load16(k + j);
  float total = sum16(partial);
  for (; j < size; ++j) total += q[j] * static_cast<float>(k[j]);
  return total;
}

// The loops of one (batch row, head) per task, for query, key and value of one type: float, or bfloat16 read as float
// (the sums are float either way). Each query's scores take four keys at a time, its weighted sum of the values 64
// of their numbers at a time, so that independent sums overlap.
template <typename scalar_t>
void attend(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value, const bool* allowed,
            int64_t mask_batch, int64_t mask_query, int64_t mask_position, float factor, torch::Tensor& output) {
  const int64_t batch = query.size(0), heads = query.size(1), queries = query.size(2), key_size = query.size(3);
  const int64_t length = key.size(2), value_size = value.size(3);
  const scalar_t* q = query.data_ptr<scalar_t>();
  const scalar_t* k = key.data_ptr<scalar_t>();
  const scalar_t* v = value.data_ptr<scalar_t>();
  scalar_t* out = output.data_ptr<scalar_t>();
  const float minus_inf = -std::numeric_limits<float>::infinity();
  const int64_t key_stride = key.stride(2), value_stride = value.stride(2);

  at::parallel_for(0, batch * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query_values(key_size), weights(length);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / heads, h = row % heads;
      const scalar_t* keys = k + b * key.stride(0) + h * key.stride(1);
      const scalar_t* values = v + b * value.stride(0) + h * value.stride(1);
      for (int64_t i = 0; i < queries; ++i) {
        const float* query_i = query_values.data();
        for (int64_t j = 0; j < key_size; ++j)
          query_values[j] = static_cast<float>(q[b * query.stride(0) + h * query.stride(1) + i * query.stride(2) + j]);
        float* w = weights.data();
        int64_t t = 0;
        if (key_size % 16 == 0) {
          for (; t + 4 <= length; t += 4) {
            floats16 s0 = {}, s1 = {}, s2 = {}, s3 = {};
            const scalar_t* k0 = keys + t * key_stride;
            for (int64_t j = 0; j < key_size; j += 16) {
              const floats16 x = load16(query_i + j);
              s0 += x * load16(k0 + j);
              s1 += x * load16(k0 + key_stride + j);
              s2 += x * load16(k0 + 2 * key_stride + j);
              s3 += x * load16(k0 + 3 * key_stride + j);
            }
            w[t] = sum16(s0), w[t + 1] = sum16(s1), w[t + 2] = sum16(s2), w[t + 3] = sum16(s3);
          }
        }
        for (; t < length; ++t) w[t] = dot(query_i, keys + t * key_stride, key_size);
        float largest = minus_inf;
        for (t = 0; t < length; ++t) {
          const bool keep = allowed == nullptr || allowed[b * mask_batch + i * mask_query + t * mask_position];
          w[t] = keep ? w[t] * factor : minus_inf;
          largest = std::max(largest, w[t]);
        }
        float total = 0.f;
        for (t = 0; t < length; ++t) total += (w[t] = std::exp(w[t] - largest));
        const float normaliser = 1.f / total;
        scalar_t* target = out + ((b * queries + i) * heads + h) * value_size;
        int64_t j = 0;
        for (; j + 64 <= value_size; j += 64) {
          floats16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
          for (t = 0; t < length; ++t) {
            const scalar_t* value_t = values + t * value_stride + j;
            const float weight = w[t];
            a0 += weight * load16(value_t), a1 += weight * load16(value_t + 16);
            a2 += weight * load16(value_t + 32), a3 += weight * load16(value_t + 48);
          }
          const floats16 parts[4] = {a0, a1, a2, a3};
          for (int p = 0; p < 4; ++p)
            for (int u = 0; u < 16; ++u) target[j + 16 * p + u] = static_cast<scalar_t>(parts[p][u] * normaliser);
        }
        for (; j < value_size; ++j) {
          float sum = 0.f;
          for (t = 0; t < length; ++t) sum += w[t] * static_cast<float>(values[t * value_stride + j]);
          target[j] = static_cast<scalar_t>(sum * normaliser);
        }
      }
    }
  });
}

// query (B, H, Q, d_k), key (B, H, T, d_k), value (B, H, T, d_v), of one type, float32 or bfloat16, each with its
// last dimension contiguous; mask, where given, a bool (B, 1, 1 or Q, T), true where a query may attend. Returns
// (B, Q, H, d_v), contiguous, of their type. torch's profiler shows it as vaswani::decoding_attention, with its
// inputs' shapes.
torch::Tensor decoding_attention(
    const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
    const std::optional<torch::Tensor>& mask, double scale) {
  RECORD_FUNCTION("vaswani::decoding_attention", std::vector<c10::IValue>({query, key, value}));
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, "query, key and value must be 4-dimensional");
  const auto type = query.scalar_type();
  TORCH_CHECK((type == torch::kFloat || type == torch::kBFloat16) && key.scalar_type() == type &&
                  value.scalar_type() == type, "query, key and value must be all float32 or all bfloat16");
  TORCH_CHECK(query.stride(3) == 1 && key.stride(3) == 1 && value.stride(3) == 1,
              "query, key and value must be contiguous in their last dimension");
  const int64_t batch = query.size(0), heads = query.size(1), queries = query.size(2), key_size = query.size(3);
  const int64_t length = key.size(2), value_size = value.size(3);
  TORCH_CHECK(key.size(0) == batch && key.size(1) == heads && key.size(3) == key_size && value.size(0) == batch &&
                  value.size(1) == heads && value.size(2) == length, "query, key and value shapes do not match");
  const bool* allowed = nullptr;
  int64_t mask_batch = 0, mask_query = 0, mask_position = 0;
  if (mask.has_value()) {
    TORCH_CHECK(mask->scalar_type() == torch::kBool && mask->dim() == 4 && mask->size(0) == batch &&
                    mask->size(1) == 1 && (mask->size(2) == 1 || mask->size(2) == queries) && mask->size(3) == length,
                "the mask must be a bool (batch, 1, 1 or queries, length) tensor");
    allowed = mask->data_ptr<bool>();
    mask_batch = mask->stride(0);
    mask_query = mask->size(2) == 1 ? 0 : mask->stride(2);
    mask_position = mask->stride(3);
  }
  auto output = torch::empty({batch, queries, heads, value_size}, query.options());
  const float factor = static_cast<float>(scale);
  if (type == torch::kFloat)
    attend<float>(query, key, value, allowed, mask_batch, mask_query, mask_position, factor, output);
  else
    attend<at::BFloat16>(query, key, value, allowed, mask_batch, mask_query, mask_position, factor, output);
  return output;
}

// Section 6.1's beam at one step, for each sentence searched: log_probs holds `width` rows a sentence, one for each
// of its live hypotheses (row r extends hypothesis held[s][r], of summed log-probability row_scores[s][r]). Returns
// the `count` best one-token continuations of each sentence, as generation_vaswani.best_continuations computes them:
// their summed scores (-inf at or below the lowest float: an ending forced where no processor allowed one), best
// first, equal ones by hypothesis, then token; the row each extends; and their ids, hypothesis * vocabulary + token.
// Chosen by the summed score (NaN above every number, as torch's top-k ranks it), then the id. 64 tokens at a time
// are compared with the worst one kept, and placed one by one only where one of them is not below it.
std::vector<torch::Tensor> best_continuations(const torch::Tensor& log_probs, const torch::Tensor& row_scores,
                                              const torch::Tensor& held, int64_t count) {
  RECORD_FUNCTION("vaswani::best_continuations", std::vector<c10::IValue>({log_probs}));
  TORCH_CHECK(log_probs.dim() == 3 && log_probs.scalar_type() == torch::kFloat && log_probs.stride(2) == 1,
              "log_probs must be a float32 (sentences, width, vocabulary) tensor, contiguous in its last dimension");
  const int64_t sentences = log_probs.size(0), width = log_probs.size(1), vocab = log_probs.size(2);
  TORCH_CHECK(row_scores.scalar_type() == torch::kFloat && held.scalar_type() == torch::kLong &&
                  row_scores.sizes() == held.sizes() && row_scores.dim() == 2 && row_scores.size(0) == sentences &&
                  row_scores.size(1) == width,
              "row_scores (float32) and held (int64) must be (sentences, width)");
  TORCH_CHECK(count >= 1 && count <= width * vocab, "count must be between 1 and width * vocabulary");
  const auto scores_in = row_scores.contiguous();
  const auto held_in = held.contiguous();
  auto scores = torch::empty({sentences, count}, log_probs.options());
  auto rows = torch::empty({sentences, count}, held.options());
  auto ids = torch::empty({sentences, count}, held.options());
  const float* lp = log_probs.data_ptr<float>();
  const float* rs = scores_in.data_ptr<float>();
  const int64_t* hs = held_in.data_ptr<int64_t>();
  float* out_scores = scores.data_ptr<float>();
  int64_t* out_rows = rows.data_ptr<int64_t>();
  int64_t* out_ids = ids.data_ptr<int64_t>();
  const float lowest = std::numeric_limits<float>::lowest();
  struct Candidate {
    float score;
    int64_t id, row;
  };
  // a before b: NaN first, then the higher score, then the lower id
  const auto before = [](const Candidate& a, const Candidate& b) {
    const bool a_nan = std::isnan(a.score), b_nan = std::isnan(b.score);
    if (a_nan != b_nan) return a_nan;
    if (!a_nan && a.score != b.score) return a.score > b.score;
    return a.id < b.id;
  };
  at::parallel_for(0, sentences, 1, [&](int64_t begin, int64_t end) {
    std::vector<Candidate> kept;
    kept.reserve(count + 1);
    for (int64_t s = begin; s < end; ++s) {
      kept.clear();
      for (int64_t r = 0; r < width; ++r) {
        const float* row = lp + s * log_probs.stride(0) + r * log_probs.stride(1);
        const float base = rs[s * width + r];
        const int64_t first_id = hs[s * width + r] * vocab;
        const auto place = [&](int64_t token) {
          const Candidate candidate{base + row[token], first_id + token, r};
          if (static_cast<int64_t>(kept.size()) == count && !before(candidate, kept.back())) return;
          kept.insert(std::upper_bound(kept.begin(), kept.end(), candidate, before), candidate);
          if (static_cast<int64_t>(kept.size()) > count) kept.pop_back();
        };
        int64_t token = 0;
        for (; token + 64 <= vocab; token += 64) {
          if (static_cast<int64_t>(kept.size()) == count) {  // not one of the 64 below the worst kept: none placed
            const float worst = kept.back().score;
            const ints16 below = (base + load16(row + token) < worst) & (base + load16(row + token + 16) < worst) &
                                 (base + load16(row + token + 32) < worst) & (base + load16(row + token + 48) < worst);
            int all = -1;
            for (int u = 0; u < 16; ++u) all &= below[u];
            if (all) continue;
          }
          for (int64_t u = token; u < token + 64; ++u) place(u);
        }
        for (; token < vocab; ++token) place(token);
      }
      for (auto& candidate : kept)
        if (candidate.score <= lowest) candidate.score = -std::numeric_limits<float>::infinity();
      std::stable_sort(kept.begin(), kept.end(), before);
      for (int64_t c = 0; c < count; ++c) {
        out_scores[s * count + c] = kept[c].score;
        out_rows[s * count + c] = kept[c].row;
        out_ids[s * count + c] = kept[c].id;
      }
    }
  });
  return {scores, rows, ids};
}

// x W^T + b by oneDNN, from W packed for its kernels (generation_vaswani.packed_linear, the same operator).
static torch::Tensor packed_linear(const torch::Tensor& x, const torch::Tensor& w,
                                   const std::optional<torch::Tensor>& b) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const std::optional<torch::Tensor>&,
                               c10::string_view, c10::List<std::optional<at::Scalar>>,
                               std::optional<c10::string_view>)>();
  return op.call(x, w, b, "none", c10::List<std::optional<at::Scalar>>(), c10::string_view(""));
}

// Section 3.1's decoder layers at a one-token step, as VaswaniDecoderLayer's modules compute them (post-norm
// self-attention, encoder-decoder attention, ReLU feed-forward; no dropout). hidden (rows, 1, d_model); per layer, 16
// packed linear weights and biases (query, key, value, output of the self-attention; query and output of the
// encoder-decoder attention; the feed-forward's two), 6 layer norm weights and biases, its self-attention cache
// buffer (2, rows, heads, room, size), whose position `filled` this step writes, and its encoder-decoder keys and
// values (sentences, heads, length, size), one sentence's rows in a row where rows are its hypotheses.
torch::Tensor decoder_layers_step(
    torch::Tensor hidden, const std::vector<std::optional<torch::Tensor>>& linears,
    const std::vector<torch::Tensor>& norms, double eps, const std::vector<torch::Tensor>& self_buffers,
    int64_t filled, const std::vector<torch::Tensor>& cross, const std::optional<torch::Tensor>& self_mask,
    const std::optional<torch::Tensor>& cross_mask, int64_t heads, int64_t key_size, int64_t value_size,
    double scaling) {
  RECORD_FUNCTION("vaswani::decoder_layers_step", std::vector<c10::IValue>({hidden}));
  const int64_t layers = self_buffers.size();
  TORCH_CHECK(hidden.dim() == 3 && hidden.size(1) == 1, "hidden must be (rows, 1, d_model)");
  TORCH_CHECK(static_cast<int64_t>(linears.size()) == 16 * layers &&
                  static_cast<int64_t>(norms.size()) == 6 * layers &&
                  static_cast<int64_t>(cross.size()) == 2 * layers,
              "16 linear tensors, 6 norm tensors and 2 encoder-decoder tensors a layer");
  const int64_t rows = hidden.size(0);
  const std::vector<int64_t> shape{hidden.size(2)};
  const auto split = [&](const torch::Tensor& states, int64_t size) {
    return states.view({rows, 1, heads, size}).transpose(1, 2);
  };
  for (int64_t l = 0; l < layers; ++l) {
    const auto* p = linears.data() + 16 * l;
    const auto* n = norms.data() + 6 * l;
    const auto& buffer = self_buffers[l];
    TORCH_CHECK(buffer.size(1) == rows && buffer.size(3) > filled, "a self-attention cache buffer without room");
    auto query = split(packed_linear(hidden, *p[0], p[1]), key_size);
    buffer.select(0, 0).narrow(2, filled, 1).narrow(3, 0, key_size).copy_(
        split(packed_linear(hidden, *p[2], p[3]), key_size));
    buffer.select(0, 1).narrow(2, filled, 1).narrow(3, 0, value_size).copy_(
        split(packed_linear(hidden, *p[4], p[5]), value_size));
    auto keys = buffer.select(0, 0).narrow(2, 0, filled + 1).narrow(3, 0, key_size);
    auto values = buffer.select(0, 1).narrow(2, 0, filled + 1).narrow(3, 0, value_size);
    auto output = decoding_attention(query, keys, values, self_mask, scaling).reshape({rows, 1, -1});
    hidden = at::layer_norm(hidden + packed_linear(output, *p[6], p[7]), shape, n[0], n[1], eps);
    query = split(packed_linear(hidden, *p[8], p[9]), key_size);
    const int64_t sentences = cross[2 * l].size(0);
    if (sentences < rows)  // a sentence's hypotheses attend to its encoder output as one sequence of queries
      query = query.unflatten(0, {sentences, rows / sentences}).transpose(1, 2).flatten(2, 3);
    output = decoding_attention(query, cross[2 * l], cross[2 * l + 1], cross_mask, scaling).reshape({rows, 1, -1});
    hidden = at::layer_norm(hidden + packed_linear(output, *p[10], p[11]), shape, n[2], n[3], eps);
    const auto inner = at::relu(packed_linear(hidden, *p[12], p[13]));
    hidden = at::layer_norm(hidden + packed_linear(inner, *p[14], p[15]), shape, n[4], n[5], eps);
  }
  return hidden;
}

// Rows sources[i] of src, a self-attention cache buffer (2, rows, heads, room, size), copied into rows targets[i] of
// dst, of the same layout, for their first `filled` positions; each (row, head) one contiguous block. Where src is dst,
// no row may be both a source and a target (the beam search's moved rows never are).
void copy_cache_rows(const torch::Tensor& src, const torch::Tensor& dst, const torch::Tensor& sources,
                     const torch::Tensor& targets, int64_t filled) {
  RECORD_FUNCTION("vaswani::copy_cache_rows", std::vector<c10::IValue>({src, sources}));
  TORCH_CHECK(src.dim() == 5 && dst.dim() == 5 && src.size(0) == 2 && dst.size(0) == 2 && src.is_contiguous() &&
                  dst.is_contiguous() && src.scalar_type() == dst.scalar_type() && src.size(2) == dst.size(2) &&
                  src.size(4) == dst.size(4),
              "src and dst must be contiguous cache buffers (2, rows, heads, room, size) of one type and shape");
  TORCH_CHECK(filled >= 0 && filled <= src.size(3) && filled <= dst.size(3), "filled exceeds a buffer's room");
  TORCH_CHECK(sources.scalar_type() == torch::kLong && targets.scalar_type() == torch::kLong && sources.dim() == 1 &&
                  targets.dim() == 1 && sources.numel() == targets.numel() && sources.is_contiguous() &&
                  targets.is_contiguous(),
              "sources and targets must be int64 vectors of one length");
  const int64_t pairs = sources.numel(), heads = src.size(2);
  const int64_t* from_row = sources.data_ptr<int64_t>();
  const int64_t* to_row = targets.data_ptr<int64_t>();
  for (int64_t i = 0; i < pairs; ++i)
    TORCH_CHECK(from_row[i] >= 0 && from_row[i] < src.size(1) && to_row[i] >= 0 && to_row[i] < dst.size(1),
                "a source or target row out of the buffers' rows");
  const int64_t item = src.element_size(), bytes = filled * src.size(4) * item;
  const char* from = static_cast<const char*>(src.data_ptr());
  char* to = static_cast<char*>(dst.data_ptr());
  at::parallel_for(0, 2 * pairs * heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t half = task / (pairs * heads), i = task / heads % pairs, h = task % heads;
      std::memcpy(to + (half * dst.stride(0) + to_row[i] * dst.stride(1) + h * dst.stride(2)) * item,
                  from + (half * src.stride(0) + from_row[i] * src.stride(1) + h * src.stride(2)) * item, bytes);
    }
  });
}
"""

# The reductions in the kernel's loops vectorize only where additions may be reordered; no flag assumes finite
# numbers, as masked positions score -inf.
FLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math"]
INSTRUCTION_SETS = {
    "AVX2": ["-mavx2", "-mfma"],
    "AVX512": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mfma"],
}


@functools.cache
def compiled_kernels():
    """The kernels' module (`decoding_attention`, `decoder_layers_step`, `copy_cache_rows`, `best_continuations`),
    compiled and loaded once a process; None where they cannot be built (a warning says why)."""
    # Imported here, not with the model: a CUDA build of torch logs where it looked for CUDA when its extension builder
    # is first imported, a line every command would print; quieted, as a CPU kernel needs no CUDA.
    builder_log = logging.getLogger("torch.utils.cpp_extension")
    level = builder_log.level
    builder_log.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        builder_log.setLevel(level)
    capability = torch.backends.cpu.get_cpu_capability()
    # One build a torch version and instruction set: torch's extension cache tells builds apart by name and source
    # only, and an extension built against another torch fails to load, or crashes.
    torch_version = re.sub(r"\W", "_", torch.__version__)
    try:
        extension = cpp_extension.load_inline(
            name=f"vaswani_decoding_kernels_{torch_version}_{capability.lower()}",
            cpp_sources=[SOURCE],
            functions=["decoding_attention", "decoder_layers_step", "copy_cache_rows", "best_continuations"],
            extra_cflags=FLAGS + INSTRUCTION_SETS.get(capability, []),
            extra_ldflags=["-fopenmp"],
        )
    except (OSError, RuntimeError, ImportError) as error:  # no compiler, no ninja, a failed build
        warnings.warn(
            f"Decoding on the CPU uses torch's attention kernel and the layers' modules: vaswani's kernels could not be "
            f"built ({error})."
        )
        return None
    return extension


def decoding_attention(module, query, key, value, attention_mask, scaling, **kwargs):
    """An attention function as transformers' attention interface calls it: the output (batch, queries, heads, d_v)
    and no weights, as torch's kernel (`sdpa`) returns them."""
    return compiled_kernels().decoding_attention(query, key, value, attention_mask, scaling), None
