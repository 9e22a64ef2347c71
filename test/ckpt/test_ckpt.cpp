// lib/ckpt on the checked-in fixtures (data/README.md gives their optimizers and layouts):
// which states find_param_states identifies and how, the plan plan_layout makes and what
// compare_layout says of a manifest that disagrees with it, and the walk over the source
// in file order (container::source_spans) that compress, verify and restore share.
#include <doctest/doctest.h>

#include <unistd.h>
#include <xxhash.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "container/reader.h"
#include "ckpt/layout.h"
#include "ckpt/optimizer.h"
#include "ckpt/pipeline.h"
#include "container/values.h"
#include "container/manifest.h"
#include "io/checkpoint.h"
#include "io/file.h"

using namespace ckpt;
using ckpt::container::ContainerReader;
using ckpt::test::TempDir;

namespace {

std::string data(const std::string& name) { return std::string(CKPT_SOURCE_DIR) + "/data/" + name; }

const ParamState* by_name(const std::vector<ParamState>& s, const std::string& name) {
    for (const auto& p : s)
        if (p.name == name) return &p;
    return nullptr;
}

std::vector<uint8_t> bytes_of(const io::InputFile& f, uint64_t off, uint64_t n) {
    std::vector<uint8_t> b(n);
    f.read_at(off, b.data(), n, "test");
    return b;
}

}  // namespace

TEST_CASE("find_param_states: AdamW with two param groups (cnn_adamw.pt)") {
    const io::InputFile f(data("cnn_adamw.pt"));
    const Checkpoint ck = read_checkpoint(f.path());
    const std::vector<ParamState> s = find_param_states(ck, f, {});
    REQUIRE(s.size() == 12);
    const ParamState* w = by_name(s, "conv1.weight");
    const ParamState* b = by_name(s, "conv1.bias");
    REQUIRE(w != nullptr);
    REQUIRE(b != nullptr);
    CHECK(w->compressible);
    CHECK(w->hyper.lr == 0.002);
    CHECK(w->hyper.beta1 == 0.9);
    CHECK(w->hyper.beta2 == 0.999);
    CHECK(w->hyper.weight_decay == 0.05);
    CHECK(b->hyper.weight_decay == 0.0);   // the second group: biases and norm parameters
    CHECK(w->hyper.step == 200);
    CHECK(!w->hyper.amsgrad);
    CHECK((w->stated & (kLr | kBeta1 | kBeta2 | kEps | kWeightDecay)) == (kLr | kBeta1 | kBeta2 | kEps | kWeightDecay));
    CHECK(w->theta >= 0);   // the model's conv1.weight, proven by the mapping
    CHECK(ck.tensors[std::size_t(w->theta)].path == "model/conv1.weight");
    CHECK(w->tensor[2] == -1);
    CHECK(ck.tensors[std::size_t(w->tensor[0])].dtype == DType::F32);
}

TEST_CASE("find_param_states: Adam L2, AMSGrad and maximize are told apart") {
    {
        const io::InputFile f(data("cnn_adam_l2.pt"));
        const std::vector<ParamState> s = find_param_states(read_checkpoint(f.path()), f, {});
        REQUIRE(!s.empty());
        CHECK(s[0].hyper.lr == 0.001);
        CHECK(s[0].hyper.weight_decay == 0.0001);
        CHECK(!s[0].hyper.maximize);
    }
    {
        const io::InputFile f(data("lm_amsgrad.pt"));
        const std::vector<ParamState> s = find_param_states(read_checkpoint(f.path()), f, {});
        REQUIRE(!s.empty());
        CHECK(std::all_of(s.begin(), s.end(), [](const ParamState& p) { return p.hyper.amsgrad && p.tensor[2] >= 0; }));
        CHECK(s[0].hyper.lr == 0.002);
    }
    {
        const io::InputFile f(data("cnn_maximize.pt"));
        const std::vector<ParamState> s = find_param_states(read_checkpoint(f.path()), f, {});
        REQUIRE(!s.empty());
        CHECK(s[0].hyper.maximize);
    }
    {   // an override that contradicts the file is refused
        const io::InputFile f(data("cnn_adamw.pt"));
        HyperOverrides o;
        o.lr = 0.5;
        CHECK_THROWS(find_param_states(read_checkpoint(f.path()), f, o));
    }
}

TEST_CASE("max_finite_abs_bits: the largest finite |x| at any position; inf and NaN left out") {
    auto as_float = [](int32_t b) { float f; std::memcpy(&f, &b, 4); return f; };
    auto expected = [](const std::vector<float>& x) {  // a plain float loop: -1 when none is finite
        float m = -1;
        for (float v : x)
            if (std::isfinite(v)) m = std::max(m, std::fabs(v));
        return m;
    };
    CHECK(max_finite_abs_bits(nullptr, 0) == -1);
    for (std::size_t n : {1u, 3u, 17u, 1000u})       // lengths around the vector widths
        for (std::size_t at = 0; at < n; at += n / 3 + 1) {
            std::vector<float> x(n);
            for (std::size_t i = 0; i < n; ++i) x[i] = float(i % 7) * (i % 2 ? -0.25f : 0.5f);
            x[at] = -1e30f;                          // the largest magnitude, negative
            CHECK(as_float(max_finite_abs_bits(x.data(), n)) == 1e30f);
            for (float bad : {-INFINITY, INFINITY, -NAN, NAN}) {  // left out: the others' max
                x[at] = bad;
                const int32_t got = max_finite_abs_bits(x.data(), n);
                CHECK((got < 0 ? -1.0f : as_float(got)) == expected(x));
            }
        }
    const float z[2] = {-0.0f, 0.0f};
    CHECK(max_finite_abs_bits(z, 2) == 0);
    const float none[3] = {-INFINITY, NAN, INFINITY};
    CHECK(max_finite_abs_bits(none, 3) == -1);
}

TEST_CASE("plan_layout and compare_layout (cnn_adamw.pt)") {
    const io::InputFile f(data("cnn_adamw.pt"));
    const Checkpoint ck = read_checkpoint(f.path());
    CompressOptions o;
    o.horizon = 1;  // the first update's gradient domains (--horizon all needs none)
    const Layout L = plan_layout(ck, f, o);
    const container::Manifest& man = L.man;
    CHECK(man.source_size == 132979);
    CHECK(man.source_format == "torch-zip");
    CHECK(man.source_name == "cnn_adamw.pt");
    CHECK(man.storages.size() == ck.storages.size());
    REQUIRE(man.params.size() == 12);
    CHECK(L.kept.empty());
    CHECK(L.stated.size() == 12);
    const container::ParamEntry& p = man.params[0];
    CHECK(p.name == "conv1.weight");
    CHECK(p.numel == 72);   // 8 x 1 x 3 x 3
    CHECK(p.shape == std::vector<int64_t>{8, 1, 3, 3});
    CHECK(p.dtype == DType::F32);
    // optimizer "auto" with weight decay: the union of the AdamW and Adam-L2 domains
    CHECK(p.domain.plain);
    CHECK(p.domain.l2);
    REQUIRE(p.theta_storage >= 0);
    CHECK(p.theta_dtype == DType::F32);
    CHECK(man.storages[std::size_t(p.storage[0])].param == 0);
    CHECK(man.storages[std::size_t(p.storage[1])].role == 1);
    CHECK(man.storages[std::size_t(p.storage[0])].nbytes == 72 * 4);

    CHECK(compare_layout(man, L).empty());
    container::Manifest m = man;
    m.params[0].hyper.step = 201;
    CHECK(compare_layout(m, L) == std::vector<std::string>{"conv1.weight: step (201 vs 200) differs from the checkpoint's own state"});
    m = man;
    m.params[0].dtype = DType::BF16;
    CHECK(compare_layout(m, L) == std::vector<std::string>{"conv1.weight: size or dtype differs from the checkpoint's own state"});
    m = man;
    m.params[1].hyper.lr = 0.5;
    m.params[1].domain.l2 = !m.params[1].domain.l2;
    CHECK(compare_layout(m, L) == std::vector<std::string>{"conv2.weight: lr (0.5 vs 0.002) differs from the checkpoint's own state",
                                                           "conv2.weight: gradient domain differs from the checkpoint's own state"});
    m = man;
    std::swap(m.params[0].storage[0], m.params[0].storage[1]);
    CHECK(compare_layout(m, L) == std::vector<std::string>{"conv1.weight: storage of exp_avg differs from the checkpoint's own state",
                                                           "conv1.weight: storage of exp_avg_sq differs from the checkpoint's own state"});
    m = man;
    m.params[0].name = "renamed";   // names are for reports only
    CHECK(compare_layout(m, L).empty());
    m.params.pop_back();
    CHECK(compare_layout(m, L) == std::vector<std::string>{"the manifest codes 11 optimizer states, the checkpoint has 12 compressible ones"});
}

TEST_CASE("the storage walk: /raw holds exactly the non-moment spans; restore puts them back") {
    TempDir dir;
    const std::string src = data("lm_amsgrad.pt"), ckz = (dir.path / "a.ckz.h5").string(), out = (dir.path / "a.pt").string();
    CompressOptions o;
    o.device = "cpu";
    const Report rc = compress(src, ckz, o);
    CHECK(rc.ok);
    const io::InputFile f(src);
    const ContainerReader cr(ckz);
    const container::Manifest& man = cr.manifest();
    const std::vector<container::SourceSpan> spans = container::source_spans(man);
    // the spans tile the source in order
    uint64_t pos = 0, moment = 0, raw = 0;
    for (const auto& sp : spans) {
        CHECK(sp.begin == pos);
        pos = sp.end;
        (sp.moment ? moment : raw) += sp.size();
        if (sp.storage >= 0) CHECK(sp.moment == (man.storages[std::size_t(sp.storage)].param >= 0));
    }
    CHECK(pos == f.size());
    uint64_t coded = 0;
    for (const auto& p : man.params) coded += p.numel * uint64_t(p.moments()) * 4;
    CHECK(moment == coded);
    CHECK(raw == f.size() - coded);
    // every non-moment byte comes back from /raw at its source offset
    uint64_t same = 0;
    for (const auto& sp : spans) {
        if (sp.moment) continue;
        cr.for_each_raw_piece(sp.begin, sp.end, [&](uint64_t off, const uint8_t* p, std::size_t n) {
            same += bytes_of(f, off, n) == std::vector<uint8_t>(p, p + n) ? n : 0;
        });
    }
    CHECK(same == raw);
    // compress's rows are the reader's (one byte accounting)
    const std::vector<TensorRow> rows = tensor_rows(cr);
    REQUIRE(rows.size() == rc.rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i) {
        CHECK(rows[i].name == rc.rows[i].name);
        CHECK(rows[i].bytes_out == rc.rows[i].bytes_out);
    }
    // ... which share the stored moment bytes by stream_bytes (vlog: each parameter's segments)
    double total = 0;
    for (std::size_t j = 0; j < man.params.size(); ++j)
        total += double(container::stream_bytes(man.params[j], man.codec, cr.coded_bytes(j)));
    for (std::size_t j = 0; j < man.params.size(); ++j) {
        const auto& p = man.params[j];
        CHECK(rows[j].values == p.numel * uint64_t(p.moments()));
        CHECK(rows[j].escapes == p.escapes * uint64_t(p.moments()));
        const double w = double(container::stream_bytes(p, man.codec, cr.coded_bytes(j)));
        CHECK(rows[j].bytes_out == uint64_t(std::llround(double(cr.moment_bytes()) * w / total)));
    }
    // restore: the same non-moment bytes but for the zip CRC-32 fields of the moment entries,
    // which hold the CRC of the restored moment bytes; and a clean verify against the source
    const Report rr = restore(ckz, out, {});
    CHECK(rr.ok);
    const io::InputFile g(out);
    REQUIRE(g.size() == f.size());
    std::vector<char> is_crc(f.size(), 0);
    uint64_t crc_fields = 0, crc_right = 0;
    for (const auto& st : man.storages) {
        if (st.param < 0) continue;
        const std::vector<uint8_t> b = bytes_of(g, st.offset, st.nbytes);
        const uint32_t crc = uint32_t(crc32_z(crc32(0, nullptr, 0), b.data(), b.size()));
        for (uint64_t c : st.crc_offsets) {
            std::fill(is_crc.begin() + long(c), is_crc.begin() + long(c) + 4, 1);
            const std::vector<uint8_t> le = bytes_of(g, c, 4);
            crc_right += (uint32_t(le[0]) | uint32_t(le[1]) << 8 | uint32_t(le[2]) << 16 | uint32_t(le[3]) << 24) == crc;
            ++crc_fields;
        }
    }
    CHECK(crc_fields == 3 * man.params.size() * 2);   // local header + central directory, per moment
    CHECK(crc_right == crc_fields);
    uint64_t restored_same = 0, restored_other = 0;
    for (const auto& sp : spans) {
        if (sp.moment) continue;
        const std::vector<uint8_t> a = bytes_of(f, sp.begin, sp.size()), b = bytes_of(g, sp.begin, sp.size());
        for (uint64_t i = 0; i < sp.size(); ++i)
            if (!is_crc[sp.begin + i]) (a[i] == b[i] ? restored_same : restored_other) += 1;
    }
    CHECK(restored_other == 0);
    CHECK(restored_same == raw - 4 * crc_fields);
    VerifyOptions vo;
    vo.original = src;
    const Report rv = verify(ckz, vo);
    CHECK(rv.ok);
    CHECK(std::find(rv.checks.begin(), rv.checks.end(), "original: every non-moment byte identical") != rv.checks.end());
}

TEST_CASE("compress's self-check compares the decoded codes with the encoded ones") {
    TempDir dir;
    const std::string src = data("lm_amsgrad.pt"), ckz = (dir.path / "a.ckz.h5").string();
    CompressOptions o;
    o.device = "cpu";
    REQUIRE(compress(src, ckz, o).ok);
    // the codes the encoder wrote, per parameter and role, re-read independently of verify
    const ContainerReader cr(ckz);
    const auto& man = cr.manifest();
    std::vector<std::array<uint64_t, 3>> hashes(man.params.size());
    for (std::size_t j = 0; j < man.params.size(); ++j) {
        std::array<std::vector<uint8_t>, 3> all;
        cr.for_each_chunk(j, 1 << 20, ContainerReader::Want::Codes, [&](const ContainerReader::Chunk& c) {
            for (int k = 0; k < man.params[j].moments(); ++k) all[k].insert(all[k].end(), c.codes[k].begin(), c.codes[k].end());
        });
        for (int k = 0; k < man.params[j].moments(); ++k) {
            CHECK(all[k].size() == man.params[j].numel * 2);  // vlog: two bytes per code
            hashes[j][std::size_t(k)] = XXH3_64bits(all[k].data(), all[k].size());
        }
    }
    VerifyOptions vo;
    vo.certificates = false;
    vo.code_hashes = &hashes;
    const Report good = verify(ckz, vo);
    CHECK(good.ok);
    hashes[1][1] ^= 1;  // one role of one parameter "encoded" differently
    const Report bad = verify(ckz, vo);
    CHECK(!bad.ok);
    REQUIRE(bad.failures.size() == 1);
    CHECK(bad.failures[0] == man.params[1].name + ": decoded exp_avg_sq codes differ from the encoded ones");
    hashes[1][1] ^= 1;
    hashes.pop_back();  // fewer parameters encoded than the container holds: a failure, not a fallback
    const Report short_list = verify(ckz, vo);
    CHECK(!short_list.ok);
    REQUIRE(short_list.failures.size() == 1);
    CHECK(short_list.failures[0] == "self-check: " + std::to_string(man.params.size() - 1) + " parameters encoded, " +
                                        std::to_string(man.params.size()) + " in the container");
}
