// One step's GPU timeline on every rank (train.timeline_step): what each rank's backend recorded
// (kernels/core/gpu_timeline.h), gathered on rank 0, written to the run directory and printed as
// a table with a row per rank. Ranks that wait for each other at a collective show it as time
// that communication ran alone, not as idle time (NCCL's kernels are busy while they wait).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/core/gpu_timeline.h"
#include "train/dist/comm.h"

namespace zgpt {

// One rank's summary as JSON; {"unavailable": why} where nothing was recorded.
nlohmann::json timeline_json(const std::optional<TimelineSummary>& s, const std::string& why_not);

// Every rank's timeline on rank 0 ({"step", "step_ms", "ranks": [{"rank", ...}]}); other ranks
// get null. Collective over `world`.
nlohmann::json gather_step_timeline(Communicator& world, const nlohmann::json& mine, int64_t step,
                                    double step_ms);

// The table: a row per rank (first to last activity, busy, idle, communication, communication
// alone, kernels), then each rank's longest idle gaps.
std::string format_step_timeline(const nlohmann::json& timeline);

}  // namespace zgpt
