// End to end through the real binaries: prepare_data, then train from a YAML config; the run
// directory, metrics fields, falling loss, repeatability per seed, --help, and a config error.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Output {
    int code;
    std::string text;
};

Output run(const std::string& cmd) {
    Output o{0, ""};
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) o.text.append(buf, n);
    const int st = pclose(p);
    o.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return o;
}

std::string bin(const char* var) {
    const char* v = std::getenv(var);
    REQUIRE_MESSAGE(v, var << " must point at the built binary (ctest sets it)");
    return v;
}

std::vector<json> read_metrics(const fs::path& p) {
    std::vector<json> out;
    std::ifstream f(p);
    for (std::string line; std::getline(f, line);) out.push_back(json::parse(line));
    return out;
}

// A small corpus with structure a tiny model can learn quickly.
fs::path make_corpus(const fs::path& dir) {
    fs::create_directories(dir);
    std::ostringstream s;
    const char* lines[] = {"the cat sat on the mat.\n", "a dog ran in the fog.\n",
                           "to be or not to be.\n", "all good things come to an end.\n"};
    for (int i = 0; i < 2000; i++) s << lines[(i * 7 + i / 3) % 4];
    const fs::path p = dir / "corpus.txt";
    std::ofstream(p) << s.str();
    return p;
}

const char* kConfig = R"(model:
  n_layer: 2
  n_head: 2
  n_embd: 32
  block_size: 32
train:
  batch_size: 8
  max_steps: 60
  eval_every: 30
  eval_batches: 4
  log_every: 20
  threads: 2
optim:
  lr: 1.0e-2
  min_lr: 1.0e-3
  warmup_steps: 5
loss:
  z_loss_weight: 1.0e-4
)";

}  // namespace

TEST_CASE("prepare_data + train: run directory, metrics, falling loss, repeatable per seed") {
    const fs::path dir = fs::temp_directory_path() / "zgpt_test_train";
    fs::remove_all(dir);
    const fs::path corpus = make_corpus(dir);
    Output prep = run(bin("ZGPT_PREPARE_BIN") + " --input " + corpus.string() + " --out " +
                      (dir / "shards").string() + " --tokenizer char");
    INFO(prep.text);
    REQUIRE(prep.code == 0);
    CHECK(fs::exists(dir / "shards/train_000000.bin"));
    CHECK(fs::exists(dir / "shards/val_000000.bin"));
    CHECK(fs::exists(dir / "shards/tokenizer.json"));

    std::ofstream(dir / "tiny.yaml")
        << kConfig << "data:\n  train: " << (dir / "shards").string()
        << "/train_*.bin\n  val: " << (dir / "shards").string() << "/val_*.bin\n";
    auto train = [&](const std::string& name) {
        return run(bin("ZGPT_TRAIN_BIN") + " -c " + (dir / "tiny.yaml").string() +
                   " --set train.out_dir=" + (dir / "runs").string() +
                   " --set train.run_name=" + name);
    };
    Output a = train("a");
    INFO(a.text);
    REQUIRE(a.code == 0);
    CHECK(a.text.find("training on the CPU") != std::string::npos);
    CHECK(a.text.find("step 60/60 | loss") != std::string::npos);
    const fs::path run_a = dir / "runs/a";
    for (const char* f : {"config.yaml", "metrics.jsonl", "provenance.json", "summary.json"})
        CHECK(fs::exists(run_a / f));
    const auto m = read_metrics(run_a / "metrics.jsonl");
    REQUIRE(m.size() == 61);  // step 0 (validation at init) + 60 steps
    CHECK(m[0].contains("val_loss"));
    for (const char* k : {"step", "loss", "ce", "z_loss", "lse_mean", "max_logit", "grad_norm",
                          "lr", "tokens", "tok_per_s", "mfu"})
        CHECK(m[5].contains(k));
    CHECK(m[30].contains("val_loss"));
    CHECK(m[60].contains("val_ce"));
    CHECK(m[60]["tokens"] == 60 * 8 * 32);
    const double z = m[60]["z_loss"], lse = m[60]["lse_mean"];
    CHECK(z > 0.0);
    CHECK(z < 1e-4 * lse * lse * 10);  // logged separately, and sized like z * lse^2
    const double first = m[1]["loss"], last = m[60]["loss"];
    CHECK(last < first - 1.0);  // from ~log(vocab) to well below
    CHECK(double(m[60]["val_loss"]) < double(m[0]["val_loss"]) - 1.0);
    const json prov = json::parse(std::ifstream(run_a / "provenance.json"));
    CHECK(prov.contains("git_commit"));
    CHECK(prov["device"] == "cpu");

    Output b = train("b");
    REQUIRE(b.code == 0);
    const auto mb = read_metrics(dir / "runs/b/metrics.jsonl");
    for (size_t i = 1; i < m.size(); i++) CHECK(m[i]["loss"] == mb[i]["loss"]);  // bit-identical
}

TEST_CASE("train --help lists options and config keys; a bad config fails with a clear message") {
    Output h = run(bin("ZGPT_TRAIN_BIN") + " --help");
    CHECK(h.code == 0);
    for (const char* s :
         {"--config", "--set", "z_loss_weight", "label_smoothing", "qk_norm", "grad_clip"})
        CHECK(h.text.find(s) != std::string::npos);
    const fs::path dir = fs::temp_directory_path() / "zgpt_test_train_bad";
    fs::create_directories(dir);
    std::ofstream(dir / "bad.yaml") << "data:\n  train: x.bin\noptim:\n  lr: fast\n";
    Output e = run(bin("ZGPT_TRAIN_BIN") + " -c " + (dir / "bad.yaml").string());
    CHECK(e.code == 1);
    CHECK(e.text.find("bad.yaml:4: optim.lr: expected a number, got 'fast'") != std::string::npos);
}
