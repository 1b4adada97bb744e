// sweep: trains every combination of a grid of config overrides, one run directory each.
//
//   # sweeps/zloss.yaml
//   base: configs/shakespeare-char-cpu.yaml
//   out_dir: runs/zloss-sweep
//   set: [train.max_steps=500]               # applied to every run
//   grid:
//     optim.lr: [1.0e-3, 3.0e-3, 1.0e-2]
//     loss.z_loss_weight: [0, 1.0e-4]
//
//   sweep sweeps/zloss.yaml [--dry-run] [--gpus 0,1,2,3]
//
// Runs go one after another, or with --gpus several at once: one run per listed GPU at a time,
// each started with CUDA_VISIBLE_DEVICES set to its GPU. A run whose summary.json says it
// finished is skipped; one with
// checkpoints continues from them (train --resume), so an interrupted sweep resumes. sweep.json in
// out_dir lists every run and its overrides (the plot tool labels curves with them).

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "data/file_read.h"
#include "kernels/core/check.h"
#include "train/checkpoint.h"
#include "train/cli.h"
#include "train/device.h"
#include "train/run_dir.h"
#include "train/sweep_file.h"

namespace fs = std::filesystem;

namespace {

std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

bool finished(const fs::path& run) {
    try {
        const auto s =
            nlohmann::json::parse(zgpt::read_regular_file(run / "summary.json", "summary"));
        return !s.value("stopped_early", true);
    } catch (...) {
        return false;
    }
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Train every combination of a grid of config overrides (sweep YAML)."};
    zgpt::report_cli_errors(app);
    std::string sweep_file, train_bin;
    bool dry = false;
    app.add_option("sweep", sweep_file, "sweep YAML (base, out_dir, grid, set)")
        ->required()
        ->check(CLI::ExistingFile);
    app.add_option("--train", train_bin, "the train binary (default: beside this one)");
    app.add_flag("--dry-run", dry, "print the runs and exit");
    std::string gpus;
    app.add_option("--gpus", gpus,
                   "comma-separated GPU ids: run up to one run per GPU at once (default: one "
                   "run at a time, all GPUs visible)");
    int nproc = 0;
    app.add_option("--nproc", nproc,
                   "ranks per run (train --nproc N); with --gpus, each run takes N of the listed "
                   "GPUs (consecutive groups of N)")
        ->check(CLI::Range(1, 1024));
    CLI11_PARSE(app, argc, argv);
    try {
        if (train_bin.empty()) train_bin = (fs::path(argv[0]).parent_path() / "train").string();
        std::vector<std::string> ids;      // the GPU ids listed
        std::vector<std::string> devices;  // one entry per run at once; empty: sequential
        {
            std::stringstream ss(gpus);
            for (std::string id; std::getline(ss, id, ',');) {
                ZG_CHECK(!id.empty() && id.find_first_not_of("0123456789") == std::string::npos,
                         "--gpus '" + gpus + "': expected comma-separated GPU ids such as 0,1");
                ZG_CHECK(id.size() <= 4,
                         "--gpus '" + gpus + "': GPU id " + id + " is out of range (0 to 9999)");
                ids.push_back(id);
            }
            devices = ids;
            if (nproc > 1 && !devices.empty()) {  // groups of nproc GPUs, one run on each group
                ZG_CHECK(devices.size() % size_t(nproc) == 0,
                         "--gpus '" + gpus + "' does not split into groups of --nproc " +
                             std::to_string(nproc));
                std::vector<std::string> groups;
                for (size_t i = 0; i < devices.size(); i += size_t(nproc)) {
                    std::string g = devices[i];
                    for (int k = 1; k < nproc; k++) g += "," + devices[i + k];
                    groups.push_back(g);
                }
                devices = groups;
            }
        }
        // Without a usable GPU the runs still go one per listed id at once, on the CPU: say so,
        // rather than name GPUs that do not train them.
        const zgpt::DeviceChoice where = zgpt::choose_device("auto");
        const bool on_gpus = where.device == "cuda";
        if (!devices.empty() && !on_gpus)
            std::printf("note: --gpus %s: %s; %zu runs at a time, each on the CPU\n", gpus.c_str(),
                        where.reason.c_str(), devices.size());
        const zgpt::SweepFile sw = zgpt::load_sweep_file(sweep_file);
        const std::string& base = sw.base;
        const fs::path out_dir = sw.out_dir;
        nlohmann::json manifest{
            {"sweep", sweep_file}, {"base", base}, {"runs", nlohmann::json::array()}};
        std::vector<char> on_cpu;  // train.device=cpu: --gpus only sets how many run at once
        for (const zgpt::SweepRun& r : sw.runs) {
            nlohmann::json over = nlohmann::json::object();
            for (const auto& [k, v] : r.overrides) over[k] = v;
            // a bad combination fails before anything runs
            on_cpu.push_back(zgpt::load_config(base, sw.sets(r)).train.device == "cpu");
            manifest["runs"].push_back({{"name", r.name}, {"overrides", over}});
        }
        // A listed GPU that does not exist would leave its runs with no visible device, and they
        // would train on the CPU instead: refuse. (Ids are physical; where CUDA_VISIBLE_DEVICES
        // already hides GPUs from this process, the count says nothing about them.)
        if (on_gpus && !std::getenv("CUDA_VISIBLE_DEVICES") &&
            std::count(on_cpu.begin(), on_cpu.end(), 0) > 0)
            for (const std::string& id : ids)
                ZG_CHECK(std::stoi(id) < where.gpus,
                         "--gpus '" + gpus + "': GPU " + id + " does not exist (this machine has " +
                             std::to_string(where.gpus) + (where.gpus == 1 ? " GPU" : " GPUs") +
                             ", 0 to " + std::to_string(where.gpus - 1) + ")");
        fs::create_directories(out_dir);  // after every check: a refused sweep leaves nothing
        zgpt::write_text_file((out_dir / "sweep.json").string(), manifest.dump(2) + "\n");
        std::atomic<int> failures{0};
        std::atomic<size_t> next{0};
        std::mutex print;
        auto worker = [&](const std::string& device) {
            for (size_t i; (i = next++) < sw.runs.size();) {
                const std::string& name = sw.runs[i].name;
                const fs::path run = out_dir / name;
                std::string cmd;
                const std::vector<std::string> sets = sw.sets(sw.runs[i]);
                const char* state;
                if (finished(run)) {
                    state = "done, skipped";
                } else if (!zgpt::list_checkpoints((run / "checkpoints").string()).empty()) {
                    state = "resuming";
                    cmd = shell_quote(train_bin) + " --resume " + shell_quote(run.string());
                } else {
                    state = "starting";
                    // resume=auto: a run stopped before its first checkpoint starts again in
                    // its folder (train refuses a folder that holds a run otherwise)
                    cmd = shell_quote(train_bin) + " -c " + shell_quote(base) + " --set " +
                          shell_quote("train.out_dir=" + out_dir.string()) + " --set " +
                          shell_quote("train.run_name=" + name) + " --set train.resume=auto";
                }
                if (!cmd.empty())
                    for (const std::string& s : sets) cmd += " --set " + shell_quote(s);
                if (!cmd.empty() && nproc > 0) cmd += " --nproc " + std::to_string(nproc);
                {
                    std::lock_guard<std::mutex> lock(print);
                    const std::string where_to = device.empty() || cmd.empty() || dry ? ""
                                                 : on_gpus && !on_cpu[i]
                                                     ? " on GPU " + device
                                                     : " (CPU, slot " + device + ")";
                    std::printf("[%zu/%zu] %s: %s%s\n", i + 1, sw.runs.size(), name.c_str(), state,
                                where_to.c_str());
                    std::fflush(stdout);
                }
                if (cmd.empty() || dry) continue;
                if (!device.empty()) cmd = "CUDA_VISIBLE_DEVICES=" + device + " " + cmd;
                const std::string log = (out_dir / (name + ".log")).string();
                const int rc = std::system((cmd + " > " + shell_quote(log) + " 2>&1").c_str());
                if (rc != 0) {
                    failures++;
                    std::lock_guard<std::mutex> lock(print);
                    std::printf("  %s failed (exit %d): see %s\n", name.c_str(), rc, log.c_str());
                }
            }
        };
        if (devices.empty()) {
            worker("");
        } else {
            std::vector<std::thread> pool;
            for (const std::string& d : devices) pool.emplace_back(worker, d);
            for (std::thread& t : pool) t.join();
        }
        std::printf("%zu runs, %d failed; %s\n", sw.runs.size(), failures.load(),
                    (out_dir / "sweep.json").string().c_str());
        return failures ? 1 : 0;
    } catch (const std::exception& e) {
        // every refusal names the sweep file (a config's or a run's error names its own too)
        const std::string what = e.what();
        std::fprintf(stderr, "error: %s%s\n",
                     what.find(sweep_file) == std::string::npos ? (sweep_file + ": ").c_str() : "",
                     what.c_str());
        return 1;
    }
}
