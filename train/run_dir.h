// The run directory: resolved config, provenance, metrics.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "train/config.h"
#include "train/device.h"

namespace zgpt {

// Creates out_dir/run_name and returns the path. run_name must be one plain folder name. Without
// one: <config stem>-<YYYYmmdd-HHMMSS>, with -2, -3, ... when a run started in the same second
// took that name. A named folder that already holds a run (metrics or checkpoints) is refused
// unless t.resume is "auto": a run never mixes its files with another's.
std::string make_run_dir(const TrainConfig& t, const std::string& config_path);

// Atomic: written to path.tmp, flushed and closed with every error checked, then renamed over
// path. On any failure path is untouched, the .tmp is removed, and zgpt::Error says why.
// durable: the file is also fsync'ed before the rename and its folder after it (checkpoints).
void write_file_atomic(const std::string& path, const void* data, size_t n, bool durable);
inline void write_text_file(const std::string& path, const std::string& text) {
    write_file_atomic(path, text.data(), text.size(), false);
}

// Git commit of the source tree, host, threads, compiler, device: written as provenance.json.
nlohmann::json provenance(const DeviceChoice& device, const std::string& command_line);

}  // namespace zgpt
