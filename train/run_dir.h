// The run directory: resolved config, provenance, metrics.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "train/config.h"
#include "train/device.h"

namespace zgpt {

// Creates out_dir/run_name (run_name defaults to <config stem>-<YYYYmmdd-HHMMSS>); returns the
// path.
std::string make_run_dir(const TrainConfig& t, const std::string& config_path);

void write_text_file(const std::string& path, const std::string& text);  // atomic (tmp + rename)

// Git commit of the source tree, host, threads, compiler, device: written as provenance.json.
nlohmann::json provenance(const DeviceChoice& device, const std::string& command_line);

}  // namespace zgpt
