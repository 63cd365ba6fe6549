// `dlplan export` (issue 19): for every strategy x precision x checkpointing,
// a tiny-gpt plan exported to DeepSpeed (each field checked against the
// plan's values, computed here) and to a PyTorch FSDP/DDP file (the strategy's
// names present, the others absent); and the bad inputs.
#include "cli_helpers.hpp"

#include <cmath>
#include <cstdint>
#include <string>

namespace {

using namespace cli_test;

struct Case {
  std::string strategy, precision, checkpointing;
};

std::string plan_for(const Case& c) {
  const std::string path = temp_path("export_" + c.strategy + "_" + c.precision + "_" + c.checkpointing + ".json");
  Result r = run("plan --model tiny-gpt --gpu h100-80g --gpus 8 --strategy " + c.strategy + " --precision " +
                 c.precision + " --checkpointing " + c.checkpointing + " --out " + path);
  EXPECT_EQ(r.status, 0) << r.err;
  return path;
}

void check_deepspeed(const Case& c, const nlohmann::json& plan, const nlohmann::json& ds) {
  const int64_t world = plan["cluster"]["nodes"].get<int64_t>() * plan["cluster"]["gpus_per_node"].get<int64_t>();
  const int64_t micro = plan["micro_batch"], accum = plan["grad_accum"];
  const auto& o = plan["optimizer"];
  const int stage = c.strategy == "ddp" ? 0 : c.strategy[4] - '0';
  const bool bf16 = c.precision == "bf16-mixed", fp16 = c.precision == "fp16-mixed";
  EXPECT_EQ(world, 8);
  EXPECT_EQ(ds["zero_optimization"]["stage"], stage);
  EXPECT_EQ(ds["train_micro_batch_size_per_gpu"], micro);
  EXPECT_EQ(ds["gradient_accumulation_steps"], accum);
  EXPECT_EQ(ds["train_batch_size"], micro * accum * world);
  EXPECT_EQ(ds["gradient_clipping"], o["clip_norm"]);
  EXPECT_EQ(ds["optimizer"]["type"], "AdamW");
  EXPECT_EQ(ds["optimizer"]["params"]["lr"], o["lr"]);
  EXPECT_EQ(ds["optimizer"]["params"]["betas"], o["betas"]);
  EXPECT_EQ(ds["optimizer"]["params"]["eps"], o["eps"]);
  EXPECT_EQ(ds["optimizer"]["params"]["weight_decay"], o["weight_decay"]);
  EXPECT_EQ(ds.contains("bf16"), bf16);
  if (bf16) {
    EXPECT_EQ(ds["bf16"]["enabled"], true);
  }
  EXPECT_EQ(ds.contains("fp16"), fp16);
  if (fp16) {
    // DeepSpeed's dynamic loss scaler from the plan's GradScaler settings:
    // 2^16 = 2^initial_scale_power, the growth interval as the window.
    EXPECT_EQ(ds["fp16"]["enabled"], true);
    EXPECT_EQ(ds["fp16"]["loss_scale"], 0);
    EXPECT_EQ(std::ldexp(1.0, ds["fp16"]["initial_scale_power"].get<int>()), plan["loss_scale"]["init_scale"].get<double>());
    EXPECT_EQ(ds["fp16"]["loss_scale_window"], plan["loss_scale"]["growth_interval"]);
    EXPECT_EQ(ds["fp16"]["hysteresis"], 1);
  }
  // bucket_mb MiB of gradients (bf16, fp16: 2 bytes, fp32: 4) in elements.
  const auto elements = static_cast<int64_t>(plan["bucket_mb"].get<double>() * 1048576 / (bf16 || fp16 ? 2 : 4));
  EXPECT_EQ(ds["zero_optimization"]["reduce_bucket_size"], elements);
  EXPECT_EQ(ds["zero_optimization"]["allgather_bucket_size"], elements);
  EXPECT_EQ(ds["zero_optimization"]["overlap_comm"], true);
  EXPECT_EQ(ds["zero_optimization"]["contiguous_gradients"], true);
  EXPECT_EQ(ds["zero_optimization"].contains("stage3_prefetch_bucket_size"), stage == 3);
  EXPECT_EQ(ds["scheduler"]["type"], "WarmupCosineLR");
  EXPECT_EQ(ds["scheduler"]["params"]["total_num_steps"], 1000);
  EXPECT_EQ(ds["scheduler"]["params"]["warmup_num_steps"], o["warmup_steps"]);
  EXPECT_DOUBLE_EQ(ds["scheduler"]["params"]["cos_min_ratio"].get<double>(),
                   o["min_lr"].get<double>() / o["lr"].get<double>());
  EXPECT_EQ(ds.contains("activation_checkpointing"), c.checkpointing == "units");
  ASSERT_TRUE(ds["_comment"].is_array());
  EXPECT_TRUE(contains(ds["_comment"].dump(), "left at DeepSpeed's defaults"));
  if (c.checkpointing == "units") {
    EXPECT_TRUE(contains(ds["_comment"].dump(), "deepspeed.checkpointing.checkpoint"));
  }
}

void check_fsdp(const Case& c, const std::string& py) {
  const bool fsdp = c.strategy == "zero2" || c.strategy == "zero3";
  EXPECT_EQ(contains(py, "ShardingStrategy.FULL_SHARD"), c.strategy == "zero3");
  EXPECT_EQ(contains(py, "ShardingStrategy.SHARD_GRAD_OP"), c.strategy == "zero2");
  EXPECT_EQ(contains(py, "return DDP(model"), !fsdp);
  EXPECT_EQ(contains(py, "bucket_cap_mb=BUCKET_CAP_MB"), !fsdp);
  EXPECT_EQ(contains(py, "ZeroRedundancyOptimizer("), c.strategy == "zero1");
  const bool mixed = c.precision != "fp32", fp16 = c.precision == "fp16-mixed";
  EXPECT_EQ(contains(py, "mixed_precision=MixedPrecision("), fsdp && mixed);
  EXPECT_EQ(contains(py, "torch.autocast("), !fsdp && mixed);
  EXPECT_EQ(contains(py, "torch.float16"), fp16);
  EXPECT_EQ(contains(py, "torch.bfloat16"), c.precision == "bf16-mixed");
  // GradScaler (ShardedGradScaler under FSDP) around backward and the step.
  EXPECT_EQ(contains(py, "SCALER = ShardedGradScaler("), fsdp && fp16);
  EXPECT_EQ(contains(py, "SCALER = GradScaler("), !fsdp && fp16);
  EXPECT_EQ(contains(py, "SCALER.scale(loss).backward()"), fp16);
  EXPECT_EQ(contains(py, "SCALER.unscale_(optimizer)"), fp16);
  EXPECT_EQ(contains(py, "SCALER.step(optimizer)"), fp16);
  EXPECT_EQ(contains(py, "    optimizer.step()"), !fp16);
  // FSDP's class is imported whenever it is used (it once came only with --offload params).
  EXPECT_EQ(contains(py, "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP"), fsdp);
  EXPECT_EQ(contains(py, "apply_activation_checkpointing("), c.checkpointing == "units");
  EXPECT_EQ(contains(py, "model.clip_grad_norm_(CLIP_NORM)"), fsdp);
  EXPECT_TRUE(contains(py, "#   torchrun --nproc_per_node 8 --nnodes 1 ")) << py.substr(0, 600);
  EXPECT_TRUE(contains(py, "torch.optim.AdamW(") || contains(py, "optimizer_class=torch.optim.AdamW"));
  EXPECT_TRUE(contains(py, "torch.optim.lr_scheduler.LambdaLR("));
  EXPECT_TRUE(contains(py, "model.no_sync()"));
  EXPECT_TRUE(contains(py, "def wrap(model, block_types=None):"));
  EXPECT_TRUE(contains(py, "def main(model=None"));
}

TEST(CliExport, EveryStrategyPrecisionAndCheckpointing) {
  for (const char* s : {"ddp", "zero1", "zero2", "zero3"})
    for (const char* prec : {"fp32", "bf16-mixed", "fp16-mixed"})
      for (const char* ck : {"none", "units"}) {
        const Case c{s, prec, ck};
        SCOPED_TRACE(c.strategy + " " + c.precision + " " + c.checkpointing);
        const std::string path = plan_for(c);
        const nlohmann::json plan = parse_json(slurp(path));
        ASSERT_EQ(plan["strategy"], c.strategy);
        Result ds = run("export --plan " + path + " --to deepspeed");
        ASSERT_EQ(ds.status, 0) << ds.err;
        EXPECT_EQ(ds.err, "");
        check_deepspeed(c, plan, parse_json(ds.out));
        const std::string out = temp_path("export_" + c.strategy + ".py");
        Result py = run("export --plan " + path + " --to fsdp --out " + out);
        ASSERT_EQ(py.status, 0) << py.err;
        EXPECT_TRUE(contains(py.err, "wrote " + out)) << py.err;
        check_fsdp(c, slurp(out));
        std::remove(out.c_str());
        std::remove(path.c_str());
      }
}

TEST(CliExport, StepsSetTheSchedule) {
  const std::string path = plan_for({"zero2", "bf16-mixed", "none"});
  Result r = run("export --plan " + path + " --to deepspeed --steps 5000");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(parse_json(r.out)["scheduler"]["params"]["total_num_steps"], 5000);
  Result py = run("export --plan " + path + " --to fsdp --steps 5000");
  ASSERT_EQ(py.status, 0) << py.err;
  EXPECT_TRUE(contains(py.out, "STEPS = 5000")) << py.out;
  std::remove(path.c_str());
}

TEST(CliExport, BadInput) {
  expect_user_error("export --plan /nonexistent/plan.json --to deepspeed", {"/nonexistent/plan.json"});
  const std::string path = plan_for({"ddp", "fp32", "none"});
  expect_usage_error("export --plan " + path + " --to foo", {"--to"});
  expect_usage_error("export --to deepspeed", {"--plan"});
  // An edited plan (its content_hash no longer matches) needs --allow-edited-plan.
  nlohmann::json plan = parse_json(slurp(path));
  plan["micro_batch"] = 2;
  const std::string edited = temp_path("export_edited.json");
  std::ofstream(edited) << plan.dump(1);
  expect_user_error("export --plan " + edited + " --to deepspeed", {"edited"});
  Result r = run("export --plan " + edited + " --to deepspeed --allow-edited-plan");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "warning")) << r.err;
  EXPECT_EQ(parse_json(r.out)["train_micro_batch_size_per_gpu"], 2);
  std::remove(edited.c_str());
  std::remove(path.c_str());
}

}  // namespace

// Hybrid sharding and CPU offload in both exports: DeepSpeed's MiCS
// (mics_shard_size) and offload_optimizer / offload_param; FSDP's
// HYBRID_SHARD / _HYBRID_SHARD_ZERO2 and CPUOffload(offload_params=True);
// the combinations one side has no equivalent for refused, naming why.
TEST(CliExport, HybridShardingAndOffload) {
  const std::string h3 = temp_path("export_hsdp3_params.json");
  Result r = run("plan --model tiny-gpt --gpu h100-80g --gpus 16 --nodes 2 --strategy hsdp3 --offload params --out " + h3);
  ASSERT_EQ(r.status, 0) << r.err;
  Result ds = run("export --plan " + h3 + " --to deepspeed");
  ASSERT_EQ(ds.status, 0) << ds.err;
  const nlohmann::json z = parse_json(ds.out)["zero_optimization"];
  EXPECT_EQ(z["stage"], 3);
  EXPECT_EQ(z["mics_shard_size"], 8);  // one node
  EXPECT_EQ(z["offload_optimizer"]["device"], "cpu");
  EXPECT_EQ(z["offload_param"]["device"], "cpu");
  Result py = run("export --plan " + h3 + " --to fsdp");
  ASSERT_EQ(py.status, 0) << py.err;
  EXPECT_TRUE(contains(py.out, "ShardingStrategy.HYBRID_SHARD")) << py.out.substr(0, 800);
  EXPECT_TRUE(contains(py.out, "cpu_offload=CPUOffload(offload_params=True)"));
  EXPECT_TRUE(contains(py.out, "from torch.distributed.fsdp import CPUOffload"));

  const std::string z2 = temp_path("export_zero2_optimizer.json");
  r = run("plan --model tiny-gpt --gpu h100-80g --gpus 8 --strategy zero2 --offload optimizer --out " + z2);
  ASSERT_EQ(r.status, 0) << r.err;
  ds = run("export --plan " + z2 + " --to deepspeed");
  ASSERT_EQ(ds.status, 0) << ds.err;
  const nlohmann::json z2j = parse_json(ds.out)["zero_optimization"];
  EXPECT_EQ(z2j["offload_optimizer"]["device"], "cpu");
  EXPECT_FALSE(z2j.contains("offload_param"));
  expect_user_error("export --plan " + z2 + " --to fsdp", {"no optimizer-only CPU offload"});

  const std::string h2 = temp_path("export_hsdp2.json");
  r = run("plan --model tiny-gpt --gpu h100-80g --gpus 16 --nodes 2 --strategy hsdp2 --out " + h2);
  ASSERT_EQ(r.status, 0) << r.err;
  py = run("export --plan " + h2 + " --to fsdp");
  ASSERT_EQ(py.status, 0) << py.err;
  EXPECT_TRUE(contains(py.out, "ShardingStrategy._HYBRID_SHARD_ZERO2"));
  EXPECT_FALSE(contains(py.out, "CPUOffload"));
  expect_user_error("export --plan " + h2 + " --to deepspeed", {"hsdp2"});
  for (const auto& p : {h3, z2, h2}) std::remove(p.c_str());
}
