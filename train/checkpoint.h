// Checkpoints: the fp32 weights, AdamW moments and step, the data-loader position and the resolved
// config, in one file written atomically (temporary file, fsync, rename, fsync of the directory)
// and closed by a checksum. A file that is truncated, corrupt, of another format version or of
// another model shape is refused with a message naming the file and the reason.
//
// Layout (little-endian): "ZGPTCKPT", u32 format version, u32 0, u64 header length, a JSON header
// (step, tokens, loader position, AdamW step, config, tensor table), the params, m and v as fp32
// (the table's total each), then a u64 FNV-1a checksum of everything before it.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/loader.h"
#include "model/parameters.h"
#include "train/config.h"

namespace zgpt {

constexpr uint32_t kCheckpointVersion = 1;

struct CheckpointState {
    int64_t step = 0;    // optimizer steps completed
    int64_t tokens = 0;  // training tokens consumed
    LoaderPosition loader;
    // Windows one loader batch takes over all ranks (batch_size x ranks) when saved, so a run
    // resumes on another rank count at the same point of the data; 0: unknown (older files).
    int64_t loader_windows_per_batch = 0;
    int64_t adam_steps = 0;
    std::string config_yaml;
    // Backend::timed_choices() when saved (empty in older files)
    std::string timed_choices;
    std::vector<float> params, m, v;
};

// Writes dir/ckpt_<step>.bin and keeps the newest `keep` checkpoints; returns the path.
std::string save_checkpoint(const std::string& dir, const ParameterTable& table,
                            const CheckpointState& s, int keep);

CheckpointState load_checkpoint(const std::string& path, const ParameterTable& table);

// The step and config of a checkpoint, from its header alone (to build the model that then loads
// it); no checksum is verified here.
struct CheckpointHeader {
    int64_t step = 0;
    std::string config_yaml;
};
CheckpointHeader read_checkpoint_header(const std::string& path);

// Checkpoint files in dir, newest step first (temporary files of interrupted writes are ignored).
std::vector<std::string> list_checkpoints(const std::string& dir);

// The rule of every reader of a run folder (train --resume, sample --run, export_hf --run): the
// newest checkpoint in dir that loads completely. `load` reads one and throws (any exception) when
// it cannot be used; each newer one it refuses is named with its reason in one line on stderr and
// in *refused, and the next older one is tried. Empty path when none loads.
using CheckpointLoader = std::function<CheckpointState(const std::string& path)>;
std::string latest_valid_checkpoint(const std::string& dir, const CheckpointLoader& load,
                                    std::vector<std::string>* refused, CheckpointState* state);
// The same with load_checkpoint(path, table) as the loader.
std::string latest_valid_checkpoint(const std::string& dir, const ParameterTable& table,
                                    std::vector<std::string>* refused, CheckpointState* state);

// A run's newest valid checkpoint (or the given file), with the config saved inside it: what the
// tools (sample, export_hf) start from. In a run folder the checkpoint's model must be the one
// of the run's config.yaml.
struct RunCheckpoint {
    Config config;
    CheckpointState state;
    std::string path;
};
RunCheckpoint load_run_checkpoint(const std::string& run_dir, const std::string& checkpoint_file);

}  // namespace zgpt
