// The comparison both model oracles make (test_oracles: GPT-2 from transformers' GPT2LMHeadModel;
// test_llama_oracle: LlamaForCausalLM): the model loads the oracle's parameters through the Hugging
// Face importer, runs its batch, and its logits, loss, CE, z-loss and every parameter gradient (in
// Hugging Face's layout) are held to the oracle's float64 values.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "data/safetensors.h"
#include "kernels/loss_head/cross_entropy.h"
#include "model/hf_gpt2.h"
#include "tests/helpers.h"

namespace zgpt::test {

inline std::vector<int32_t> as_int32(const std::vector<double>& v) {
    return std::vector<int32_t>(v.begin(), v.end());
}

// Reports the worst element and checks all of them.
inline void check_all(const std::string& what, const std::vector<double>& got,
                      const std::vector<double>& want, double rtol, double atol) {
    REQUIRE(got.size() == want.size());
    const MaxError e = compare(got.data(), want.data(), int64_t(got.size()), rtol, atol);
    INFO(what << ": max abs err " << e.abs << ", max rel err " << e.rel << " (worst index "
              << e.worst << ")");
    MESSAGE(what << ": max abs err " << e.abs << ", max rel err " << e.rel);
    CHECK(e.ok);
}

inline double max_abs(const std::vector<double>& v) {
    double m = 0;
    for (double x : v) m = std::max(m, std::fabs(x));
    return m;
}

// model (GPT<float> or GPT<double> of the oracle's config) against the oracle file `file` (read as
// st): rtol relative, and atol_scale of each tensor's largest value absolute. Returns how many
// parameter gradients were compared.
template <class Model>
int check_model_against_oracle(Model& model, const SafeTensors& st, const std::string& file,
                               const CrossEntropyOptions& o, double rtol, double atol_scale) {
    const std::vector<int64_t> shape = st.info("input_ids").shape;
    const int64_t B = shape[0], T = shape[1], V = model.config().vocab_size;
    const std::vector<int32_t> ids = as_int32(st.as_double("input_ids"));
    const std::vector<int32_t> targets = as_int32(st.as_double("targets"));
    import_hf_gpt2(model, file, "param.");
    model.zero_grad();
    model.forward(ids.data(), B, T);
    std::vector<double> logits(B * T * V);
    for (int64_t i = 0; i < B * T; i++)
        for (int64_t j = 0; j < V; j++)
            logits[i * V + j] = model.logits()[i * model.padded_vocab() + j];
    const std::vector<double> want_logits = st.as_double("logits");
    check_all("logits", logits, want_logits, rtol, atol_scale * max_abs(want_logits));
    const double one = 1.0;
    const CrossEntropySummary s = model.loss(targets.data(), o, {&one, false}, true);
    model.backward();
    const double n = double(s.n_valid);
    check_all("loss", {s.loss}, st.as_double("loss"), rtol, 0);
    check_all("ce", {s.sum_ce / n}, st.as_double("ce"), rtol, 0);
    check_all("z_loss", {s.sum_z_loss / n}, st.as_double("z_loss"), rtol, 0);
    int tensors = 0;
    for (const ParamSpec& p : model.layout().table.specs()) {
        CAPTURE(p.name);
        const std::vector<double> want = st.as_double("grad." + p.name);
        const auto g = to_hf_layout(p, model.grads.data() + p.offset, V);
        check_all("grad " + p.name, std::vector<double>(g.begin(), g.end()), want, rtol,
                  atol_scale * max_abs(want));
        tensors++;
    }
    return tensors;
}

}  // namespace zgpt::test
