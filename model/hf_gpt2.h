// Hugging Face GPT-2 checkpoints (safetensors + config.json) in and out, for the GPT-2-compatible
// options: tied embeddings, biases, no qk_norm. Hugging Face's names are ours; its Conv1D weights
// are [in, out] where ours are [out, in], and its wte has vocab_size rows where ours is padded.
// Llama-style models (llama_style) go in and out as Hugging Face Llama (LlamaForCausalLM) when
// they are one: rmsnorm, rope, swiglu, no qk_norm; the names are ours, the matrices [out, in].
#pragma once
#include <string>
#include <vector>

#include "model/gpt.h"

namespace zgpt {

// Throws naming the option when the model is not GPT-2-compatible (Llama-compatible for a
// Llama-style model).
void check_hf_compatible(const ModelConfig& c);

// One of our tensors in Hugging Face's layout and shape: Conv1D weights transposed to [in, out],
// wte cut to its first vocab_size rows. (The import inverts it; the oracle test compares
// gradients in this layout.)
std::vector<int64_t> hf_shape(const ParamSpec& s, int64_t vocab_size);
template <typename T>
std::vector<T> to_hf_layout(const ParamSpec& s, const T* data, int64_t vocab_size);

// Writes dir/model.safetensors and dir/config.json (GPT2LMHeadModel, or LlamaForCausalLM).
void export_hf_gpt2(GPT<float>& model, const std::string& dir);

// Loads a Hugging Face GPT-2 safetensors file into the model's parameters (keys "param.<name>"
// in the oracle files are found too, via prefix); shapes must match the model's config.
template <typename T>
void import_hf_gpt2(GPT<T>& model, const std::string& safetensors_path,
                    const std::string& prefix = "");

// The model config described by a Hugging Face config.json.
ModelConfig read_hf_config(const std::string& config_json);

}  // namespace zgpt
