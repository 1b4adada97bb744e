// The pure half of kernels/core/gpu_timeline.h: kernel names and the busy/idle sweep over
// intervals.
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "kernels/core/gpu_timeline.h"

namespace zgpt {

std::string short_kernel_name(const char* mangled) {
    if (mangled == nullptr) return "?";
    int status = 0;
    char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    std::string s = status == 0 && d != nullptr ? d : mangled;
    std::free(d);
    // "(anonymous namespace)" is the one parenthesis before the parameter list
    for (size_t p; (p = s.find("(anonymous namespace)")) != std::string::npos;)
        s.replace(p, 21, "{anon}");
    if (s.rfind("void ", 0) == 0) s.erase(0, 5);  // a template function's return type
    std::string out;
    int depth = 0;
    for (char c : s) {
        if (c == '<') depth++;
        if (depth == 0 && c == '(') break;  // the parameter list
        if (depth == 0) out += c;
        if (c == '>' && depth > 0) depth--;
    }
    if (out.size() > 96) out = out.substr(0, 93) + "...";
    return out.empty() ? s.substr(0, 96) : out;
}

namespace {
bool is_communication(const std::string& name) {
    return name.rfind("nccl", 0) == 0;
}

// ns covered by the union of the sorted intervals that keep(i) keeps
template <typename Keep>
uint64_t union_ns(const std::vector<TimelineInterval>& sorted, Keep keep) {
    uint64_t total = 0, lo = 0, hi = 0;
    bool open = false;
    for (const TimelineInterval& i : sorted) {
        if (!keep(i) || i.end <= i.start) continue;
        if (open && i.start <= hi) {
            hi = std::max(hi, i.end);
            continue;
        }
        if (open) total += hi - lo;
        lo = i.start, hi = i.end, open = true;
    }
    return open ? total + (hi - lo) : total;
}
}  // namespace

void summarise_intervals(std::vector<TimelineInterval> v, const std::vector<TimelineInterval>& api,
                         const std::vector<std::string>& names, int gaps, int top,
                         TimelineSummary& out) {
    out.span_ms = out.busy_ms = out.idle_ms = out.api_ms = out.comm_ms = out.comm_only_ms = 0;
    out.gaps_over_5us = 0;
    out.api_calls = int64_t(api.size());
    for (const TimelineInterval& a : api) out.api_ms += double(a.end - a.start) / 1e6;
    out.largest_gaps.clear();
    out.top_kernels.clear();
    if (v.empty()) return;
    std::sort(v.begin(), v.end(), [](const TimelineInterval& a, const TimelineInterval& b) {
        return a.start != b.start ? a.start < b.start : a.end < b.end;
    });
    const uint64_t first = v.front().start;
    uint64_t cur_start = first, cur_end = v.front().end, busy = 0;
    int last = v.front().label;  // the label that ends the current busy stretch
    std::vector<TimelineGap> all;
    std::map<int, std::pair<int64_t, uint64_t>> per_label;  // calls, summed ns
    for (const TimelineInterval& i : v) {
        auto& pl = per_label[i.label];
        pl.first++;
        pl.second += i.end > i.start ? i.end - i.start : 0;
        if (i.start > cur_end) {  // nothing ran in [cur_end, i.start)
            const double us = double(i.start - cur_end) / 1e3;
            TimelineGap g{us, double(cur_end - first) / 1e6, names.at(size_t(last)),
                          names.at(size_t(i.label))};
            for (const TimelineInterval& a : api) {  // the host call covering most of the gap
                const uint64_t lo = std::max(a.start, cur_end), hi = std::min(a.end, i.start);
                if (hi > lo && double(hi - lo) / 1e3 > g.host_call_us) {
                    g.host_call = names.at(size_t(a.label));
                    g.host_call_us = double(hi - lo) / 1e3;
                }
            }
            all.push_back(std::move(g));
            if (us > 5) out.gaps_over_5us++;
            busy += cur_end - cur_start;
            cur_start = i.start;
            cur_end = i.end;
            last = i.label;
        } else if (i.end >= cur_end) {
            cur_end = i.end;
            last = i.label;
        }
    }
    busy += cur_end - cur_start;
    uint64_t end = 0;
    for (const TimelineInterval& i : v) end = std::max(end, i.end);
    out.span_ms = double(end - first) / 1e6;
    out.busy_ms = double(busy) / 1e6;
    out.idle_ms = out.span_ms - out.busy_ms;
    std::vector<bool> comm(names.size());
    for (size_t k = 0; k < names.size(); k++) comm[k] = is_communication(names[k]);
    out.comm_ms =
        double(union_ns(v, [&](const TimelineInterval& i) { return comm.at(size_t(i.label)); })) /
        1e6;
    const double others_ms =
        double(union_ns(v, [&](const TimelineInterval& i) { return !comm.at(size_t(i.label)); })) /
        1e6;
    out.comm_only_ms = std::max(0.0, out.busy_ms - others_ms);
    std::stable_sort(all.begin(), all.end(),
                     [](const TimelineGap& a, const TimelineGap& b) { return a.us > b.us; });
    if (int(all.size()) > gaps) all.resize(size_t(std::max(gaps, 0)));
    out.largest_gaps = std::move(all);
    for (const auto& [label, cn] : per_label)
        out.top_kernels.push_back({names.at(size_t(label)), cn.first, double(cn.second) / 1e6});
    std::stable_sort(
        out.top_kernels.begin(), out.top_kernels.end(),
        [](const TimelineKernel& a, const TimelineKernel& b) { return a.total_ms > b.total_ms; });
    if (int(out.top_kernels.size()) > top) out.top_kernels.resize(size_t(std::max(top, 0)));
}

}  // namespace zgpt
