// train: trains a GPT from a YAML config.  `train --help` lists the options and every config key.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "kernels/check.h"
#include "train/config.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
    CLI::App app{"Train a small GPT from a YAML config (CPU reference backend)."};
    std::string config_path, resume_dir;
    std::vector<std::string> overrides;
    bool print_config = false;
    app.add_option("-c,--config", config_path, "YAML config (only overrides of the defaults)")
        ->check(CLI::ExistingFile);
    app.add_option("--resume", resume_dir,
                   "continue the run in RUN_DIR from its newest valid checkpoint (its config.yaml "
                   "is the config; --set still applies, e.g. a larger train.max_steps)")
        ->check(CLI::ExistingDirectory);
    app.add_option("--set", overrides, "override a config key: --set optim.lr=3e-4 (repeatable)");
    app.add_flag("--print-config", print_config, "print the resolved config and exit");
    app.footer("Config keys (section: key: default  # meaning):\n" + zgpt::config_reference());
    CLI11_PARSE(app, argc, argv);
    if (config_path.empty() == resume_dir.empty()) {
        std::fprintf(stderr, "error: give exactly one of --config FILE or --resume RUN_DIR\n");
        return 1;
    }
    if (!resume_dir.empty()) {
        const std::filesystem::path dir = std::filesystem::absolute(resume_dir).lexically_normal();
        const std::filesystem::path run = dir.has_filename() ? dir : dir.parent_path();
        config_path = (run / "config.yaml").string();
        overrides.insert(overrides.begin(),
                         {"train.out_dir=" + run.parent_path().string(),
                          "train.run_name=" + run.filename().string(), "train.resume=auto"});
    }
    std::string command_line;
    for (int i = 0; i < argc; i++) command_line += (i ? " " : "") + std::string(argv[i]);
    try {
        zgpt::Config cfg = zgpt::load_config(config_path, overrides);
        if (print_config) {
            std::printf("%s", zgpt::config_to_yaml(cfg).c_str());
            return 0;
        }
        zgpt::train(cfg, config_path, command_line);
    } catch (const zgpt::Error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
