// ZeRO-1's weight gather on the GPU where the slices are the equal chunks of one all-gather (no
// split vocabulary, a device communicator). After AdamW each rank holds fresh weights in its own
// chunk only, and gathers the rest:
//  - fp32 precision: one in-place all-gather of the fp32 master weights;
//  - bf16: one in-place all-gather of the bf16 working copy (half the bytes; AdamW wrote this
//    rank's chunk of it, rounded as a conversion would), and one small all-gather of the spans the
//    passes read from the fp32 master weights (GptCuda::master_read_spans: the norms' weights),
//    packed. The other master weights outside this rank's chunk are then stale until
//    gather_masters(), which the trainer calls on every rank before it reads params().
// Where those spans are not small (the embeddings, with an fp32 residual stream), bf16 precision
// takes the fp32 path too.
#pragma once
#include <cstdint>

#include "model/device_buffer.h"
#include "model/gpt_cuda.h"
#include "train/dist/comm.h"

namespace zgpt {

class Zero1WeightGather {
  public:
    // chunk: ceil(n / comm.size()); the model's arenas have room for comm.size() of them.
    Zero1WeightGather(GptCuda& model, Communicator& comm, int64_t chunk);
    // After this rank's AdamW, on the model's stream (the communicator's stream set to it).
    void after_step();
    // The fp32 master weights made whole again (collective; nothing to do where not stale).
    void gather_masters();
    bool masters_stale() const { return stale_; }
    void masters_loaded() { stale_ = false; }  // the whole arena was just set

  private:
    GptCuda& model_;
    Communicator& comm_;
    int64_t chunk_;
    bool working_copy_ = false;  // the bf16 path
    int64_t block_ = 0;          // floats of packed spans a rank (the most any rank has)
    int packs_ = 0, unpacks_ = 0;
    DeviceBuffer pack_, unpack_;  // cuda::CopySpan tables
    DeviceBuffer staging_;        // comm.size() blocks
    bool stale_ = false;
};

}  // namespace zgpt
