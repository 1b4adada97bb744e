// The experiment tools in CI: a tiny z-loss comparison (2 LRs x 2 z weights on Tiny Shakespeare)
// through tools/sweep and tools/plot_runs.py. The tools run, finished runs are skipped, an
// interrupted run resumes, and the figures exist with the expected number of curves. Not a claim
// about the science.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/helpers.h"
#include "train/device.h"

namespace fs = std::filesystem;
using namespace zgpt::test;

namespace {

const std::string kText =
    std::string(ZGPT_SOURCE_DIR) + "/../shared/data/tinyshakespeare/input.txt";
const bool kHaveText = [] {
    if (!fs::exists(kText)) zgpt::test::skip_binary("Tiny Shakespeare not found at " + kText);
    return true;
}();

}  // namespace

TEST_CASE("z-loss sweep on Tiny Shakespeare: sweep, skip, resume, plots, CSV") {
    const fs::path dir = fs::temp_directory_path() / "zgpt_test_sweep";
    fs::remove_all(dir);
    REQUIRE(run_command(built_binary("ZGPT_PREPARE_BIN") + " --input " + kText + " --out " +
                        (dir / "shards").string())
                .code == 0);
    std::ofstream(dir / "base.yaml")
        << "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 32}\n"
        << "data: {train: " << (dir / "shards/train_*.bin").string()
        << ", val: " << (dir / "shards/val_*.bin").string() << "}\n"
        << "train: {batch_size: 4, max_steps: 40, eval_every: 20, "
           "eval_batches: 2, checkpoint_every: 10, threads: 1}\n"
        << "optim: {warmup_steps: 4, weight_decay: 0.0}\n"
        // the runs of two folders are compared bit for bit: on a GPU, cuBLASLt's first choice
        // for every GEMM (the default, kept if that changes), since each runs folder keeps the
        // algorithms it timed and two folders could time different ones
        << "kernels: {matmul_search: 0}\n";
    // dir / NAME.yaml: a sweep over base.yaml into dir / RUNS, with BODY (grid, set); the path
    auto sweep_file = [&](const std::string& name, const std::string& runs,
                          const std::string& body) {
        const fs::path f = dir / (name + ".yaml");
        std::ofstream(f) << "base: " << (dir / "base.yaml").string() << "\n"
                         << "out_dir: " << (dir / runs).string() << "\n"
                         << body;
        return f.string();
    };
    auto run_sweep = [](const std::string& file, const std::string& args = "") {
        return run_command(built_binary("ZGPT_SWEEP_BIN") + " " + file + args);
    };
    const std::string grid =
        "grid:\n  optim.lr: [3.0e-3, 3.0e-2]\n  loss.z_loss_weight: [0, 1.0e-4]\n";
    const std::string sweep = sweep_file("sweep", "runs", grid);
    CommandOutput first = run_sweep(sweep);
    INFO(first.text);
    REQUIRE(first.code == 0);
    CHECK(first.text.find("4 runs, 0 failed") != std::string::npos);
    const auto manifest = nlohmann::json::parse(std::ifstream(dir / "runs/sweep.json"));
    REQUIRE(manifest["runs"].size() == 4);
    for (const auto& r : manifest["runs"])
        CHECK(fs::exists(dir / "runs" / r["name"].get<std::string>() / "summary.json"));
    // a second call skips what finished; a run that lost its summary (interrupted) resumes
    const fs::path interrupted = dir / "runs" / manifest["runs"][1]["name"].get<std::string>();
    fs::remove(interrupted / "summary.json");
    CommandOutput again = run_sweep(sweep);
    INFO(again.text);
    CHECK(again.text.find("done, skipped") != std::string::npos);
    CHECK(again.text.find(": resuming") != std::string::npos);
    CHECK(fs::exists(interrupted / "summary.json"));

    // --gpus: two runs at a time, the same results. Without a GPU they run on the CPU
    // (CUDA_VISIBLE_DEVICES unused); on a machine of one GPU both slots share it.
    const zgpt::DeviceChoice where = zgpt::choose_device("auto");
    const bool gpu = where.device == "cuda";
    const std::string slots = gpu && where.gpus < 2 ? "0,0" : "0,1";
    const std::string sweep2 = sweep_file("sweep2", "runs2", grid);
    CommandOutput par = run_sweep(sweep2, " --gpus " + slots);
    INFO(par.text);
    REQUIRE(par.code == 0);
    CHECK(par.text.find("4 runs, 0 failed") != std::string::npos);
    // where no GPU trains them, the runs do not name GPUs
    const std::string second = slots.substr(2);
    CHECK(par.text.find(gpu ? "on GPU " + second : "(CPU, slot 1)") != std::string::npos);
    if (!gpu) CHECK(par.text.find("on GPU") == std::string::npos);
    for (const auto& r : manifest["runs"]) {
        const std::string name = r["name"].get<std::string>();
        auto last_loss = [&](const fs::path& run) {
            std::ifstream f(run / "metrics.jsonl");
            std::string line, last;
            while (std::getline(f, line))
                if (!line.empty()) last = line;
            return nlohmann::json::parse(last)["loss"].get<double>();
        };
        CAPTURE(name);
        CHECK(last_loss(dir / "runs2" / name) == last_loss(dir / "runs" / name));
    }

    // a GPU that does not exist is refused before anything runs (its runs would see no GPU and
    // train on the CPU)
    if (gpu && !std::getenv("CUDA_VISIBLE_DEVICES")) {
        CommandOutput missing = run_sweep(sweep2, " --gpus 0," + std::to_string(where.gpus));
        INFO(missing.text);
        CHECK(missing.code != 0);
        CHECK(missing.text.find("GPU " + std::to_string(where.gpus) + " does not exist") !=
              std::string::npos);
    }

    // values that differ only in a sign of the exponent are two runs; values that would make one
    // folder name are refused before anything runs
    CommandOutput dry = run_sweep(
        sweep_file("sweep_names", "runs_names", "grid:\n  optim.weight_decay: [1.0e-1, 1.0e+1]\n"),
        " --dry-run");
    INFO(dry.text);
    CHECK(dry.code == 0);
    CHECK(dry.text.find("weight_decay=1.0e-1") != std::string::npos);
    CHECK(dry.text.find("weight_decay=1.0e+1") != std::string::npos);
    // a sweep (sweep_NAME.yaml with BODY) refused with WHY before it makes its folder runs_NAME
    auto refused = [&](const std::string& name, const std::string& body, const std::string& why) {
        CommandOutput r = run_sweep(sweep_file("sweep_" + name, "runs_" + name, body));
        INFO(r.text);
        CHECK(r.code != 0);
        CHECK(r.text.find(why) != std::string::npos);
        CHECK_FALSE(fs::exists(dir / ("runs_" + name)));
    };
    refused("clash", "grid:\n  data.val: [\"a b\", \"a-b\"]\n", "both make the run name 'val=a-b'");
    // a combination the config refuses
    refused("bad", "grid:\n  model.norm: [layernorm, nonorm]\n", "'nonorm' is not one of");

    // --nproc 2: every run as 2 processes (CPU: the tcp communicator), each with its own data
    CommandOutput np = run_sweep(sweep_file("sweep3", "runs3",
                                            "set: [train.batch_size=2, train.max_steps=10, "
                                            "train.device=cpu]\n"
                                            "grid:\n  loss.z_loss_weight: [0, 1.0e-4]\n"),
                                 " --nproc 2");
    INFO(np.text);
    REQUIRE(np.code == 0);
    CHECK(np.text.find("2 runs, 0 failed") != std::string::npos);
    for (const auto& e : fs::directory_iterator(dir / "runs3")) {
        if (!e.is_directory()) continue;
        const auto prov = nlohmann::json::parse(std::ifstream(e.path() / "provenance.json"));
        CHECK(prov["parallel"]["ranks"] == 2);
        CHECK(prov["parallel"]["communicator"] == "tcp");
        CHECK(fs::exists(e.path() / "summary.json"));
    }

    const std::string plot = "python3 " + std::string(ZGPT_SOURCE_DIR) +
                             "/tools/plot_runs.py --sweep " + (dir / "runs").string();
    CommandOutput csv = run_command(plot + " --format csv");
    if (csv.code != 0 && csv.text.find("ModuleNotFoundError") != std::string::npos) {
        MESSAGE(
            "plot_runs.py needs Python 3 with matplotlib, not found here: the plot checks are "
            "skipped");
        return;
    }
    INFO(csv.text);
    REQUIRE(csv.code == 0);
    CHECK(std::count(csv.text.begin(), csv.text.end(), '\n') >=
          5);  // header + 4 runs (+ sensitivity)
    CHECK(csv.text.find("# LR sensitivity (z_loss_weight=0)") != std::string::npos);
    // --format json: one results row per run, with the sweep it came from
    CommandOutput js = run_command(plot + " --format json 2>/dev/null");
    INFO(js.text);
    REQUIRE(js.code == 0);
    const auto rows = nlohmann::json::parse(js.text)["runs"];
    REQUIRE(rows.size() == 4);
    for (const auto& row : rows) {
        CHECK(row["sweep"] == (dir / "runs").string());
        CHECK(row["lr"].get<double>() > 0);
        CHECK(row["z_loss_weight"].is_number());
        CHECK(row["max_lse_sq"].get<double>() > 0);
        CHECK(row["final_lse_sq"].get<double>() <= row["max_lse_sq"].get<double>());
        CHECK(row["lse_sq_slope_late"].is_number());
        CHECK(row["final_val_loss"].is_number());
        CHECK(row["diverged"] == false);
    }
    CommandOutput fig = run_command(plot + " --out " + (dir / "figs").string());
    INFO(fig.text);
    if (fig.code != 0 && fig.text.find("ModuleNotFoundError") != std::string::npos) {
        MESSAGE("matplotlib is not installed: the figure checks are skipped");
        return;
    }
    REQUIRE(fig.code == 0);
    for (const char* f : {"curves.png", "curves.svg", "lr_sensitivity.png", "lr_sensitivity.svg"})
        CHECK(fs::file_size(dir / "figs" / f) > 1000);
    const auto plots = nlohmann::json::parse(std::ifstream(dir / "figs/plots.json"));
    CHECK(plots["curves.loss"] == 4);
    CHECK(plots["curves.val_loss"] == 4);
    CHECK(plots["curves.lse_mean"] == 4);
    CHECK(plots["curves.lse_sq_mean"] == 4);
    CHECK(plots["lr_sensitivity"] == 2);  // one line per z weight
}
