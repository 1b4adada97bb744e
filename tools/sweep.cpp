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
#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
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

namespace fs = std::filesystem;

namespace {

struct Axis {
    std::string key;
    std::vector<std::string> values;  // YAML scalars as written
};

std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

// "optim.lr=0.001,loss.z_loss_weight=0" -> "lr=0.001_z_loss_weight=0" (a file name)
std::string run_name(const std::vector<std::pair<std::string, std::string>>& combo) {
    std::string n;
    for (const auto& [k, v] : combo) {
        n += (n.empty() ? "" : "_") + k.substr(k.find('.') + 1) + "=" + v;
    }
    for (char& c : n)
        if (!(std::isalnum((unsigned char)c) || c == '=' || c == '.' || c == '_' || c == '-' ||
              c == '+'))  // '+' kept: 1.0e+1 and 1.0e-1 are different runs
            c = '-';
    return n.empty() ? "base" : n;
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
        YAML::Node root;
        try {
            root = YAML::Load(zgpt::read_regular_file(sweep_file, "sweep file"));
        } catch (const YAML::Exception& e) {
            throw zgpt::Error(sweep_file + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
        }
        ZG_CHECK(root.IsMap(), sweep_file + ": must be a map with base, out_dir, grid and set");
        auto at = [&](const YAML::Node& n) {  // "file:line: " of a node, for messages
            return sweep_file + ":" + std::to_string(n.Mark().line + 1) + ": ";
        };
        for (const auto& kv : root) {
            const std::string k = kv.first.as<std::string>();
            ZG_CHECK(k == "base" || k == "out_dir" || k == "grid" || k == "set",
                     at(kv.first) + "unknown key '" + k + "' (known: base, out_dir, grid, set)");
        }
        ZG_CHECK(root["base"] && root["out_dir"], sweep_file + ": needs base and out_dir");
        const std::string base = root["base"].as<std::string>();
        const fs::path out_dir = root["out_dir"].as<std::string>();
        std::vector<std::string> fixed;
        if (root["set"]) {
            ZG_CHECK(root["set"].IsSequence(),
                     at(root["set"]) + "set must be a list of key=value overrides");
            for (const auto& s : root["set"]) fixed.push_back(s.as<std::string>());
        }
        ZG_CHECK(!root["grid"] || root["grid"].IsMap(),
                 at(root["grid"]) + "grid must be a map of key: [values]");
        std::vector<Axis> axes;
        if (root["grid"])
            for (const auto& kv : root["grid"]) {
                Axis a{kv.first.as<std::string>(), {}};
                ZG_CHECK(kv.second.IsSequence() && kv.second.size() > 0,
                         at(kv.second) + "grid." + a.key + " must be a non-empty list");
                for (const auto& v : kv.second) {
                    // a list or a map has no scalar: it would become an empty value
                    ZG_CHECK(v.IsScalar(), at(v) + "grid." + a.key +
                                               ": each value must be a scalar, not a list or map");
                    a.values.push_back(v.Scalar());
                }
                axes.push_back(a);
            }
        // every combination, the last axis varying fastest; each is checked as a config up front
        std::vector<std::vector<std::pair<std::string, std::string>>> combos = {{}};
        for (const Axis& a : axes) {
            std::vector<std::vector<std::pair<std::string, std::string>>> next;
            for (const auto& c : combos)
                for (const std::string& v : a.values) {
                    auto d = c;
                    d.emplace_back(a.key, v);
                    next.push_back(d);
                }
            combos.swap(next);
        }
        {  // two combinations with one folder name would share a run directory
            std::map<std::string, size_t> names;
            for (size_t i = 0; i < combos.size(); i++) {
                const auto [it, fresh] = names.emplace(run_name(combos[i]), i);
                if (!fresh)
                    throw zgpt::Error(
                        sweep_file + ": combinations " + std::to_string(it->second + 1) + " and " +
                        std::to_string(i + 1) + " both make the run name '" + it->first +
                        "'; make their values differ in letters or digits");
            }
        }
        fs::create_directories(out_dir);
        nlohmann::json manifest{
            {"sweep", sweep_file}, {"base", base}, {"runs", nlohmann::json::array()}};
        std::vector<char> on_cpu;  // train.device=cpu: --gpus only sets how many run at once
        for (const auto& c : combos) {
            std::vector<std::string> sets = fixed;
            nlohmann::json over = nlohmann::json::object();
            for (const auto& [k, v] : c) {
                sets.push_back(k + "=" + v);
                over[k] = v;
            }
            // a bad combination fails before anything runs
            on_cpu.push_back(zgpt::load_config(base, sets).train.device == "cpu");
            manifest["runs"].push_back({{"name", run_name(c)}, {"overrides", over}});
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
        zgpt::write_text_file((out_dir / "sweep.json").string(), manifest.dump(2) + "\n");
        std::atomic<int> failures{0};
        std::atomic<size_t> next{0};
        std::mutex print;
        auto worker = [&](const std::string& device) {
            for (size_t i; (i = next++) < combos.size();) {
                const std::string name = run_name(combos[i]);
                const fs::path run = out_dir / name;
                std::string cmd;
                std::vector<std::string> sets = fixed;
                for (const auto& [k, v] : combos[i]) sets.push_back(k + "=" + v);
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
                    std::printf("[%zu/%zu] %s: %s%s\n", i + 1, combos.size(), name.c_str(), state,
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
        std::printf("%zu runs, %d failed; %s\n", combos.size(), failures.load(),
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
