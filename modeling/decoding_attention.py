"""Scaled dot-product attention for a decoding step on the CPU: a C++ kernel, compiled on first use.

At a decoding step each hypothesis has one query. torch's CPU attention kernel, built for long sequences of queries,
takes 1.6 to 1.9 times as long there as this kernel (CHANGELOG.md), which reads each head's keys, then its values,
once for all the queries that attend to them (a sentence's hypotheses, in the encoder-decoder attention). It computes
what torch's kernel computes, with the additions in another order: in float32 (within 1e-6), from float32 or bfloat16
keys and values. torch's extension
builder compiles it with the machine's C++ compiler and ninja into torch's extension cache, once per torch version and
CPU instruction set (a cache shared by machines of different CPUs stays valid). Where it cannot be built, decoding
uses torch's kernel, and says so once.
"""

import functools
import logging
import re
import warnings

import torch


# Section 3.2.1's softmax(q K^T * scale) V for a decoding step. In this file, not one of its own, so that a saved
# model's folder, whose code transformers loads file by file (configuration_vaswani.remote_code_files), holds it.
SOURCE = r"""
#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

// The loops of one (batch row, head) per task, for query, key and value of one type: float, or bfloat16 read as float
// (the sums are float either way).
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

  at::parallel_for(0, batch * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query_values(queries * key_size), weights(queries * length), sums(queries * value_size);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / heads, h = row % heads;
      const scalar_t* keys = k + b * key.stride(0) + h * key.stride(1);
      const scalar_t* values = v + b * value.stride(0) + h * value.stride(1);
      for (int64_t i = 0; i < queries; ++i)
        for (int64_t j = 0; j < key_size; ++j)
          query_values[i * key_size + j] = static_cast<float>(q[b * query.stride(0) + h * query.stride(1) +
                                                                i * query.stride(2) + j]);
      for (int64_t t = 0; t < length; ++t) {  // each key read once, for every query
        const scalar_t* key_t = keys + t * key.stride(2);
        for (int64_t i = 0; i < queries; ++i) {
          const float* query_i = query_values.data() + i * key_size;
          float dot = 0.f;
          for (int64_t j = 0; j < key_size; ++j) dot += query_i[j] * static_cast<float>(key_t[j]);
          const bool keep = allowed == nullptr || allowed[b * mask_batch + i * mask_query + t * mask_position];
          weights[i * length + t] = keep ? dot * factor : minus_inf;
        }
      }
      for (int64_t i = 0; i < queries; ++i) {  // softmax over the positions
        float* w = weights.data() + i * length;
        const float largest = *std::max_element(w, w + length);
        float total = 0.f;
        for (int64_t t = 0; t < length; ++t) total += (w[t] = std::exp(w[t] - largest));
        for (int64_t t = 0; t < length; ++t) w[t] /= total;
      }
      std::fill(sums.begin(), sums.end(), 0.f);
      for (int64_t t = 0; t < length; ++t) {  // each value read once, for every query
        const scalar_t* value_t = values + t * value.stride(2);
        for (int64_t i = 0; i < queries; ++i) {
          const float weight = weights[i * length + t];
          float* sum = sums.data() + i * value_size;
          for (int64_t j = 0; j < value_size; ++j) sum[j] += weight * static_cast<float>(value_t[j]);
        }
      }
      for (int64_t i = 0; i < queries; ++i) {
        scalar_t* target = out + ((b * queries + i) * heads + h) * value_size;
        for (int64_t j = 0; j < value_size; ++j) target[j] = static_cast<scalar_t>(sums[i * value_size + j]);
      }
    }
  });
}

// query (B, H, Q, d_k), key (B, H, T, d_k), value (B, H, T, d_v), of one type, float32 or bfloat16, each with its
// last dimension contiguous; mask, where given, a bool (B, 1, 1 or Q, T), true where a query may attend. Returns
// (B, Q, H, d_v), contiguous, of their type. torch's profiler shows it as vaswani::decoding_attention.
torch::Tensor decoding_attention(
    const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
    const std::optional<torch::Tensor>& mask, double scale) {
  RECORD_FUNCTION("vaswani::decoding_attention", std::vector<c10::IValue>());
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
"""

# The reductions in the kernel's loops vectorize only where additions may be reordered; no flag assumes finite
# numbers, as masked positions score -inf.
FLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math"]
INSTRUCTION_SETS = {
    "AVX2": ["-mavx2", "-mfma"],
    "AVX512": ["-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mfma"],
}


@functools.cache
def compiled_kernel():
    """The kernel's function, compiled and loaded once a process; None where it cannot be built (a warning says why)."""
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
            name=f"vaswani_decoding_attention_{torch_version}_{capability.lower()}",
            cpp_sources=[SOURCE],
            functions=["decoding_attention"],
            extra_cflags=FLAGS + INSTRUCTION_SETS.get(capability, []),
            extra_ldflags=["-fopenmp"],
        )
    except (OSError, RuntimeError, ImportError) as error:  # no compiler, no ninja, a failed build
        warnings.warn(f"Decoding on the CPU uses torch's attention kernel: vaswani's could not be built ({error}).")
        return None
    return extension.decoding_attention


def decoding_attention(module, query, key, value, attention_mask, scaling, **kwargs):
    """An attention function as transformers' attention interface calls it: the output (batch, queries, heads, d_v)
    and no weights, as torch's kernel (`sdpa`) returns them."""
    return compiled_kernel()(query, key, value, attention_mask, scaling), None
