// One step's per-op times on every rank (train.profile_step): what a rank's model measured with
// an event after each op (Backend::take_op_times), gathered on rank 0, written to the run
// directory and printed as one table with a column per rank. A rank that waits for another at a
// collective shows it as that collective's time, so the slowest rank's ops stand out.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/dist/comm.h"

namespace zgpt {

using OpTimes = std::vector<std::pair<std::string, double>>;

// Every rank's report of one step on rank 0: {"step", "step_ms", "ranks": [each rank's `mine`
// with its "rank"]}, in rank order; other ranks get null. Collective over `world`. (The op
// profile below, and train/step_timeline.h's timelines.)
nlohmann::json gather_rank_reports(Communicator& world, nlohmann::json mine, int64_t step,
                                   double step_ms);

// Every rank's ops as JSON on rank 0 ({"step", "step_ms", "ranks": [{"rank", "ops_ms": total,
// "ops": [{"op", "ms"}]}]}); other ranks get null. Collective over `world`.
nlohmann::json gather_op_profile(Communicator& world, const OpTimes& mine, int64_t step,
                                 double step_ms);

// The table: one row per op (in rank 0's order, then ops only other ranks ran), one column per
// rank, and the ops' total.
std::string format_op_profile(const nlohmann::json& profile);

}  // namespace zgpt
