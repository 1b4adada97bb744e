// Config: every kind of error names the key path and file:line; overrides; the saved config loads.
#include <doctest/doctest.h>

#include <set>

#include <filesystem>
#include <fstream>

#include <yaml-cpp/yaml.h>

#include <nlohmann/json.hpp>

#include "kernels/core/check.h"
#include "train/config.h"
#include "train/sweep_file.h"

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

TEST_CASE("parallel.grad_bucket_mb: by the link unless given") {
    CHECK(load_config(write_yaml("ok", kBase)).parallel.grad_bucket_mb == -1);
    CHECK(grad_bucket_mb_for_link(-1, 1) == 0);  // inside a node: one all-reduce after the pass
    CHECK(grad_bucket_mb_for_link(-1, 2) == kGradBucketMbAcrossNodes);
    CHECK(grad_bucket_mb_for_link(0, 4) == 0);  // a given value stands on any link
    CHECK(grad_bucket_mb_for_link(0.01, 1) == 0.01);
    CHECK(error_of(kBase, {"parallel.grad_bucket_mb=-0.5"}).find("takes -1 (by the link)") !=
          std::string::npos);
    CHECK(error_of(kBase, {"parallel.grad_bucket_mb=-2"}) != "(no error)");
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
    CHECK(e.find(".yaml:4: kernels.linear_ce_row_block: applies to kernels.cross_entropy="
                 "fused_linear, fused_linear_wgmma, fused_linear_rows or "
                 "fused_linear_rows_filtered only (it is fast)") != std::string::npos);
    e = error_of(kBase, {"kernels.cross_entropy=online", "kernels.linear_ce_rows_outer=true"});
    CHECK(e.find("kernels.linear_ce_rows_outer: applies to kernels.cross_entropy=fused_linear or "
                 "fused_linear_wgmma only") != std::string::npos);
    CHECK(e.find("it is online)") != std::string::npos);
    // the wgmma head takes the same keys
    const Config w = load_config(write_yaml(
        "lcew",
        std::string(kBase) +
            "kernels:\n  cross_entropy: fused_linear_wgmma\n  linear_ce_row_block: 4096\n"));
    CHECK(w.kernels.linear_ce_row_block == 4096);
    CHECK(linear_ce_tuning(w.kernels).wgmma_epilogue);
    CHECK_FALSE(linear_ce_tuning(c.kernels).wgmma_epilogue);
    e = error_of(base + "  linear_ce_rows_outer: true\n");
    CHECK(e.find("kernels.linear_ce_rows_outer: needs kernels.linear_ce_row_block > 0") !=
          std::string::npos);
    e = error_of(base + "  linear_ce_vocab_chunk: -1\n");
    CHECK(e.find("kernels.linear_ce_vocab_chunk: value -1 is out of range") != std::string::npos);
    // fused_linear_rows: whole rows, so no vocabulary chunks and no loop order; one GPU's
    // vocabulary only
    const Config r = load_config(write_yaml(
        "lcer", std::string(kBase) +
                    "kernels:\n  cross_entropy: fused_linear_rows\n  linear_ce_row_block: 2048\n"));
    CHECK(r.kernels.linear_ce_row_block == 2048);
    CHECK(model_linear_ce_tuning(r.kernels).row_block == 2048);
    CHECK(model_linear_ce_tuning(r.kernels).fp32_dweight_only);
    const Config r0 = load_config(
        write_yaml("lcer0", std::string(kBase) + "kernels:\n  cross_entropy: fused_linear_rows\n"));
    CHECK(model_linear_ce_tuning(r0.kernels).row_block == 0);  // the head's own 8192
    CHECK(model_linear_ce_tuning(r0.kernels).chunk_mb == 0);
    for (const char* key :
         {"kernels.linear_ce_vocab_chunk=512", "kernels.linear_ce_rows_outer=true"}) {
        CAPTURE(key);
        e = error_of(kBase, {"kernels.cross_entropy=fused_linear_rows",
                             "kernels.linear_ce_row_block=64", key});
        CHECK(e.find("applies to kernels.cross_entropy=fused_linear or fused_linear_wgmma only "
                     "(it is fused_linear_rows)") != std::string::npos);
    }
    e = error_of(kBase, {"kernels.cross_entropy=fused_linear_rows", "parallel.vocab_parallel=2"});
    CHECK(e.find("fused_linear_rows runs the whole vocabulary on one GPU") != std::string::npos);
    // fused_linear_rows_filtered: the same blocks, and the filter's threshold (its key only)
    const Config f = load_config(write_yaml(
        "lcef", std::string(kBase) + "kernels:\n  cross_entropy: fused_linear_rows_filtered\n  "
                                     "linear_ce_filter_eps: 0.001\n"));
    CHECK(model_linear_ce_tuning(f.kernels).filter_eps == doctest::Approx(0.001));
    CHECK(model_linear_ce_tuning(f.kernels).fp32_dweight_only);
    CHECK(model_linear_ce_tuning(f.kernels).row_block == 0);
    const Config f0 = load_config(write_yaml(
        "lcef0", std::string(kBase) + "kernels:\n  cross_entropy: fused_linear_rows_filtered\n"));
    CHECK(model_linear_ce_tuning(f0.kernels).filter_eps == 0x1p-12f);  // Cut Cross-Entropy's
    e = error_of(kBase,
                 {"kernels.cross_entropy=fused_linear_rows", "kernels.linear_ce_filter_eps=0"});
    CHECK(e.find("kernels.linear_ce_filter_eps: applies to "
                 "kernels.cross_entropy=fused_linear_rows_filtered only") != std::string::npos);
    e = error_of(kBase, {"kernels.cross_entropy=fused_linear_rows_filtered",
                         "kernels.linear_ce_vocab_chunk=512", "kernels.linear_ce_row_block=64"});
    CHECK(e.find("kernels.linear_ce_vocab_chunk: applies to kernels.cross_entropy=fused_linear "
                 "or fused_linear_wgmma only (it is fused_linear_rows_filtered)") !=
          std::string::npos);
    e = error_of(kBase,
                 {"kernels.cross_entropy=fused_linear_rows_filtered", "parallel.vocab_parallel=2"});
    CHECK(e.find("fused_linear_rows_filtered runs the whole vocabulary on one GPU") !=
          std::string::npos);
    e = error_of(kBase, {"kernels.cross_entropy=fused_linear_rows_filtered",
                         "kernels.linear_ce_filter_eps=-1"});
    CHECK(e.find("kernels.linear_ce_filter_eps: value -1 is out of range") != std::string::npos);
}

TEST_CASE("the kernels' tuning keys: overrides, nested YAML, sets, variants, round trip, JSON") {
    // defaults: the kernels' own choices (what an unset environment gave before the keys)
    const Config d = load_config(write_yaml("tune0", kBase));
    CHECK(d.kernels.cross_entropy_tuning.parts == 0);
    CHECK(d.kernels.cross_entropy_tuning.helper_weight == -1);
    CHECK_FALSE(d.kernels.cross_entropy_tuning.trace);
    CHECK(d.kernels.attention_tuning.fwd_m_tiles == 0);
    CHECK(d.kernels.attention_tuning.wgmma_fwd);
    CHECK(d.kernels.attention_tuning.wgmma_bwd);
    CHECK(d.kernels.linear_ce_chunk_mb == 0);
    // an override, as train --set and a sweep's set / grid give it, lands in the structs
    const Config c = load_config(
        write_yaml("tune1", kBase),
        {"kernels.cross_entropy_tuning.parts=4", "kernels.cross_entropy_tuning.helper_weight=0",
         "kernels.attention_tuning.wgmma_bwd=false", "kernels.attention_tuning.wgmma_dq_tile=32"});
    CHECK(c.kernels.cross_entropy_tuning.parts == 4);
    CHECK(c.kernels.cross_entropy_tuning.helper_weight == 0);
    CHECK(c.kernels.cross_entropy_tuning.groups == 0);
    CHECK_FALSE(c.kernels.attention_tuning.wgmma_bwd);
    CHECK(c.kernels.attention_tuning.wgmma_dq_tile == 32);
    // nested in YAML, or as one dotted key; both are one key (twice is refused)
    const Config n = load_config(write_yaml(
        "tune2", std::string(kBase) + "kernels:\n  cross_entropy_tuning:\n    cluster: 4\n"
                                      "    groups: 3\n  attention_tuning.fwd_m_tiles: 1\n"));
    CHECK(n.kernels.cross_entropy_tuning.cluster == 4);
    CHECK(n.kernels.cross_entropy_tuning.groups == 3);
    CHECK(n.kernels.attention_tuning.fwd_m_tiles == 1);
    CHECK(error_of(std::string(kBase) + "kernels:\n  cross_entropy_tuning:\n    cluster: 4\n"
                                        "  cross_entropy_tuning.cluster: 2\n")
              .find("'kernels.cross_entropy_tuning.cluster' appears twice") != std::string::npos);
    CHECK(error_of(std::string(kBase) + "kernels:\n  cross_entropy_tuning:\n    clusters: 4\n")
              .find("unknown key kernels.cross_entropy_tuning.clusters") != std::string::npos);
    // the saved config nests them and loads back
    const std::string yaml = config_to_yaml(n);
    CHECK(yaml.find("  cross_entropy_tuning:\n    cluster: 4\n") != std::string::npos);
    const Config back = load_config(write_yaml("tune3", yaml));
    CHECK(config_to_yaml(back) == yaml);
    CHECK(back.kernels.cross_entropy_tuning.cluster == 4);
    CHECK(back.kernels.attention_tuning.fwd_m_tiles == 1);
    // out of range, outside a knob's set, or for a variant that never reads it: refused, naming
    // the key
    std::string e = error_of(kBase, {"kernels.cross_entropy_tuning.cluster=9"});
    CHECK(e.find("--set kernels.cross_entropy_tuning.cluster=9: "
                 "kernels.cross_entropy_tuning.cluster: value 9 is out of range [0, 8]") !=
          std::string::npos);
    e = error_of(kBase, {"kernels.cross_entropy_tuning.parts=3"});
    CHECK(e.find("kernels.cross_entropy_tuning.parts: 3 is not one of: 0, 1, 2, 4") !=
          std::string::npos);
    // the warp-specialised dK/dV kernel's two computing warpgroups share each tile
    CHECK(error_of(kBase, {"kernels.attention_tuning.wgmma_dkdv_tile=128"}) == "(no error)");
    e = error_of(kBase, {"kernels.attention_tuning.wgmma_dkdv_tile=128",
                         "kernels.attention_tuning.wgmma_dkdv_wgs=1"});
    CHECK(e.find("wgmma_dkdv_tile: 128 is the warp-specialised kernel") != std::string::npos);
    // the forward's 128-key tiles come through its TMA ring, in the kernel without pipelining
    for (const char* k : {"0", "64", "128"})
        CHECK(error_of(kBase, {std::string("kernels.attention_tuning.wgmma_fwd_keys=") + k}) ==
              "(no error)");
    e = error_of(kBase, {"kernels.attention_tuning.wgmma_fwd_keys=96"});
    CHECK(e.find("kernels.attention_tuning.wgmma_fwd_keys: 96 is not one of: 0, 64, 128") !=
          std::string::npos);
    for (const char* other : {"kernels.attention_tuning.wgmma_fwd_tma=false",
                              "kernels.attention_tuning.wgmma_fwd_pipeline=true"}) {
        e = error_of(kBase, {"kernels.attention_tuning.wgmma_fwd_keys=128", other});
        CHECK(e.find("wgmma_fwd_keys: 128-key tiles are the forward kernel's with the TMA ring") !=
              std::string::npos);
        CHECK(error_of(kBase, {"kernels.attention_tuning.wgmma_fwd_keys=64", other}) ==
              "(no error)");
    }
    e = error_of(kBase, {"kernels.cross_entropy=online", "kernels.cross_entropy_tuning.groups=2"});
    CHECK(e.find("kernels.cross_entropy_tuning.groups: applies to kernels.cross_entropy=fast "
                 "only (it is online)") != std::string::npos);
    CHECK(error_of(kBase, {"kernels.cross_entropy=fast_lockstep",
                           "kernels.cross_entropy_tuning.threads=256"}) == "(no error)");
    e = error_of(kBase, {"kernels.attention=naive", "kernels.attention_tuning.fwd_m_tiles=1"});
    CHECK(e.find("kernels.attention_tuning.fwd_m_tiles: applies to kernels.attention=flash or "
                 "flash_mma only (it is naive)") != std::string::npos);
    // ln2's row alignment under fc_bias_in_dw: 8 or 64 elements
    CHECK(error_of(kBase, {"kernels.fc_ones_align=64"}) == "(no error)");
    e = error_of(kBase, {"kernels.fc_ones_align=16"});
    CHECK(e.find("kernels.fc_ones_align: 16 is not one of: 8, 64") != std::string::npos);
    // the output's rounding residual: flash and flash_mma in bf16
    CHECK(error_of(kBase, {"kernels.attention_tuning.unrounded_dsum=true",
                           "train.precision=bf16"}) == "(no error)");
    e = error_of(kBase,
                 {"kernels.attention=naive", "kernels.attention_tuning.unrounded_dsum=true"});
    CHECK(e.find("kernels.attention_tuning.unrounded_dsum: applies to kernels.attention=flash or "
                 "flash_mma only (it is naive)") != std::string::npos);
    e = error_of(kBase, {"kernels.attention_tuning.unrounded_dsum=true", "train.precision=fp32"});
    CHECK(e.find("kernels.attention_tuning.unrounded_dsum: keeps the bf16 output's rounding "
                 "residual") != std::string::npos);
    e = error_of(kBase, {"kernels.matmul_wgmma_schedule=pingpong"});
    CHECK(e.find("kernels.matmul_wgmma_schedule: applies to kernels.matmul=wgmma only (it is "
                 "fused_epilogue)") != std::string::npos);
    CHECK(error_of(kBase, {"kernels.matmul=wgmma", "kernels.matmul_wgmma_schedule=pingpong"}) ==
          "(no error)");
    e = error_of(kBase, {"kernels.linear_ce_wgmma_cluster=1"});
    CHECK(e.find("kernels.linear_ce_wgmma_cluster: applies to kernels.cross_entropy="
                 "fused_linear_wgmma only (it is fast)") != std::string::npos);
    CHECK(error_of(kBase, {"kernels.cross_entropy=fused_linear_wgmma", "train.precision=bf16",
                           "kernels.linear_ce_wgmma_cluster=1"}) == "(no error)");
    e = error_of(kBase, {"kernels.split_head_reads=three"});
    CHECK(e.find("kernels.split_head_reads: 'three' is not one of: auto, one, two") !=
          std::string::npos);
    e = error_of(kBase, {"kernels.matmul=wgmma", "kernels.matmul_wgmma_schedule=split"});
    CHECK(e.find("kernels.matmul_wgmma_schedule: 'split' is not one of: cooperative, pingpong") !=
          std::string::npos);
    e = error_of(kBase, {"kernels.linear_ce_chunk_mb=24"});
    CHECK(e.find("kernels.linear_ce_chunk_mb: applies to kernels.cross_entropy=fused_linear, "
                 "fused_linear_wgmma, fused_linear_rows or fused_linear_rows_filtered only") !=
          std::string::npos);
    // train --help lists them with their defaults
    const std::string ref = config_reference();
    CHECK(ref.find("  cross_entropy_tuning.helper_weight: -1") != std::string::npos);
    CHECK(ref.find("  attention_tuning.wgmma_fwd: true") != std::string::npos);
    // metrics / provenance / bench JSON
    const nlohmann::json j = kernel_tuning_json(c);
    CHECK(j["cross_entropy_tuning"]["parts"] == 4);
    CHECK(j["attention_tuning"]["wgmma_bwd"] == false);
    CHECK(j["linear_ce_row_block"] == 0);
    CHECK(j["matmul_wgmma_schedule"] == "cooperative");
    CHECK(j.at("fc_bias_in_dw") == true);
    // every kernels key is recorded but the families' variant choices (kernels_json's)
    Config every = c;
    int recorded = 0;
    for (const ConfigField& f : config_fields(every)) {
        if (f.section != "kernels") continue;
        CAPTURE(f.key);
        const bool family = find_kernel_family(f.key) != nullptr;
        const size_t dot = f.key.find('.');
        if (family) {
            CHECK_FALSE(j.contains(f.key));
        } else if (dot == std::string::npos) {
            CHECK(j.contains(f.key));
            recorded++;
        } else {
            const std::string group = f.key.substr(0, dot), name = f.key.substr(dot + 1);
            CHECK((j.contains(group) && j.at(group).contains(name)));
            recorded++;
        }
    }
    CHECK(recorded > 20);
    // the bench tools' overrides: each value checked, the cross-field checks left out
    Config b;
    apply_overrides(b,
                    {"kernels.cross_entropy_tuning.smem_kb=96", "kernels.linear_ce_chunk_mb=24"});
    CHECK(b.kernels.cross_entropy_tuning.smem_kb == 96);
    CHECK(linear_ce_tuning(b.kernels).chunk_mb == 24);
    // the model's tiles: keys left 0 take the trainer's, keys set are kept
    CHECK(model_linear_ce_tuning(b.kernels).chunk_mb == 24);
    CHECK(model_linear_ce_tuning(b.kernels).row_block == kModelLinearCeRowBlock);
    CHECK(linear_ce_tuning(b.kernels).row_block == 0);  // bench_ce: the kernels' own default
    CHECK(model_linear_ce_tuning(Config{}.kernels).chunk_mb == kModelLinearCeChunkMb);
    CHECK_THROWS_WITH_AS(apply_overrides(b, {"kernels.attention_tuning.fwd_m_tiles=3"}),
                         doctest::Contains("kernels.attention_tuning.fwd_m_tiles: value 3 is out "
                                           "of range [0, 2]"),
                         Error);
    CHECK_THROWS_WITH_AS(apply_overrides(b, {"kernels.cross_entropy_tuning.threads=768"}),
                         doctest::Contains("--set kernels.cross_entropy_tuning.threads=768: "
                                           "kernels.cross_entropy_tuning.threads: 768 is not one "
                                           "of: 0, 256, 512, 1024"),
                         Error);
}

TEST_CASE("every shipped config loads, and every combination of every shipped sweep") {
    // what tools/sweep checks before it runs anything: load_config(base, set + one value of
    // each grid key), for every combination
    const fs::path root = ZGPT_SOURCE_DIR;
    int configs = 0, combos = 0;
    for (const auto& e : fs::directory_iterator(root / "configs"))
        if (e.path().extension() == ".yaml") {
            CAPTURE(e.path().string());
            CHECK_NOTHROW(load_config(e.path().string()));
            configs++;
        }
    for (const auto& e : fs::recursive_directory_iterator(root / "sweeps")) {
        if (e.path().extension() != ".yaml") continue;
        CAPTURE(e.path().string());
        const SweepFile sw = load_sweep_file(e.path().string());  // tools/sweep's own reading
        for (const SweepRun& r : sw.runs) {
            CAPTURE(r.name);
            CHECK_NOTHROW(load_config((root / sw.base).string(), sw.sets(r)));
            combos++;
        }
    }
    CHECK(configs >= 9);
    CHECK(combos >= 50);
}

TEST_CASE("a sweep file varies a tuning key like any key, the last grid key fastest") {
    // tools/sweep checks every combination with load_config(base, set + grid overrides) before
    // anything runs; the grid's keys are the config's, dotted ones included
    const std::string sweep = write_yaml(
        "sweep_tune",
        "base: b.yaml\nout_dir: runs/x\nset: [kernels.cross_entropy_tuning.groups=3]\n"
        "grid:\n  optim.lr: [1.0e-3, 1.0e+1]\n  kernels.cross_entropy_tuning.parts: [1, 2, 4]\n");
    const SweepFile sw = load_sweep_file(sweep);
    const std::string base = write_yaml("sweep_tune_base", kBase);
    REQUIRE(sw.runs.size() == 6);
    CHECK(sw.runs[0].name == "lr=1.0e-3_cross_entropy_tuning.parts=1");
    CHECK(sw.runs[1].name == "lr=1.0e-3_cross_entropy_tuning.parts=2");
    CHECK(sw.runs[5].name == "lr=1.0e+1_cross_entropy_tuning.parts=4");
    for (size_t i = 0; i < sw.runs.size(); i++) {
        const Config c = load_config(base, sw.sets(sw.runs[i]));
        CHECK(c.kernels.cross_entropy_tuning.groups == 3);
        CHECK(c.kernels.cross_entropy_tuning.parts == int(1 << (i % 3)));
        CHECK(c.optim.lr == (i < 3 ? 1e-3 : 10.0));
    }
    // a value that is a list, and two runs with one name, are refused with the file and line
    CHECK_THROWS_WITH(
        load_sweep_file(write_yaml("sweep_list",
                                   "base: b\nout_dir: o\ngrid:\n"
                                   "  optim.lr: [[1, 2]]\n")),
        doctest::Contains("sweep_list.yaml:4: grid.optim.lr: each value must be a scalar"));
    CHECK_THROWS_WITH(load_sweep_file(write_yaml("sweep_same",
                                                 "base: b\nout_dir: o\ngrid:\n"
                                                 "  optim.lr: [a b, a/b]\n")),
                      doctest::Contains("combinations 1 and 2 both make the run name 'lr=a-b'"));
}

TEST_CASE("kernel families: the config's keys, choices and defaults are the registry's") {
    Config c;
    int seen = 0;
    for (const ConfigField& f : config_fields(c)) {
        // the knobs with a set of names (not families)
        if (f.section != "kernels" || f.choices.empty() || f.key == "matmul_wgmma_schedule" ||
            f.key == "split_head_reads")
            continue;
        CAPTURE(f.key);
        const KernelFamily& fam = kernel_family(f.key);  // throws for a key it does not register
        CHECK(f.choices == fam.variants);
        CHECK(*std::get<std::string*>(f.value) == fam.default_variant);
        seen++;
    }
    CHECK(seen == int(kernel_families().size()));
    for (const KernelFamily& fam : kernel_families()) {
        CAPTURE(fam.name);
        CHECK(kernel_variant(fam.name, fam.default_variant) >= 0);
        CHECK(kernel_choice(c.kernels, fam.name) == fam.default_variant);
        for (size_t i = 0; i < fam.variants.size(); i++)
            CHECK(kernel_variant(fam.name, fam.variants[i]) == int(i));
    }
    CHECK(kernel_variant("layernorm", "separate") == int(LayernormVariant::separate));
    CHECK(kernel_variant("matmul", "separate") == int(MatmulVariant::separate));
    CHECK_THROWS_WITH_AS(kernel_variant("attention", "cudnn"),
                         "kernels.attention: unknown variant 'cudnn' (known: flash, flash_mma, "
                         "naive, flash_fwd_naive_bwd, naive_fwd_flash_bwd)",
                         Error);
    CHECK_THROWS_AS(apply_overrides(c, {"kernels.matmul=cublas"}), Error);
}

TEST_CASE("every variant's properties: the tuning keys it reads are config keys it accepts") {
    // A key a variant reads must be settable with that variant chosen, and refused with every
    // variant that does not read it (validation reads the registry's lists, not names).
    std::set<std::string> keys;
    Config c;
    for (const ConfigField& f : config_fields(c))
        if (f.section == "kernels") keys.insert(f.key);
    for (const KernelFamily& fam : kernel_families()) {
        CAPTURE(fam.name);
        REQUIRE(fam.traits.size() == fam.variants.size());
        for (size_t i = 0; i < fam.traits.size(); i++) {
            CHECK(fam.traits[i].name == fam.variants[i]);
            for (const std::string& key : fam.traits[i].reads) {
                CAPTURE(key);
                CHECK(keys.count(key) == 1);
            }
        }
    }
    // linear_ce_filter_eps: read by one variant; its value is what marks it set
    CHECK(variants_reading("cross_entropy", "linear_ce_filter_eps") ==
          "fused_linear_rows_filtered");
    CHECK(variants_reading("attention", "attention_tuning.fwd_m_tiles") == "flash or flash_mma");
    for (const std::string& v : kernel_family("cross_entropy").variants) {
        CAPTURE(v);
        const std::string e =
            error_of(kBase, {"kernels.cross_entropy=" + v, "kernels.linear_ce_filter_eps=0.01"});
        if (v == "fused_linear_rows_filtered")
            CHECK(e == "(no error)");
        else
            CHECK(
                e.find("applies to kernels.cross_entropy=fused_linear_rows_filtered only (it is " +
                       v + ")") != std::string::npos);
    }
    CHECK(variant_traits("cross_entropy", "fused_linear_wgmma").ce_in_gemm_epilogue);
    CHECK(is_whole_rows_linear_cross_entropy("fused_linear_rows"));
    CHECK_FALSE(is_linear_cross_entropy("fast"));
}

TEST_CASE(
    "Llama-style options: choices, bad combinations name the key; the CUDA model takes them") {
    const Config c = load_config(write_yaml("llama", std::string(kBase) +
                                                         "model:\n  norm: rmsnorm\n"
                                                         "  position: rope\n  mlp: swiglu\n"
                                                         "  n_kv_head: 4\n  rope_theta: 5.0e5\n"));
    CHECK(c.model.norm == "rmsnorm");
    CHECK(c.model.position == "rope");
    CHECK(c.model.mlp == "swiglu");
    CHECK(c.model.n_kv_head == 4);
    CHECK(c.model.rope_theta == 5.0e5);
    const std::string base = std::string(kBase) + "model:\n";
    CHECK(error_of(base + "  norm: batchnorm\n").find("model.norm") != std::string::npos);
    CHECK(error_of(base + "  mlp: relu\n").find("model.mlp") != std::string::npos);
    // 12 heads, 5 key/value heads
    const std::string kv = error_of(base + "  n_kv_head: 5\n");
    INFO(kv);
    CHECK(kv.find("zgpt_cfg_err.yaml:4: model.n_kv_head: 5 does not divide model.n_head = 12") !=
          std::string::npos);
    // head size 768 / 256 = 3 is odd
    const std::string odd = error_of(base + "  n_head: 256\n  position: rope\n");
    INFO(odd);
    CHECK(odd.find("model.position") != std::string::npos);
    CHECK(odd.find("must be even") != std::string::npos);
    // the CUDA model runs every option
    CHECK(error_of(base + "  norm: rmsnorm\n  position: rope\n  mlp: swiglu\n  n_kv_head: 4\n" +
                   "train:\n  device: cuda\n") == "(no error)");
    CHECK(error_of(base + "  qk_norm: true\ntrain:\n  device: cuda\n") == "(no error)");
}
