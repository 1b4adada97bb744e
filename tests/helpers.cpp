#include "tests/helpers.h"

#include <nlohmann/json.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace zgpt::test {

namespace {
std::string& reason_storage() {
    static std::string r;
    return r;
}
}  // namespace

void skip_binary(const std::string& reason) {
    if (reason_storage().empty()) reason_storage() = reason;
}
std::string skip_reason() {
    return reason_storage();
}

std::vector<double> numeric_gradient(const std::function<double()>& f, std::vector<double>& x,
                                     double h) {
    std::vector<double> g(x.size());
    for (size_t i = 0; i < x.size(); i++) {
        const double old = x[i];
        x[i] = old + h;
        const double fp = f();
        x[i] = old - h;
        const double fm = f();
        x[i] = old;
        g[i] = (fp - fm) / (2 * h);
    }
    return g;
}

CommandOutput run_command(const std::string& cmd) {
    CommandOutput o;
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    if (!p) throw std::runtime_error("cannot run: " + cmd);
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) o.text.append(buf, n);
    const int st = pclose(p);
    o.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return o;
}

std::string built_binary(const char* env_var) {
    const char* v = std::getenv(env_var);
    if (!v || !*v)
        throw std::runtime_error(std::string(env_var) +
                                 " must point at the built binary (ctest sets it)");
    return v;
}

std::string oracle_dir() {
    if (const char* e = std::getenv("ZGPT_ORACLES"); e && *e) return e;
    return std::string(ZGPT_SOURCE_DIR) + "/../shared/data/oracles";
}

ModelConfig oracle_model_config(const SafeTensors& st) {
    const auto cfg = nlohmann::json::parse(st.metadata().at("config").get<std::string>());
    ModelConfig mc;
    mc.n_layer = cfg.at("n_layer");
    mc.n_head = cfg.at("n_head");
    mc.n_embd = cfg.at("n_embd");
    mc.block_size = cfg.at("block_size");
    mc.vocab_size = cfg.at("vocab_size");
    mc.tie_embeddings = cfg.at("tie_embeddings");
    mc.bias = cfg.at("bias");
    if (cfg.contains("n_kv_head")) {  // a LlamaForCausalLM oracle (tools/dev/llama_oracle.py)
        mc.n_kv_head = cfg.at("n_kv_head");
        mc.mlp_hidden = cfg.at("mlp_hidden");
        mc.ln_eps = cfg.at("rms_norm_eps");
        mc.rope_theta = cfg.at("rope_theta");
        mc.norm = "rmsnorm";
        mc.position = "rope";
        mc.mlp = "swiglu";
    } else {
        mc.ln_eps = cfg.at("layer_norm_eps");
    }
    return mc;
}

}  // namespace zgpt::test
