#!/usr/bin/env python3
"""tools/bench/torch_step_profile.py without PyTorch or a GPU: its kernel-name rules put kernels
of the names cuBLAS, PyTorch's flash attention, cuDNN, Inductor and the fused AdamW use into the
op families bench_train --ops' ops are summed into, and a bench_train JSON's ops sum into those
families with nothing lost, and the marker kernels between phases split a profiled stream into
steps and phases."""
import importlib.util
import json
import pathlib
import tempfile

root = pathlib.Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("torch_step_profile",
                                              root / "tools/bench/torch_step_profile.py")
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)

cases = [
    ("forward", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas", "matmul fwd"),
    ("backward", "nvjet_tst_256x128_64x4_2x1_v_bz_coopA_NNT", "matmul bwd"),
    ("backward", "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nt", "matmul bwd"),
    ("forward", "triton_tem_fused_mm_0", "matmul fwd"),
    ("forward", "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, "
     "false, false, cutlass::bfloat16_t>>", "attention fwd"),
    ("backward", "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<>",
     "attention bwd"),
    ("forward", "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3",
     "attention fwd"),
    ("backward", "void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*)",
     "attention bwd"),
    ("backward", "void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*)",
     "attention bwd"),
    ("forward", "triton_per_fused_add_embedding_native_layer_norm_0", "layernorm fwd (+ residual)"),
    ("backward", "triton_per_fused_add_native_layer_norm_backward_3", "layernorm bwd"),
    ("forward", "triton_red_fused__log_softmax__to_copy_nll_loss_forward_12", "cross-entropy"),
    ("backward", "triton_poi_fused__log_softmax_backward_data_nll_loss_backward_1",
     "cross-entropy"),
    ("forward", "triton_poi_fused_add_mul_pow_tanh_view_5", "other fwd"),
    ("backward", "void at::native::embedding_backward_feature_kernel<c10::BFloat16>", "encoder"),
    ("backward", "triton_red_fused_sum_7", "other bwd"),
    ("adamw", "void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "adamw"),
    ("gradient norm", "void at::native::lpnorm_cleanup<float>", "gradient norm"),
]
bad = [(p, n, w, tool.classify(p, n)) for p, n, w in cases if tool.classify(p, n) != w]
assert not bad, bad

ops = [{"op": "matmul fwd", "ms": 1.0}, {"op": "matmul fwd (fc + GELU)", "ms": 2.0},
       {"op": "head matmul fwd", "ms": 0.5}, {"op": "matmul bwd dinp", "ms": 3.0},
       {"op": "matmul bwd dW", "ms": 3.5}, {"op": "attention bwd", "ms": 4.0},
       {"op": "layernorm bwd", "ms": 0.25}, {"op": "bias bwd", "ms": 0.125},
       {"op": "GELU bwd", "ms": 0.5}, {"op": "residual gradient cast", "ms": 0.25},
       {"op": "something new", "ms": 0.0625}]
with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    json.dump({"ops": ops}, f)
fam = tool.ours_by_family(f.name)
assert fam["matmul fwd"] == 3.5 and fam["matmul bwd"] == 6.5, fam
assert fam["attention bwd"] == 4.0 and fam["layernorm bwd"] == 0.25 and fam["other bwd"] == 0.875
assert fam["other (not grouped)"] == 0.0625, fam
assert abs(sum(fam.values()) - sum(o["ms"] for o in ops)) < 1e-12, "an op counted twice or lost"
pathlib.Path(f.name).unlink()
# two steps of two phases: a marker before each phase and one after the last
M = "at::cuda::(anonymous namespace)::" + tool.MARKER + "(long)"
stream = [("before", 0, 5), (M, 10, 11), ("a", 12, 14), ("a", 15, 16), (M, 20, 21), ("b", 21, 25),
          (M, 30, 31), ("a", 31, 34), (M, 40, 41), (M, 41, 42)]
steps = tool.split_phases(stream, ["p1", "p2"], 2)
assert [s["p1"]["kernels"] for s in steps] == [{"a": 0.003}, {"a": 0.003}], steps
assert steps[0]["p1"]["span_ms"] == 0.009 and steps[0]["p2"]["busy_ms"] == 0.004, steps
assert steps[1]["p2"]["kernels"] == {} and steps[1]["p2"]["span_ms"] == 0.0, steps
try:
    tool.split_phases(stream[:-1], ["p1", "p2"], 2)
    raise AssertionError("a missing marker passed")
except SystemExit as e:
    assert "markers" in str(e)
print("torch profile: ok")
