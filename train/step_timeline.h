// One step's GPU timeline on every rank (train.timeline_step): what each rank's backend recorded
// (kernels/core/gpu_timeline.h), gathered on rank 0, written to the run directory and printed as
// a table with a row per rank. Ranks that wait for each other at a collective show it as time
// that communication ran alone, not as idle time (NCCL's kernels are busy while they wait).
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "kernels/core/gpu_timeline.h"

namespace zgpt {

// One rank's summary as JSON; {"unavailable": why} where nothing was recorded. Every rank's on
// rank 0: gather_rank_reports (train/op_profile.h).
nlohmann::json timeline_json(const std::optional<TimelineSummary>& s, const std::string& why_not);

// The table: a row per rank (first to last activity, busy, idle, communication, communication
// alone, kernels), then each rank's longest idle gaps.
std::string format_step_timeline(const nlohmann::json& timeline);

}  // namespace zgpt
