#include "train/step_timeline.h"

#include <algorithm>
#include <cstdio>

namespace zgpt {

nlohmann::json timeline_json(const std::optional<TimelineSummary>& s, const std::string& why_not) {
    if (!s) return {{"unavailable", why_not.empty() ? "nothing recorded" : why_not}};
    nlohmann::json gaps = nlohmann::json::array(), kernels = nlohmann::json::array();
    for (const TimelineGap& g : s->largest_gaps)
        gaps.push_back({{"us", g.us},
                        {"at_ms", g.at_ms},
                        {"before", g.before},
                        {"after", g.after},
                        {"host_call", g.host_call},
                        {"host_call_us", g.host_call_us}});
    for (const TimelineKernel& k : s->top_kernels)
        kernels.push_back({{"name", k.name}, {"calls", k.calls}, {"ms", k.total_ms}});
    return {{"span_ms", s->span_ms},
            {"busy_ms", s->busy_ms},
            {"idle_ms", s->idle_ms},
            {"comm_ms", s->comm_ms},
            {"comm_only_ms", s->comm_only_ms},
            {"kernels", s->kernels},
            {"copies", s->copies},
            {"memsets", s->memsets},
            {"dropped_records", s->dropped},
            {"host_runtime_calls", s->api_calls},
            {"host_runtime_call_ms", s->api_ms},
            {"gaps", gaps},
            {"top_kernels", kernels}};
}

std::string format_step_timeline(const nlohmann::json& t) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "GPU timeline of step %lld on each rank, ms (the step took %.1f ms on the host's "
                  "clock; communication alone: NCCL's kernels with nothing else running, which "
                  "includes waiting for another rank):\n"
                  "  %-6s %14s %9s %8s %9s %11s %8s\n",
                  (long long)t.at("step").get<int64_t>(), t.at("step_ms").get<double>(), "rank",
                  "first to last", "busy", "idle", "comm", "comm alone", "kernels");
    std::string out = buf;
    for (const auto& r : t.at("ranks")) {
        const int rank = r.at("rank").get<int>();
        if (r.contains("unavailable")) {
            std::snprintf(buf, sizeof buf, "  %-6d not recorded: %s\n", rank,
                          r.at("unavailable").get<std::string>().c_str());
            out += buf;
            continue;
        }
        std::snprintf(buf, sizeof buf, "  %-6d %14.2f %9.2f %8.3f %9.2f %11.2f %8lld%s\n", rank,
                      r.at("span_ms").get<double>(), r.at("busy_ms").get<double>(),
                      r.at("idle_ms").get<double>(), r.at("comm_ms").get<double>(),
                      r.at("comm_only_ms").get<double>(), (long long)r.at("kernels").get<int64_t>(),
                      r.at("dropped_records").get<int64_t>() > 0 ? " (records dropped)" : "");
        out += buf;
    }
    for (const auto& r : t.at("ranks")) {
        if (!r.contains("gaps")) continue;
        const auto& gaps = r.at("gaps");
        for (size_t i = 0; i < std::min<size_t>(gaps.size(), 3); i++) {
            const auto& g = gaps[i];
            const std::string host = g.at("host_call").get<std::string>();
            std::snprintf(buf, sizeof buf,
                          "  rank %d idle %.1f us at %.2f ms: after %s, before %s (the host in "
                          "%s)\n",
                          r.at("rank").get<int>(), g.at("us").get<double>(),
                          g.at("at_ms").get<double>(), g.at("before").get<std::string>().c_str(),
                          g.at("after").get<std::string>().c_str(),
                          host.empty() ? "no runtime call" : host.c_str());
            out += buf;
        }
    }
    return out;
}

}  // namespace zgpt
