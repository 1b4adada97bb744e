#include "train/backends/zero1_span_plan.h"

#include <algorithm>

#include "kernels/core/check.h"

namespace zgpt {

Zero1SpanPlan plan_span_gather(const std::vector<std::pair<int64_t, int64_t>>& spans, int64_t n,
                               int ranks, int rank, int64_t chunk) {
    ZG_CHECK(ranks >= 1 && rank >= 0 && rank < ranks && chunk >= 1 && chunk * ranks >= n,
             "plan_span_gather: the chunks must cover the arena");
    for (size_t i = 0; i < spans.size(); i++)
        ZG_CHECK(spans[i].first <= spans[i].second && spans[i].second <= n &&
                     (i == 0 || spans[i - 1].second <= spans[i].first),
                 "plan_span_gather: spans must be sorted, disjoint and inside the arena");
    Zero1SpanPlan plan;
    std::vector<std::vector<cuda::CopySpan>> pieces(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; r++) {
        const int64_t a = std::min(n, int64_t(r) * chunk), b = std::min(n, a + chunk);
        int64_t used = 0;
        for (const auto& [lo, hi] : spans) {
            const int64_t x = std::max(lo, a), y = std::min(hi, b);
            if (x >= y) continue;
            pieces[size_t(r)].push_back({x, used, y - x});  // (arena, offset in the block, len)
            used += y - x;
        }
        plan.block = std::max(plan.block, used);
    }
    for (int r = 0; r < ranks; r++)
        for (const cuda::CopySpan& p : pieces[size_t(r)]) {
            const int64_t staged = int64_t(r) * plan.block + p.to;
            if (r == rank)
                plan.pack.push_back({p.from, staged, p.len});
            else
                plan.unpack.push_back({staged, p.from, p.len});
        }
    return plan;
}

}  // namespace zgpt
