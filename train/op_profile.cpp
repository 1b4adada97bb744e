#include "train/op_profile.h"

#include <algorithm>
#include <cstdio>

namespace zgpt {

nlohmann::json gather_rank_reports(Communicator& world, nlohmann::json mine, int64_t step,
                                   double step_ms) {
    mine["rank"] = world.rank();
    const std::vector<std::string> all = gather_texts(world, mine.dump());
    if (world.rank() != 0) return nullptr;
    nlohmann::json ranks = nlohmann::json::array();
    for (const std::string& t : all) ranks.push_back(nlohmann::json::parse(t));
    return {{"step", step}, {"step_ms", step_ms}, {"ranks", ranks}};
}

nlohmann::json gather_op_profile(Communicator& world, const OpTimes& mine, int64_t step,
                                 double step_ms) {
    nlohmann::json ops = nlohmann::json::array();
    double total = 0;
    for (const auto& [name, ms] : mine) {
        ops.push_back({{"op", name}, {"ms", ms}});
        total += ms;
    }
    return gather_rank_reports(world, {{"ops_ms", total}, {"ops", ops}}, step, step_ms);
}

std::string format_op_profile(const nlohmann::json& profile) {
    const nlohmann::json& ranks = profile.at("ranks");
    std::vector<std::string> names;
    for (const auto& r : ranks)
        for (const auto& o : r.at("ops")) {
            const std::string n = o.at("op").get<std::string>();
            if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
        }
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "per-op time of step %lld on each rank, ms (the step took %.1f ms; on a GPU "
                  "this step ran every op on one stream):\n",
                  (long long)profile.at("step").get<int64_t>(),
                  profile.at("step_ms").get<double>());
    std::string out = buf;
    std::snprintf(buf, sizeof buf, "  %-32s", "op");
    out += buf;
    for (const auto& r : ranks) {
        std::snprintf(buf, sizeof buf, " %9s",
                      ("rank " + std::to_string(r.at("rank").get<int>())).c_str());
        out += buf;
    }
    out += "\n";
    auto row = [&](const std::string& label, auto value_of) {
        std::snprintf(buf, sizeof buf, "  %-32s", label.c_str());
        out += buf;
        for (const auto& r : ranks) {
            const double v = value_of(r);
            if (v < 0)
                std::snprintf(buf, sizeof buf, " %9s", "-");
            else
                std::snprintf(buf, sizeof buf, " %9.2f", v);
            out += buf;
        }
        out += "\n";
    };
    for (const std::string& n : names)
        row(n, [&](const nlohmann::json& r) {
            for (const auto& o : r.at("ops"))
                if (o.at("op").get_ref<const std::string&>() == n) return o.at("ms").get<double>();
            return -1.0;
        });
    row("all ops", [](const nlohmann::json& r) { return r.at("ops_ms").get<double>(); });
    return out;
}

}  // namespace zgpt
