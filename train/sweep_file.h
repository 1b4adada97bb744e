// A sweep file (tools/sweep's input): a base config, an output folder, overrides for every run
// and a grid of overrides, read and expanded into its runs, every combination, the last grid key
// varying fastest. tools/sweep trains them; the config test loads every shipped one.
//
//   base: configs/zloss-16m.yaml
//   out_dir: runs/zloss-16m
//   set: [train.max_steps=500]        # every run
//   grid:
//     optim.lr: [1.0e-3, 3.0e-3]
//     loss.z_loss_weight: [0, 1.0e-4]
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace zgpt {

struct SweepRun {
    std::string name;                                            // its run directory's name
    std::vector<std::pair<std::string, std::string>> overrides;  // the grid's, key and value
};

struct SweepFile {
    std::string base;                // the base config's path, as written
    std::string out_dir;             // where the runs go, as written
    std::vector<std::string> fixed;  // `set`: key=value overrides of every run
    std::vector<SweepRun> runs;
    // a run's overrides as `train --set` takes them: the fixed ones, then the grid's
    std::vector<std::string> sets(const SweepRun& r) const;
};

// Reads and checks the file (unknown keys, a grid value that is not a scalar, two runs whose
// names collide, each with file:line) and expands the grid. Does not load the configs.
SweepFile load_sweep_file(const std::string& path);

// "optim.lr=0.001,loss.z_loss_weight=0" -> "lr=0.001_z_loss_weight=0" (a file name)
std::string sweep_run_name(const std::vector<std::pair<std::string, std::string>>& overrides);

}  // namespace zgpt
