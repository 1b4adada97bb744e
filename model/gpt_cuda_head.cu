// GptCuda's loss head: the LM-head GEMM and cross-entropy pipelined in row chunks (loss()),
// the vocab-parallel head (loss_sharded()), and the loss summaries. The vocab-parallel embedding
// (embed_from_shards()) stays in gpt_cuda.cu: it is part of the forward pass, not of the head.
#include <algorithm>
#include <cstring>
#include <utility>

#include "kernels/core/cuda_device.h"
#include "model/gpt_cuda_impl.h"

namespace zgpt {

CrossEntropySummary GptCuda::Impl::loss(const int32_t* host_targets, const CrossEntropyOptions& o,
                                        double grad_output, bool compute_grad, bool defer_summary) {
    ZG_CHECK(have_logits, "loss() needs a forward() first");
    validate(o);
    pending_chunks = 0;  // a deferred summary not taken (its caller threw) is dropped
    const int64_t BT = B * Tn, C = cfg.n_embd;
    std::memcpy(h_targets.get(), host_targets, BT * 4);
    ZG_CUDA_CHECK(
        cudaMemcpyAsync(targets.get(), h_targets.get(), BT * 4, cudaMemcpyHostToDevice, stream));
    *h_grad_out.get() = float(grad_output);
    ZG_CUDA_CHECK(
        cudaMemcpyAsync(grad_out.get(), h_grad_out.get(), 4, cudaMemcpyHostToDevice, stream));
    if (vgroup.size > 1) return loss_sharded(o, compute_grad);
    auto* sum = summary.as<cuda::LossSummaryF>();
    const int64_t chunks = head_chunks(o, BT);
    tick(nullptr);
    if (linear_ce) {
        mark(0);  // no logits GEMM: the head is one fused pass in [ev2, ev3]
        mark(1);
        mark(2);
        cuda::LinearCrossEntropyArgs a;
        a.hidden = lnf.get();
        a.weight = w(layout.lm_head);
        a.weight_rows = Vp;  // the table's padded rows are zero (fused_linear_rows' GEMM width)
        a.N = BT;
        a.C = C;
        a.V = cfg.vocab_size;
        a.targets = targets.as<int32_t>();
        a.grad_output = grad_out.as<float>();
        a.summary = sum;
        a.tuning = model_linear_ce_tuning(opt.kernels);
        if (compute_grad) {
            a.dhidden = dtmp.get();
            a.dweight_acc = g(layout.lm_head);
        }
        linear_ce->run(a, o, ce_workspace.get(), stream);
        mark(3);
        tick("head (fused linear)");
    } else if (chunks == 1) {
        mark(0);
        if (head_pending) head_logits(0, BT);
        mark(1);
        tick("head matmul fwd");
        mark(2);
        head_cross_entropy(0, BT, o, sum, stream);
        mark(3);
        tick("cross-entropy");
    } else {
        // chunk c's cross-entropy on cestream after its logits; dlnf of chunk c on the main
        // stream after its cross-entropy
        mark(0);
        const int64_t rows = (BT + chunks - 1) / chunks;
        // Per-op timing runs the same chunks one after another on the main stream: the same
        // GEMM shapes (no algorithm search of new ones in the timed step), each op on its own.
        const bool serial = !overlapping();
        for (int64_t c = 0; c < chunks; c++) {
            const int64_t r0 = c * rows, n = std::min(rows, BT - r0);
            head_logits(r0, n);
            tick("head matmul fwd");
            ZG_CUDA_CHECK(cudaEventRecord(chunk_ev[2 * c], stream));
            if (!serial) ZG_CUDA_CHECK(cudaStreamWaitEvent(cestream, chunk_ev[2 * c]));
            head_cross_entropy(r0, n, o, sum + c, serial ? stream : cestream);
            tick("cross-entropy");
            ZG_CUDA_CHECK(cudaEventRecord(chunk_ev[2 * c + 1], serial ? stream : cestream));
        }
        for (int64_t c = 0; c < chunks; c++) {
            const int64_t r0 = c * rows, n = std::min(rows, BT - r0);
            ZG_CUDA_CHECK(cudaStreamWaitEvent(stream, chunk_ev[2 * c + 1]));
            if (compute_grad) head_input_grad(r0, n);
            tick("head matmul bwd dinp");
        }
        head_dinp_done = compute_grad;
        mark(1);
        mark(2);  // the cross-entropy is inside [ev0, ev1]
        mark(3);
    }
    ZG_CUDA_CHECK(cudaMemcpyAsync(h_summary.get(), sum, chunks * sizeof(cuda::LossSummaryF),
                                  cudaMemcpyDeviceToHost, stream));
    have_logits = compute_grad ? have_logits : false;
    grads_ready = compute_grad;
    if (defer_summary) {
        if (!summary_ev)
            ZG_CUDA_CHECK(cudaEventCreateWithFlags(&summary_ev, cudaEventDisableTiming));
        ZG_CUDA_CHECK(cudaEventRecord(summary_ev, stream));
        pending_chunks = chunks;
        return {};
    }
    ZG_CUDA_CHECK(cudaStreamSynchronize(stream));
    return to_summary(combine_summaries(h_summary.get(), chunks));
}

CrossEntropySummary GptCuda::Impl::take_summary() {
    ZG_CHECK(pending_chunks > 0, "take_summary: no loss summary on its way");
    const int64_t chunks = std::exchange(pending_chunks, 0);
    ZG_CUDA_CHECK(cudaEventSynchronize(summary_ev));
    return to_summary(combine_summaries(h_summary.get(), chunks));
}

CrossEntropySummary GptCuda::Impl::loss_sharded(const CrossEntropyOptions& o, bool compute_grad) {
    ZG_CHECK(o.reduction == Reduction::sum,
             "the vocab-parallel head takes reduction sum (the trainer's)");
    const int P = vgroup.size, p = vgroup.rank;
    const cuda::CollectiveSmsScope leave_sms(overlapping() ? opt.collective_sms : 0);
    const int64_t BT = B * Tn, C = cfg.n_embd, K = vp_chunks;
    const int64_t v0 = shard_v0(p), Vl = shard_rows(p), ld = shard_logits_ld(p);
    const int64_t Vg = shard_gemm_rows(p);  // the GEMMs' width: Vl rounded up to 8
    const void* W = w(layout.lm_head);      // this shard's rows only
    float* dW = g(layout.lm_head);
    auto* stats = vp_stats.as<cuda::RowStatsF>();
    auto* gathered = vp_gathered.as<cuda::RowStatsF>();
    auto* params_ = vp_params.as<cuda::RowGradParams>();
    auto* own_stats = vp_own_stats.as<cuda::RowStatsF>();
    int* n_all = vp_nvalid.as<int>();
    int* n_own = n_all + 1;
    float* rows = vp_rows.as<float>();
    float* own_rows = vp_own_rows.as<float>();
    // The group's rows go through in chunks (chunk k: rows [k rpc, k rpc + n) of every rank, rank
    // by rank), so the buffers hold one chunk of them. The next chunk's hidden states are
    // gathered, and the last chunk's dh reduce-scattered, on vpstream beside this chunk's GEMMs.
    // Per-op timing runs all of it on the main stream, one op after another.
    const int64_t rpc = vp_rows_per_chunk;
    cudaStream_t cs = overlapping() ? vpstream : stream;
    cudaEvent_t *h_ready = vp_ev, *h_free = vp_ev + 2, *dh_ready = vp_ev + 4, *dh_sent = vp_ev + 6;
    cudaEvent_t comm_done = vp_ev[8];
    cudaStream_t last_comm = stream;
    // Every collective waits for the one before it: on every rank they run in the order issued.
    auto collective = [&](cudaStream_t on, auto&& call) {
        if (on != last_comm) ZG_CUDA_CHECK(cudaStreamWaitEvent(on, comm_done));
        call();
        ZG_CUDA_CHECK(cudaEventRecord(comm_done, on));
        last_comm = on;
    };
    tick(nullptr);
    // Both chunk buffers are free, and lnf written, once the work queued so far is done.
    for (int b = 0; b < 2; b++) {
        ZG_CUDA_CHECK(cudaEventRecord(h_free[b], stream));
        ZG_CUDA_CHECK(cudaEventRecord(dh_sent[b], stream));
    }
    ZG_CUDA_CHECK(cudaEventRecord(comm_done, stream));
    collective(stream, [&] { vgroup.all_gather(targets.get(), vp_y.get(), BT * 4, stream); });
    tick("head (vp): all-gather targets");
    auto gather_h = [&](int64_t k) {
        const int b = int(k % 2);
        ZG_CUDA_CHECK(cudaStreamWaitEvent(cs, h_free[b]));
        collective(cs, [&] {
            vgroup.all_gather(lnf.as<char>() + k * rpc * C * es, vp_h[b].get(),
                              vp_chunk_rows(k) * C * int64_t(es), cs);
        });
        ZG_CUDA_CHECK(cudaEventRecord(h_ready[b], cs));
    };
    // Each rank gets its own rows' dh of chunk k, summed over the shards.
    auto scatter_dh = [&](int64_t k) {
        const int b = int(k % 2);
        ZG_CUDA_CHECK(cudaStreamWaitEvent(cs, dh_ready[b]));
        collective(cs, [&] {
            vgroup.reduce_scatter_sum(vp_dhc[b].as<float>(), vp_dh.as<float>() + k * rpc * C,
                                      vp_chunk_rows(k) * C, cs);
        });
        ZG_CUDA_CHECK(cudaEventRecord(dh_sent[b], cs));
    };

    cuda::CrossEntropyArgs a;  // this shard, a chunk's rows of the group
    a.type = logits_type();
    a.V_local = Vl;
    a.v0 = v0;
    a.V = cfg.vocab_size;
    a.ld = ld;
    a.logits = a.dlogits = vp_work.get();
    a.targets = vp_yc.as<int32_t>();
    a.grad_output = grad_out.as<float>();
    a.summary = vp_summary.as<cuda::LossSummaryF>();
    // The one-read pass (kernels/loss_head/shard_one_read.h): the shard as whole rows of V_local
    // columns with local targets, grad output 1 and no z-loss; its row buffers (one_read_rows).
    // (without a gradient the statistics' one read is all there is: no write of q)
    const bool one_read =
        compute_grad && shard_one_read() && o.label_smoothing == 0.0 && o.ignore_index < 0;
    int32_t* local = vp_local.as<int32_t>();
    const cuda::OneReadRows lr = cuda::one_read_rows(vp_local_rows.get(), P * vp_rows_per_chunk);
    cuda::CrossEntropyArgs pa;
    pa.type = a.type;
    pa.ld = ld;
    pa.V_local = pa.V = Vl;
    pa.logits = pa.dlogits = vp_work.get();
    pa.targets = local;
    pa.grad_output = vp_one.as<float>();
    pa.ce_rows = lr.ce;
    pa.stat_rows = lr.stat;
    pa.summary = vp_local_summary.as<cuda::LossSummaryF>();
    pa.absent_targets = true;
    pa.tuning = opt.kernels.cross_entropy_tuning;
    CrossEntropyOptions po;
    po.reduction = Reduction::sum;
    po.ignore_index = o.ignore_index;
    cuda::LinearCrossEntropyArgs la;  // fused_linear: the same from the chunk's hidden states
    la.weight = W;
    la.C = C;
    la.V = cfg.vocab_size;
    la.v0 = v0;
    la.V_local = Vl;
    la.targets = a.targets;
    la.grad_output = a.grad_output;
    la.summary = a.summary;
    la.tuning = model_linear_ce_tuning(opt.kernels);  // (shards ignore rows_outer)
    if (compute_grad) la.dweight_acc = dW;

    gather_h(0);
    for (int64_t k = 0; k < K; k++) {
        const int b = int(k % 2);
        const int64_t r0 = k * rpc, n = vp_chunk_rows(k), NC = P * n;
        a.N = la.N = NC;
        a.loss_rows = rows;
        a.ce_rows = rows + NC;
        a.z_rows = rows + 2 * NC;
        a.lse_rows = rows + 3 * NC;
        la.hidden = vp_h[b].get();
        // the chunk's targets in its row order: rows [r0, r0 + n) of every rank
        ZG_CUDA_CHECK(cudaMemcpy2DAsync(vp_yc.get(), n * 4, vp_y.as<int32_t>() + r0, BT * 4, n * 4,
                                        P, cudaMemcpyDeviceToDevice, stream));
        // The last chunk's dh out and the next chunk's hidden states in, beside this chunk's
        // logits GEMM: issued first, so that they are done before the cross-entropy pass
        // (below, the statistics' exchange waits for them anyway). A pass that holds the whole
        // GPU for its rows (fast's persistent clusters) then runs alone: beside NCCL's kernels
        // its clusters that start late finish late, and the pass waits for its slowest.
        if (compute_grad && k > 0) scatter_dh(k - 1);
        if (k + 1 < K) gather_h(k + 1);
        tick("head (vp): hidden states in, dh out");
        ZG_CUDA_CHECK(cudaStreamWaitEvent(stream, h_ready[b]));
        if (linear_ce) {
            cuda::linear_ce_shard_stats(stats, la, o, ce_workspace.get(), stream);
            tick("head (vp): fused linear statistics");
        } else {
            // logits [NC, Vg] = H_chunk W_shard^T, rows ld apart (columns Vl.. unused by the loss)
            cuda::Gemm gf = forward_gemm(vp_work.get(), vp_h[b].get(), W, NC, C, Vg);
            gf.ldd = ld;
            cuda::gemm(gf, stream);
            tick("head (vp): logits matmul");
            if (one_read) {  // the logits' one read: they become q in place
                if (cs != stream) ZG_CUDA_CHECK(cudaStreamWaitEvent(stream, comm_done));
                cuda::ce_local_targets(local, lr.target_logit, a.targets, vp_work.get(), t, ld, NC,
                                       v0, Vl, o.ignore_index, stream);
                pa.N = NC;
                ce->run(pa, po, ce_workspace.get(), stream);
                cuda::ce_local_shard_stats(stats, lr.stat, lr.ce, lr.target_logit, local, NC, Vl,
                                           stream);
                tick("head (vp): cross-entropy local pass");
            } else {
                cuda::ce_shard_stats(stats, a, o, stream);
                tick("head (vp): cross-entropy statistics");
            }
        }
        // One collective for the chunk's statistics; every rank merges them in rank order.
        collective(stream, [&] {
            vgroup.all_gather(stats, gathered, NC * int64_t(sizeof(cuda::RowStatsF)), stream);
        });
        ZG_CUDA_CHECK(cudaMemcpyAsync(stats, gathered, NC * sizeof(cuda::RowStatsF),
                                      cudaMemcpyDeviceToDevice, stream));
        for (int r = 1; r < P; r++) cuda::ce_merge_stats(stats, gathered + r * NC, NC, stream);
        cuda::ce_count_valid(n_all, a.targets, NC, o.ignore_index, stream);
        cuda::ce_finalize(params_, stats, n_all, a, o, stream);
        // this rank's rows (rows p n.. of the chunk) for what it reports
        for (int j = 0; j < 4; j++)
            ZG_CUDA_CHECK(cudaMemcpyAsync(own_rows + j * BT + r0, rows + j * NC + p * n, n * 4,
                                          cudaMemcpyDeviceToDevice, stream));
        ZG_CUDA_CHECK(cudaMemcpyAsync(own_stats + r0, stats + p * n, n * sizeof(cuda::RowStatsF),
                                      cudaMemcpyDeviceToDevice, stream));
        tick("head (vp): all-gather + merge statistics");
        if (compute_grad) {
            float* dh = vp_dhc[b].as<float>();  // [NC, C] fp32, for the sum over the shards
            ZG_CUDA_CHECK(cudaStreamWaitEvent(stream, dh_sent[b]));
            if (linear_ce) {  // it adds each vocabulary chunk's dh into dh, and dW
                ZG_CUDA_CHECK(cudaMemsetAsync(dh, 0, NC * C * 4, stream));
                cuda::linear_ce_shard_backward(dh, params_, la, o, ce_workspace.get(), stream);
                ZG_CUDA_CHECK(cudaEventRecord(dh_ready[b], stream));
                tick("head (vp): fused linear backward");
            } else {
                // dlogits: two reads write them now; one read left q, and the factors a and c
                // make it the gradient around the GEMMs (dlogits = a q, plus c at the target)
                if (one_read)
                    cuda::ce_local_factors(lr.a, lr.c, params_, lr.stat, lr.ce, local, NC, Vl,
                                           stream);
                else
                    cuda::ce_shard_backward(a, params_, o, stream);
                // The GEMMs' extra columns carry no gradient. The table's extra rows are zero,
                // so their logits are too; zeroing them keeps dW and dh exact even if not.
                if (Vg > Vl)
                    ZG_CUDA_CHECK(cudaMemset2DAsync(vp_work.as<char>() + Vl * es, ld * es, 0,
                                                    (Vg - Vl) * es, NC, stream));
                tick(one_read ? "head (vp): cross-entropy factors"
                              : "head (vp): cross-entropy gradient");
                cuda::Gemm gi = input_grad_gemm(dh, vp_work.get(), W, NC, C, Vg);
                gi.lda = ld;
                gi.d_type = DType::f32;
                cuda::gemm(gi, stream);
                if (one_read) cuda::shard_dh_finish(dh, lr.a, lr.c, local, W, t, NC, C, Vl, stream);
                ZG_CUDA_CHECK(cudaEventRecord(dh_ready[b], stream));
                tick("head (vp): matmul dinp");
                // dW_shard += dlogits^T H_chunk (fp32, into the arena; its table has the Vg rows):
                // with one read q^T (a H_chunk), then c_i H_i into each local target's row
                if (one_read)
                    cuda::shard_scale_rows(vp_hs.get(), vp_h[b].get(), lr.a, t, NC, C, stream);
                cuda::Gemm gw = weight_grad_gemm(dW, vp_work.get(),
                                                 one_read ? vp_hs.get() : vp_h[b].get(), NC, C, Vg);
                gw.lda = ld;
                cuda::gemm(gw, stream);
                if (one_read)
                    cuda::shard_dw_target_rows(dW, lr.c, local, vp_h[b].get(), t, NC, C, Vl,
                                               vp_sort.get(), vp_sort.bytes(), stream);
                tick("head (vp): matmul dW");
            }
        }
        ZG_CUDA_CHECK(cudaEventRecord(h_free[b], stream));  // its last reader is queued
    }
    if (compute_grad) {
        scatter_dh(K - 1);  // (vpstream runs in order: the last one ends after all the others)
        ZG_CUDA_CHECK(cudaStreamWaitEvent(stream, dh_sent[(K - 1) % 2]));
        cuda::cast_from_f32(dtmp.get(), vp_dh.as<float>(), BT * C, t, stream);
        tick("head (vp): reduce-scatter dinp");
    }
    // This rank's rows for what it reports (the group's loss adds up over the ranks).
    cuda::CrossEntropyArgs own = a;
    own.N = BT;
    own.targets = targets.as<int32_t>();
    own.loss_rows = own_rows;
    own.ce_rows = own_rows + BT;
    own.z_rows = own_rows + 2 * BT;
    own.lse_rows = own_rows + 3 * BT;
    cuda::ce_count_valid(n_own, own.targets, BT, o.ignore_index, stream);
    cuda::ce_reduce(own, own_stats, n_own, o, stream);
    tick("head (vp): loss sums");
    ZG_CUDA_CHECK(cudaMemcpyAsync(h_summary.get(), a.summary, sizeof(cuda::LossSummaryF),
                                  cudaMemcpyDeviceToHost, stream));
    vgroup.settle();  // the chunks' collectives, bounded by the timeout
    ZG_CUDA_CHECK(cudaStreamSynchronize(stream));
    const cuda::LossSummaryF f = h_summary.get()[0];
    const CrossEntropySummary s = to_summary(f);
    head_sharded_done = compute_grad;
    grads_ready = compute_grad;
    if (!compute_grad) have_logits = false;
    return s;
}

void GptCuda::Impl::head_logits(int64_t r0, int64_t n) {
    head_pending = false;
    linear_forward(logits.as<char>() + r0 * Vp * es, lnf.as<char>() + r0 * cfg.n_embd * es,
                   layout.lm_head, -1, n, cfg.n_embd, Vp);
}

void GptCuda::Impl::head_cross_entropy(int64_t r0, int64_t n, const CrossEntropyOptions& o,
                                       cuda::LossSummaryF* sum, cudaStream_t st) {
    cuda::CrossEntropyArgs a;
    a.logits = logits.as<char>() + r0 * Vp * es;
    a.type = logits_type();
    a.ld = Vp;
    a.N = n;
    a.V_local = a.V = cfg.vocab_size;
    a.targets = targets.as<int32_t>() + r0;
    a.grad_output = grad_out.as<float>();
    a.dlogits = const_cast<void*>(a.logits);
    a.summary = sum;
    a.tuning = opt.kernels.cross_entropy_tuning;
    ce->run(a, o, ce_workspace.get(), st);
    if (Vp > cfg.vocab_size)  // padded columns carry no gradient
        ZG_CUDA_CHECK(cudaMemset2DAsync(static_cast<char*>(a.dlogits) + cfg.vocab_size * es,
                                        Vp * es, 0, (Vp - cfg.vocab_size) * es, n, st));
}

void GptCuda::Impl::head_input_grad(int64_t r0, int64_t n) {
    cuda::gemm(input_grad_gemm(dtmp.as<char>() + r0 * cfg.n_embd * es,
                               logits.as<char>() + r0 * Vp * es, layout.lm_head, n, cfg.n_embd, Vp),
               stream);
}

CrossEntropySummary GptCuda::Impl::to_summary(const cuda::LossSummaryF& f) {
    CrossEntropySummary s;
    s.loss = f.loss;
    s.sum_loss = f.sum_loss;
    s.sum_ce = f.sum_ce;
    s.sum_z_loss = f.sum_z_loss;
    s.sum_lse = f.sum_lse;
    s.sum_lse_sq = f.sum_lse_sq;
    s.n_valid = f.n_valid;
    s.max_logit = f.max_logit;
    return s;
}

cuda::LossSummaryF GptCuda::Impl::combine_summaries(const cuda::LossSummaryF* s, int64_t n) {
    if (n == 1) return s[0];
    double acc[6] = {};
    cuda::LossSummaryF f = s[0];
    f.n_valid = 0;
    for (int64_t i = 0; i < n; i++) {
        const float v[6] = {s[i].loss,       s[i].sum_loss, s[i].sum_ce,
                            s[i].sum_z_loss, s[i].sum_lse,  s[i].sum_lse_sq};
        for (int k = 0; k < 6; k++) acc[k] += v[k];
        f.max_logit = std::max(f.max_logit, s[i].max_logit);
        f.n_valid += s[i].n_valid;
    }
    f.loss = float(acc[0]);
    f.sum_loss = float(acc[1]);
    f.sum_ce = float(acc[2]);
    f.sum_z_loss = float(acc[3]);
    f.sum_lse = float(acc[4]);
    f.sum_lse_sq = float(acc[5]);
    return f;
}
}  // namespace zgpt
