// ContainerWriter -> ContainerReader round trip of a small container in a temp dir: two
// parameters (F32 Adam, BF16 AMSGrad: three roles, so the first gets zero filler), written in
// chunks with escapes across chunk boundaries; read back exactly.
#include <doctest/doctest.h>

#include <unistd.h>
#include <xxhash.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "container/reader.h"
#include "container/values.h"
#include "codec/codec.h"
#include "container/manifest.h"
#include "container/writer.h"

using namespace ckpt;
using namespace ckpt::container;
using ckpt::test::TempDir;

namespace {

ParamEntry param(const std::string& name, uint64_t numel, DType dt, bool amsgrad) {
    ParamEntry p;
    p.name = name;
    p.numel = numel;
    p.shape = {int64_t(numel)};
    p.dtype = dt;
    p.hyper.lr = 1e-3;
    p.hyper.beta1 = 0.9;
    p.hyper.beta2 = 0.999;
    p.hyper.eps = 1e-8;
    p.hyper.step = 100;
    p.hyper.amsgrad = amsgrad;
    return p;
}

/// Moment values exact in BF16 (small integers times powers of two); role 2 >= role 1.
float value(int role, uint64_t i) {
    if (role == 0) return float(int(i % 7) - 3) * 0x1p-10f;
    const float v = float(1 + i % 5) * 0x1p-20f;
    return role == 2 ? 2 * v : v;
}

}  // namespace

TEST_CASE("ContainerWriter -> ContainerReader: raw bytes, streams, offsets and escapes") {
    TempDir dir;
    const std::string path = (dir.path / "t.ckz.h5").string();
    // source: raw storage [0,16), gap [16,20), a.m [20,420), a.v [420,820), b.m/v/vmax 140
    // bytes each from 820, raw storage [1240,1248), gap to 1260
    Manifest m;
    m.tool_version = "test";
    m.source_format = "torch-zip";
    m.source_name = "t.pt";
    m.source_size = 1260;
    m.codec = codec::Kind::Log8;
    m.storages = {{0, 16, 0, -1, -1, {}},    {20, 400, 0, 0, 0, {}},  {420, 400, 0, 0, 1, {}},
                  {820, 140, 0, 1, 0, {}},   {960, 140, 0, 1, 1, {}}, {1100, 140, 0, 1, 2, {}},
                  {1240, 8, 0, -1, -1, {}}};
    m.params = {param("a", 100, DType::F32, false), param("b", 70, DType::BF16, true)};
    m.params[0].storage[0] = 1;
    m.params[0].storage[1] = 2;
    for (int k = 0; k < 3; ++k) m.params[1].storage[k] = 3 + k;
    std::vector<uint8_t> src(m.source_size);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 37 + 5);

    // the escapes each parameter gets (parameter coordinates), bits from the moment values
    const std::vector<uint64_t> forced[2] = {{1, 63, 64, 99}, {0, 69}};
    std::vector<std::vector<float>> vals[2];
    std::vector<std::vector<uint8_t>> codes_written[2];   // per role, the whole parameter
    std::vector<std::vector<int16_t>> params_written[2];
    {
        ContainerWriter w(path);
        const std::vector<SourceSpan> spans = source_spans(m);
        auto put_raw = [&](std::size_t a, std::size_t b) {  // spans [a, b) that are not moments
            for (std::size_t i = a; i < b && i < spans.size(); ++i) {
                const SourceSpan& sp = spans[i];
                if (sp.moment) continue;
                w.append_raw(src.data() + sp.begin, sp.size());
                if (sp.storage >= 0) m.storages[std::size_t(sp.storage)].xxh3 = XXH3_64bits(src.data() + sp.begin, sp.size());
            }
        };
        // /raw grows before the moment streams exist, between them and after the parameters
        // (compress appends a theta storage while it encodes the parameter)
        put_raw(0, 1);
        w.begin_moments(m);
        put_raw(1, 3);
        for (int j = 0; j < 2; ++j) {
            ParamEntry& e = m.params[std::size_t(j)];
            const int nm = e.moments();
            w.begin_param(e);
            vals[j].assign(std::size_t(nm), {});
            codes_written[j].assign(std::size_t(nm), {});
            params_written[j].assign(std::size_t(nm), {});
            for (int k = 0; k < nm; ++k)
                for (uint64_t i = 0; i < e.numel; ++i) vals[j][std::size_t(k)].push_back(value(k, i));
            const codec::TensorSetup setup = tensor_setup(e, m.codec, m.tolerance);
            for (uint64_t i0 = 0; i0 < e.numel; i0 += 64) {   // chunks of one block
                const std::size_t n = std::size_t(std::min<uint64_t>(64, e.numel - i0));
                codec::ChunkIn ci;
                ci.n = n;
                ci.m = vals[j][0].data() + i0;
                ci.v = vals[j][1].data() + i0;
                ci.vmax = nm == 3 ? vals[j][2].data() + i0 : nullptr;
                codec::ChunkOut co = codec::encode_chunk(setup, ci);
                co.escapes.clear();   // exactly the forced ones
                for (uint64_t g : forced[j])
                    if (g >= i0 && g < i0 + n) co.escapes.push_back(uint32_t(g - i0));
                co.max_bound = 0.001 * double(j + 1) + double(i0) * 1e-6;
                std::array<std::vector<uint32_t>, 3> bits;
                for (int k = 0; k < nm; ++k) {
                    auto& cw = codes_written[j][std::size_t(k)];
                    auto& pw = params_written[j][std::size_t(k)];
                    cw.insert(cw.end(), co.codes[k].begin(), co.codes[k].end());
                    pw.insert(pw.end(), co.params[k].begin(), co.params[k].end());
                    std::vector<uint8_t> b(n * float_dtype_size(e.dtype));
                    float_to_bytes(e.dtype, vals[j][std::size_t(k)].data() + i0, n, b.data());
                    for (uint32_t q : co.escapes) bits[std::size_t(k)].push_back(element_bits(e.dtype, b.data(), q));
                }
                w.append_chunk(i0, co, bits);
            }
            if (j == 0) put_raw(3, 5);
        }
        put_raw(5, spans.size());
        CHECK(w.end_raw() > 0);
        CHECK_THROWS_AS(w.append_raw(src.data(), 1), std::logic_error);
        w.finish(m);
    }
    // offsets, escapes and bounds filled in by the writer
    CHECK(m.params[0].code_offset == 0);
    CHECK(m.params[0].block_offset == 0);
    CHECK(m.params[0].escape_offset == 0);
    CHECK(m.params[0].escapes == 4);
    CHECK(m.params[0].max_bound == doctest::Approx(0.001 + 64e-6).epsilon(1e-12));
    CHECK(m.params[1].code_offset == 100);
    CHECK(m.params[1].block_offset == 2);
    CHECK(m.params[1].escape_offset == 4);
    CHECK(m.params[1].escapes == 2);

    const ContainerReader cr(path);
    CHECK(cr.manifest().to_json() == m.to_json());
    CHECK(cr.damaged_datasets().empty());
    {  // the writer's own manifest is taken when the stored text hashes to what it wrote; any other is parsed
        const Handle g = open_file(path);
        const std::string text = m.to_json();
        const uint64_t h = XXH3_64bits(text.data(), text.size());
        Manifest other = m;
        other.source_name = "other.pt";
        CHECK(read_manifest(g.get(), &other, h).source_name == "other.pt");  // taken
        CHECK(read_manifest(g.get(), &other, h ^ 1).to_json() == text);      // parsed
        CHECK(read_manifest(g.get(), &m, h).to_json() == text);
        Manifest bad = m;  // taken, but still validated
        bad.params[0].escapes += 1;
        CHECK_THROWS_WITH_AS(read_manifest(g.get(), &bad, h), doctest::Contains("stream offsets"), std::runtime_error);
    }
    // /raw: every non-moment byte, by source offset
    for (const SourceSpan& sp : source_spans(m)) {
        if (sp.moment) continue;
        std::vector<uint8_t> got;
        cr.for_each_raw_piece(sp.begin, sp.end, [&](uint64_t off, const uint8_t* p, std::size_t n) {
            CHECK(off == sp.begin + got.size());
            got.insert(got.end(), p, p + n);
        });
        CHECK(got == std::vector<uint8_t>(src.begin() + long(sp.begin), src.begin() + long(sp.end)));
    }
    // one pass over /raw: the source with the moment storages as holes, /raw's checksum and
    // the two kept tensors' hashes
    {
        std::vector<uint8_t> scanned, want = src;
        const auto scan = cr.scan_source([&](const uint8_t* p, std::size_t n) { scanned.insert(scanned.end(), p, p + n); },
                                         [&](uint64_t n) { scanned.resize(scanned.size() + n, 0); });
        for (const SourceSpan& sp : source_spans(m))
            if (sp.moment) std::fill(want.begin() + long(sp.begin), want.begin() + long(sp.end), 0);
        CHECK(scanned == want);
        CHECK(scan.raw_read);
        CHECK(scan.raw_ok);
        CHECK(scan.tensors == 2);
        CHECK(scan.bad_tensors == 0);
        CHECK(scan.first_bad == -1);
    }
    // the streams: codes as written, zero codes in role 2 for "a", delta-coded escape index
    const Handle f = open_file(path);
    const DatasetReader c2(f.get(), codes_path(2), H5T_NATIVE_UINT8, 1);
    REQUIRE(c2.count() == 170);
    std::vector<uint8_t> role2(170);
    c2.read(0, 170, role2.data());
    CHECK(std::vector<uint8_t>(role2.begin(), role2.begin() + 100) == std::vector<uint8_t>(100, 0));
    CHECK(std::vector<uint8_t>(role2.begin() + 100, role2.end()) == codes_written[1][2]);
    const DatasetReader c0(f.get(), codes_path(0), H5T_NATIVE_UINT8, 1);
    std::vector<uint8_t> role0(170);
    c0.read(0, 170, role0.data());
    CHECK(std::vector<uint8_t>(role0.begin(), role0.begin() + 100) == codes_written[0][0]);
    const DatasetReader idx(f.get(), kEscapeIndex, H5T_NATIVE_UINT64, 8);
    REQUIRE(idx.count() == 6);
    std::vector<uint64_t> deltas(6);
    idx.read(0, 6, deltas.data());
    CHECK(deltas == std::vector<uint64_t>{1, 62, 1, 35, 0, 69});
    const DatasetReader e2(f.get(), escapes_path(2), H5T_NATIVE_UINT32, 4);
    std::vector<uint32_t> ebits(6);
    e2.read(0, 6, ebits.data());
    CHECK(ebits[0] == 0);   // "a" has no role 2
    CHECK(ebits[3] == 0);
    uint8_t tmp[2];
    float_to_bytes(DType::BF16, &vals[1][2][69], 1, tmp);
    CHECK(ebits[5] == element_bits(DType::BF16, tmp, 0));

    // decoding: escaped coordinates exact, the rest what the codec gives for the codes
    for (std::size_t j = 0; j < 2; ++j) {
        const ParamEntry& e = m.params[j];
        std::vector<uint32_t> escaped;
        cr.for_each_chunk(j, 1 << 20, ContainerReader::Want::Values, [&](const ContainerReader::Chunk& c) {
            CHECK(c.begin == 0);
            REQUIRE(c.n == e.numel);
            escaped = c.escaped;
            std::array<const uint8_t*, 3> cp{};
            std::array<const int16_t*, 3> pp{};
            std::array<std::vector<float>, 3> dec;
            std::array<float*, 3> out{};
            for (std::size_t k = 0; k < std::size_t(e.moments()); ++k) {
                cp[k] = codes_written[j][k].data();
                pp[k] = params_written[j][k].data();
                dec[k].resize(c.n);
                out[k] = dec[k].data();
            }
            codec::decode_chunk(tensor_setup(e, m.codec, m.tolerance), cp, pp, c.n, out, nullptr, nullptr);
            std::vector<char> esc(c.n, 0);
            for (uint32_t q : c.escaped) esc[q] = 1;
            for (std::size_t k = 0; k < std::size_t(e.moments()); ++k) {
                uint64_t exact = 0, decoded = 0;
                for (std::size_t i = 0; i < c.n; ++i) {
                    if (esc[i]) exact += c.values[k][i] == vals[j][k][i];
                    else decoded += c.values[k][i] == dec[k][i];
                }
                CHECK(exact == forced[j].size());
                CHECK(decoded == c.n - forced[j].size());
            }
        });
        CHECK(std::vector<uint64_t>(escaped.begin(), escaped.end()) == forced[j]);
    }
    // one byte accounting: the stored moment bytes are the roles' and the shared ones
    // (ckpt/report.h tensor_rows shares them among the parameters: test_ckpt)
    CHECK(cr.moment_bytes() == cr.role_bytes(0) + cr.role_bytes(1) + cr.role_bytes(2) + cr.shared_bytes());
    CHECK(cr.coded_bytes(0) == 0);   // no entropy coding in this container's codec
}
