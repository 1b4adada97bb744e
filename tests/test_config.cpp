// Config: every kind of error names the key path and file:line; overrides; the saved config loads.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "kernels/check.h"
#include "train/config.h"

using namespace zgpt;
namespace fs = std::filesystem;

namespace {

std::string write_yaml(const std::string& name, const std::string& text) {
    const fs::path p = fs::temp_directory_path() / ("zgpt_cfg_" + name + ".yaml");
    std::ofstream(p) << text;
    return p.string();
}

const char* kBase = "data:\n  train: x/train_*.bin\n";

std::string error_of(const std::string& yaml, const std::vector<std::string>& sets = {}) {
    try {
        load_config(write_yaml("err", yaml), sets);
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

}  // namespace

TEST_CASE("defaults live in code; a file holds only overrides") {
    const Config c = load_config(write_yaml("ok", std::string(kBase) + "optim:\n  lr: 3.0e-3\n"));
    CHECK(c.optim.lr == 3e-3);
    CHECK(c.optim.beta2 == 0.95);
    CHECK(c.model.n_layer == 12);
    CHECK(c.loss.z_loss_weight == 0.0);
}

TEST_CASE("each kind of error names the key path and the file:line") {
    const std::string base = kBase;
    std::string e = error_of(base + "optim:\n  lr: 1e-3\n  betta1: 0.9\n");
    CHECK(e.find(".yaml:5: unknown key optim.betta1") != std::string::npos);
    CHECK(e.find("known in optim: lr, min_lr") != std::string::npos);
    e = error_of(base + "optimizer:\n  lr: 1\n");
    CHECK(e.find(".yaml:3: unknown section 'optimizer'") != std::string::npos);
    e = error_of(base + "model:\n  n_layer: four\n");
    CHECK(e.find(".yaml:4: model.n_layer: expected an integer, got 'four'") != std::string::npos);
    e = error_of(base + "model:\n  n_layer: 2.5\n");
    CHECK(e.find("model.n_layer: expected an integer, got '2.5'") != std::string::npos);
    e = error_of(base + "model:\n  bias: maybe\n");
    CHECK(e.find(".yaml:4: model.bias: expected true or false") != std::string::npos);
    e = error_of(base + "optim:\n  lr: -1\n");
    CHECK(e.find(".yaml:4: optim.lr: value -1 is out of range (0, 100]") != std::string::npos);
    e = error_of(base + "loss:\n  label_smoothing: 1.0\n");
    CHECK(e.find(".yaml:4: loss.label_smoothing: value 1.0 is out of range [0, 1)") !=
          std::string::npos);
    e = error_of(base + "loss:\n  z_loss_weight: .nan\n");
    CHECK(e.find("loss.z_loss_weight: value .nan is out of range") != std::string::npos);
    e = error_of(base + "optim:\n  decay: exponential\n");
    CHECK(e.find(".yaml:4: optim.decay: 'exponential' is not one of: cosine, linear, constant") !=
          std::string::npos);
    e = error_of(base + "train:\n  batch_size: [1, 2]\n");
    CHECK(e.find(".yaml:4: train.batch_size: expected an integer, got a list") !=
          std::string::npos);
    e = error_of(base + "model:\n  n_embd: 100\n  n_head: 3\n");
    CHECK(e.find(".yaml:4: model.n_embd: 100 is not divisible by model.n_head = 3") !=
          std::string::npos);
    e = error_of(base + "model:\n  block_size: 32\ntrain:\n  seq_len: 64\n");
    CHECK(e.find(".yaml:6: train.seq_len: 64 exceeds model.block_size = 32") != std::string::npos);
    e = error_of("model: [1, 2\n");
    CHECK(e.find("YAML syntax error") != std::string::npos);
    e = error_of("model:\n  n_layer: 2\n");
    CHECK(e.find("data.train: must name the training shards") != std::string::npos);
}

TEST_CASE("what YAML would accept silently is refused: duplicates, non-name keys, bad UTF-8") {
    const std::string base = kBase;
    std::string e = error_of(base + "model:\n  n_layer: 2\nmodel:\n  n_layer: 4\n");
    CHECK(e.find(".yaml:5: 'model' appears twice (first at ") != std::string::npos);
    e = error_of(base + "model:\n  n_layer: 2\n  n_layer: 4\n");
    CHECK(e.find(".yaml:5: 'model.n_layer' appears twice") != std::string::npos);
    e = error_of(base + "model:\n  [1, 2]: 3\n");
    CHECK(e.find(".yaml:4: a key must be a plain name, got a list") != std::string::npos);
    e = error_of(base + "train:\n  run_name: \"a\xff\"\n");
    CHECK(e.find(".yaml:4: train.run_name: the value is not valid UTF-8") != std::string::npos);
    e = error_of(base, {"train.run_name=b\xc3"});  // a cut-off two-byte sequence
    CHECK(e.find("train.run_name: the value is not valid UTF-8") != std::string::npos);
    // valid UTF-8 passes
    CHECK(load_config(write_yaml("utf8", base + "train:\n  run_name: \"r\xc3\xa9sum\xc3\xa9\"\n"))
              .train.run_name == "r\xc3\xa9sum\xc3\xa9");
}

TEST_CASE("--set overrides apply and their errors name the override") {
    const std::string p = write_yaml("set", std::string(kBase) + "optim:\n  lr: 1.0e-3\n");
    const Config c = load_config(
        p, {"optim.lr=3e-4", "model.qk_norm=true", "data.val=v/*.bin", "loss.z_loss_weight=1e-4"});
    CHECK(c.optim.lr == 3e-4);
    CHECK(c.model.qk_norm);
    CHECK(c.data.val == "v/*.bin");
    CHECK(c.loss.z_loss_weight == 1e-4);
    CHECK(error_of(kBase, {"optim.lrr=1"}).find("--set optim.lrr=1: unknown key optim.lrr") !=
          std::string::npos);
    CHECK(error_of(kBase, {"lr=1"}).find("expected section.key=value") != std::string::npos);
    CHECK(error_of(kBase, {"train.max_steps=-5"})
              .find("--set train.max_steps=-5: train.max_steps: value -5 is out of range") !=
          std::string::npos);
}

TEST_CASE("the resolved config, saved as YAML, loads back to the same values") {
    Config c =
        load_config(write_yaml("rt", std::string(kBase) + "model:\n  n_layer: 3\n"),
                    {"optim.lr=0.00123", "train.run_name=abc", "model.tie_embeddings=false"});
    const std::string yaml = config_to_yaml(c);
    const Config back = load_config(write_yaml("rt2", yaml));
    CHECK(config_to_yaml(back) == yaml);
    CHECK(back.optim.lr == 0.00123);
    CHECK(back.model.n_layer == 3);
    CHECK_FALSE(back.model.tie_embeddings);
    // The reference (train --help) lists every key.
    const std::string ref = config_reference();
    Config d;
    for (const ConfigField& f : config_fields(d))
        CHECK(ref.find("  " + f.key + ":") != std::string::npos);
}

TEST_CASE("fused_linear's schedule keys: set with that head only, rows_outer with row blocks") {
    const std::string base = std::string(kBase) + "kernels:\n  cross_entropy: fused_linear\n";
    const Config c =
        load_config(write_yaml("lce", base + "  linear_ce_row_block: 4096\n"),
                    {"kernels.linear_ce_vocab_chunk=8192", "kernels.linear_ce_rows_outer=true"});
    CHECK(c.kernels.linear_ce_row_block == 4096);
    CHECK(c.kernels.linear_ce_vocab_chunk == 8192);
    CHECK(c.kernels.linear_ce_rows_outer);
    const Config d = load_config(write_yaml("lce0", base));
    CHECK(d.kernels.linear_ce_row_block == 0);  // the head's own default schedule
    CHECK(d.kernels.linear_ce_vocab_chunk == 0);
    CHECK_FALSE(d.kernels.linear_ce_rows_outer);
    // with another head the keys would be silently ignored: an error instead, at the key's line
    std::string e = error_of(std::string(kBase) + "kernels:\n  linear_ce_row_block: 512\n");
    CHECK(e.find(".yaml:4: kernels.linear_ce_row_block: applies to "
                 "kernels.cross_entropy=fused_linear only (it is fast)") != std::string::npos);
    e = error_of(kBase, {"kernels.cross_entropy=online", "kernels.linear_ce_rows_outer=true"});
    CHECK(e.find("kernels.linear_ce_rows_outer: applies to kernels.cross_entropy=fused_linear "
                 "only (it is online)") != std::string::npos);
    e = error_of(base + "  linear_ce_rows_outer: true\n");
    CHECK(e.find("kernels.linear_ce_rows_outer: needs kernels.linear_ce_row_block > 0") !=
          std::string::npos);
    e = error_of(base + "  linear_ce_vocab_chunk: -1\n");
    CHECK(e.find("kernels.linear_ce_vocab_chunk: value -1 is out of range") != std::string::npos);
}
