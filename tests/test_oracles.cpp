// Independent oracles made with PyTorch / Hugging Face in float64 (../shared/data/oracles, or
// $ZGPT_ORACLES): the CPU loss head reproduces every case of ce_cases.safetensors, and the CPU
// model loaded with gpt2_tiny.safetensors reproduces its logits, loss and every parameter gradient.
#include <doctest/doctest.h>

#include <filesystem>

#include "data/safetensors.h"
#include "kernels/loss_head/cross_entropy.h"
#include "model/gpt.h"
#include "model/hf_gpt2.h"
#include "tests/helpers.h"
#include "tests/oracle_check.h"

using namespace zgpt;
using namespace zgpt::test;

namespace {

const bool kHaveOracles = [] {
    const std::string dir = oracle_dir();
    if (!std::filesystem::exists(dir + "/ce_cases.safetensors") ||
        !std::filesystem::exists(dir + "/gpt2_tiny.safetensors"))
        skip_binary("oracle files not found in " + dir + " (set ZGPT_ORACLES to their directory)");
    return true;
}();

}  // namespace

TEST_CASE("loss head reproduces every case of ce_cases.safetensors") {
    const SafeTensors st = SafeTensors::load(oracle_dir() + "/ce_cases.safetensors");
    const auto cases = nlohmann::json::parse(st.metadata().at("cases").get<std::string>());
    CHECK(cases.size() == 8);
    for (auto it = cases.begin(); it != cases.end(); ++it) {
        const std::string name = it.key();
        const auto& c = it.value();
        CAPTURE(name);
        const int64_t N = c.at("N"), V = c.at("V");
        CrossEntropyOptions o;
        o.z_loss_weight = c.at("z_loss_weight");
        o.label_smoothing = c.at("label_smoothing");
        o.ignore_index = c.at("ignore_index");
        o.reduction = parse_reduction(c.at("reduction"));
        const std::vector<double> logits64 = st.as_double(name + ".logits");
        std::vector<float> logits(logits64.begin(), logits64.end());  // stored f32: exact
        const std::vector<int32_t> targets = as_int32(st.as_double(name + ".targets"));
        const std::vector<double> grad_output = st.as_double(name + ".grad_output");
        std::vector<double> rows(N), lse(N);
        const CrossEntropySummary s =
            cpu::cross_entropy(logits.data(), V, targets.data(), N, V, o,
                               {grad_output.data(), o.reduction == Reduction::none},
                               {rows.data(), nullptr, nullptr, lse.data()}, true);
        const std::vector<double> want_loss = st.as_double(name + ".loss");
        if (o.reduction == Reduction::none)
            check_all("loss (per row)", rows, want_loss, 1e-6, 1e-12);
        else
            check_all("loss", {s.loss}, want_loss, 1e-6, 1e-12);
        check_all("loss_rows", rows, st.as_double(name + ".loss_rows"), 1e-6, 1e-12);
        // lse is only defined where it is used: compare the valid rows.
        const std::vector<double> want_lse = st.as_double(name + ".lse");
        for (int64_t i = 0; i < N; i++)
            if (targets[i] != o.ignore_index) CHECK(close(lse[i], want_lse[i], 1e-6, 1e-12));
        // dlogits in float: about 1e-6 relative; entries far below the row's scale (exp(-100)
        // probabilities) are held to an absolute 1e-6 of the largest gradient.
        const std::vector<double> want_d = st.as_double(name + ".dlogits");
        check_all("dlogits", std::vector<double>(logits.begin(), logits.end()), want_d, 1e-6,
                  1e-6 * max_abs(want_d) + 1e-30);
    }
}

TEST_CASE("tiny GPT-2 reproduces gpt2_tiny.safetensors: logits, loss and every gradient") {
    const std::string file = oracle_dir() + "/gpt2_tiny.safetensors";
    const SafeTensors st = SafeTensors::load(file);
    const auto cfg = nlohmann::json::parse(st.metadata().at("config").get<std::string>());
    const ModelConfig mc = oracle_model_config(st);
    CrossEntropyOptions o;
    o.z_loss_weight = cfg.at("z_loss_weight");
    o.ignore_index = cfg.at("ignore_index");
    // The parameters are loaded by model/hf_gpt2's importer; our gradients are compared in
    // Hugging Face's layout (Conv1D weights [in, out], wte unpadded).
    auto run = [&](auto& model, double rtol, double atol_scale) {
        CHECK(check_model_against_oracle(model, st, file, o, rtol, atol_scale) ==
              4 + 12 * mc.n_layer);
    };
    SUBCASE("double: the same math, to rounding") {
        GPT<double> m(mc);
        run(m, 1e-9, 1e-9);
    }
    SUBCASE("float (the CPU fp32 reference): about 1e-5 relative") {
        GPT<float> m(mc);
        run(m, 1e-5, 1e-5);
    }
}
