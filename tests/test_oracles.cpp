// Independent oracles made with PyTorch / Hugging Face in float64 (../shared/data/oracles, or
// $ZGPT_ORACLES): the CPU loss head reproduces every case of ce_cases.safetensors, and the CPU
// model loaded with gpt2_tiny.safetensors reproduces its logits, loss and every parameter gradient.
#include <doctest/doctest.h>

#include <filesystem>

#include "data/safetensors.h"
#include "kernels/cross_entropy.h"
#include "model/gpt.h"
#include "model/hf_gpt2.h"
#include "tests/helpers.h"

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

std::vector<int32_t> as_int32(const std::vector<double>& v) {
    return std::vector<int32_t>(v.begin(), v.end());
}

// Reports the worst element and checks all of them.
void check_all(const char* what, const std::vector<double>& got, const std::vector<double>& want,
               double rtol, double atol) {
    REQUIRE(got.size() == want.size());
    const MaxError e = compare(got.data(), want.data(), int64_t(got.size()), rtol, atol);
    INFO(what << ": max abs err " << e.abs << ", max rel err " << e.rel << " (worst index "
              << e.worst << ")");
    CHECK(e.ok);
}

double max_abs(const std::vector<double>& v) {
    double m = 0;
    for (double x : v) m = std::max(m, std::fabs(x));
    return m;
}

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
    const SafeTensors st = SafeTensors::load(oracle_dir() + "/gpt2_tiny.safetensors");
    const auto cfg = nlohmann::json::parse(st.metadata().at("config").get<std::string>());
    const ModelConfig mc = oracle_model_config(st);
    const std::vector<int64_t> shape = st.info("input_ids").shape;
    const int64_t B = shape[0], T = shape[1], V = mc.vocab_size, C = mc.n_embd;
    const std::vector<int32_t> ids = as_int32(st.as_double("input_ids"));
    const std::vector<int32_t> targets = as_int32(st.as_double("targets"));
    CrossEntropyOptions o;
    o.z_loss_weight = cfg.at("z_loss_weight");
    o.ignore_index = cfg.at("ignore_index");

    // The parameters are loaded by model/hf_gpt2's importer; our gradients are compared in
    // Hugging Face's layout (Conv1D weights [in, out], wte unpadded).
    auto grad_as_hf = [&](auto& model, const ParamSpec& s) {
        const auto g = to_hf_layout(s, model.grads.data() + s.offset, int64_t(mc.vocab_size));
        return std::vector<double>(g.begin(), g.end());
    };
    auto run = [&](auto& model, double rtol, double atol_scale) {
        import_hf_gpt2(model, oracle_dir() + "/gpt2_tiny.safetensors", "param.");
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
        for (const ParamSpec& s2 : model.layout().table.specs()) {
            CAPTURE(s2.name);
            const std::vector<double> want = st.as_double("grad." + s2.name);
            check_all("grad", grad_as_hf(model, s2), want, rtol, atol_scale * max_abs(want));
            tensors++;
        }
        CHECK(tensors == 4 + 12 * mc.n_layer);
        (void)C;
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
