// dcp_moment_name: torch's, Megatron's and Megatron's dp_reshardable moment FQNs, and the
// FQNs of their related items (fqn()), exactly; other items are not moments.
#include <doctest/doctest.h>

#include "folder/dcp.h"

using ckpt::folder::dcp_moment_name;

TEST_CASE("torch's <X>.state.<P>.<moment>") {
    const auto n = dcp_moment_name("optim.state.layers.0.weight.exp_avg_sq");
    REQUIRE(n);
    CHECK(n->X == "optim");
    CHECK(n->P == "layers.0.weight");
    CHECK(n->moment == 1);
    CHECK(!n->megatron);
    CHECK(n->fqn("step") == "optim.state.layers.0.weight.step");
}

TEST_CASE("Megatron's optimizer.state.<moment>.<P>") {
    const auto n = dcp_moment_name("optimizer.state.exp_avg.decoder.layers.0.mlp.weight");
    REQUIRE(n);
    CHECK(n->P == "decoder.layers.0.mlp.weight");
    CHECK(n->moment == 0);
    CHECK((n->megatron && !n->bucket));
    CHECK(n->fqn("param") == "optimizer.state.param.decoder.layers.0.mlp.weight");
}

TEST_CASE("Megatron's dp_reshardable bucket items") {
    const std::string B = "optimizer.distributed.dp_group_idx_0.gbuf_idx_1.dtype_(torch.bfloat16, torch.float32).bucket_idx_2";
    for (int k = 0; k < 3; ++k) {
        const char* moment[3] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
        const auto n = dcp_moment_name(B + "." + moment[k]);
        REQUIRE(n);
        CHECK(n->X == B);
        CHECK(n->P == B);
        CHECK(n->moment == k);
        CHECK((n->megatron && n->bucket));
        CHECK(n->fqn("param") == B + ".param");
        CHECK(n->fqn("exp_avg_sq") == B + ".exp_avg_sq");
    }
    CHECK(!dcp_moment_name(B + ".param"));
    CHECK(!dcp_moment_name("optimizer.distributed.dp_group_idx_0.optimizer/shard_0_1"));
    CHECK(!dcp_moment_name("optimizer.distributed.dp_group_idx_0.per_bucket_numel/shard_0_1"));
    CHECK(!dcp_moment_name("model.distributed.dp_group_idx_0.gbuf_idx_0.bucket_idx_0.exp_avg"));   // not Megatron's prefix
    CHECK(!dcp_moment_name("optimizer.distributed.dp_group_idx_0.exp_avg"));                         // no bucket
}
