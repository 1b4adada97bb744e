// split_memory: what one rank of the vocabulary split holds against data parallel, by the
// trainer's own count (GptCuda::device_bytes_needed plus the AdamW moments: what `train` prints
// before the first step, and what peak_mem_gb reports), over models, vocabularies, micro-batches,
// head variants and group sizes. The memory half of docs/parallel.md's guidance on when the split
// pays; the speed half is tools/gpu/vocab_split_bench.py's. Counting allocates nothing; the CUDA
// device is needed only for the model's streams.
//
// With --zero1 both sides shard the AdamW moments over the P GPUs (parallel.zero1): data parallel
// all of them, the split the replicated weights' (a shard's rows have no peer there).
//
//   split_memory [--configs configs/gpt2-124m.yaml,...] [--vocabs 50304,128256,256000]
//                [--batches 8,16,32,64] [--heads fast,fused_linear] [--parts 2,4,8] [--zero1]
//                [--out F.json]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/core/cuda_device.h"
#include "model/parameters.h"
#include "train/backends/backend_init.h"
#include "train/cli.h"
#include "train/config.h"

namespace {

struct Options {
    std::vector<std::string> configs = {"configs/gpt2-124m.yaml", "configs/gpt2-350m.yaml",
                                        "configs/gpt2-774m.yaml", "configs/gpt2-1558m.yaml"};
    std::vector<int64_t> vocabs = {50304, 128256, 256000}, batches = {8, 16, 32, 64};
    std::vector<std::string> heads = {"fast", "fused_linear"};
    std::vector<int> parts = {2, 4, 8};
    bool zero1 = false;
    std::string out;
};

}  // namespace

int main(int argc, char** argv) {
    Options o;
    CLI::App app{
        "split_memory: a vocab-split rank's memory against data parallel, by the "
        "trainer's count"};
    app.add_option("--configs", o.configs, "model configs")->delimiter(',');
    app.add_option("--vocabs", o.vocabs, "vocabulary sizes")->delimiter(',');
    app.add_option("--batches", o.batches, "micro-batches (train.batch_size)")->delimiter(',');
    app.add_option("--heads", o.heads, "kernels.cross_entropy variants")->delimiter(',');
    app.add_option("--parts", o.parts, "group sizes (parallel.vocab_parallel)")->delimiter(',');
    app.add_flag("--zero1", o.zero1, "ZeRO-1 over the P GPUs on both sides");
    app.add_option("--out", o.out, "write the rows as JSON here");
    if (const std::optional<int> code = zgpt::parse_cli(app, argc, argv)) return *code;
    const zgpt::cuda::DeviceInfo device = zgpt::cuda::query_devices();
    if (device.count == 0) {
        std::fprintf(stderr, "split_memory: no usable CUDA device (%s)\n", device.error.c_str());
        return 1;
    }
    try {
        nlohmann::json rows = nlohmann::json::array();
        std::printf("%-26s %7s %3s %-13s %2s %9s %9s %9s %9s\n", "config", "V", "B", "head", "P",
                    "dp GB", "split GB", "saved GB", "head GB");
        for (const std::string& path : o.configs)
            for (int64_t V : o.vocabs)
                for (int64_t B : o.batches)
                    for (const std::string& head : o.heads) {
                        const zgpt::Config cfg =
                            zgpt::load_config(path, {"model.vocab_size=" + std::to_string(V),
                                                     "train.batch_size=" + std::to_string(B),
                                                     "kernels.cross_entropy=" + head});
                        for (int P : o.parts) {
                            const int zero_ranks = o.zero1 ? P : 1;
                            const double dp = zgpt::cuda_rank_bytes(cfg, 1, zero_ranks);
                            // the head's weight, gradient and AdamW state under data parallel (18
                            // bytes a parameter: fp32 weight and gradient, bf16 copy, two
                            // moments, these 1/P under ZeRO-1)
                            const double head_state = (10.0 + 8.0 / zero_ranks) *
                                                      double(zgpt::vocab_table_rows(cfg.model)) *
                                                      double(cfg.model.n_embd);
                            const double split = zgpt::cuda_rank_bytes(cfg, P, zero_ranks);
                            std::printf("%-26s %7lld %3lld %-13s %2d %9.2f %9.2f %9.2f %9.2f\n",
                                        path.c_str(), (long long)V, (long long)B, head.c_str(), P,
                                        dp / 1e9, split / 1e9, (dp - split) / 1e9,
                                        head_state / 1e9);
                            rows.push_back({{"config", path},
                                            {"n_layer", cfg.model.n_layer},
                                            {"n_embd", cfg.model.n_embd},
                                            {"vocab", V},
                                            {"batch", B},
                                            {"seq_len", zgpt::sequence_length(cfg)},
                                            {"head", head},
                                            {"gpus", P},
                                            {"zero1", o.zero1},
                                            {"data_parallel_gb", dp / 1e9},
                                            {"split_gb", split / 1e9},
                                            {"saved_gb", (dp - split) / 1e9},
                                            {"head_state_gb", head_state / 1e9},
                                            {"saved_of_head_state", (dp - split) / head_state}});
                        }
                    }
        if (!o.out.empty()) {
            std::ofstream f(o.out);
            f << nlohmann::json{{"rows", rows}}.dump(1) << "\n";
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "split_memory: %s\n", e.what());
        return 1;
    }
    return 0;
}
