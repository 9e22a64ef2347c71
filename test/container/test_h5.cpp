// The HDF5 + zstd layer (lib/container/h5.h, shuffle.h): the byte shuffle against libhdf5's
// definition, and shuffled datasets read by DatasetReader's direct chunk path against what
// libhdf5's own shuffle filter wrote and reads; the chunk buffers' pooled blocks
// (common/chunk_buffer.h).
#include <doctest/doctest.h>

#include <hdf5.h>
#include <zstd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <random>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "common/chunk_buffer.h"
#include "container/h5.h"
#include "container/shuffle.h"
#include "codec/codec.h"

using namespace ckpt::container;
using ckpt::test::TempDir;

namespace {
/// H5Zshuffle.c's definition, written out plainly: byte k of element i to k * n + i, the
/// bytes past the last whole element at the end; unchanged for 1-byte types or n <= 1.
std::vector<unsigned char> reference_shuffle(const std::vector<unsigned char>& in, std::size_t size) {
    const std::size_t n = in.size() / size;
    if (size <= 1 || n <= 1) return in;
    std::vector<unsigned char> out(in.size());
    for (std::size_t i = 0; i < n; ++i)
        for (std::size_t k = 0; k < size; ++k) out[k * n + i] = in[i * size + k];
    for (std::size_t b = n * size; b < in.size(); ++b) out[b] = in[b];
    return out;
}
}  // namespace

TEST_CASE("shuffle_bytes is libhdf5's shuffle, and unshuffle_bytes its inverse") {
    std::mt19937 rng(5);
    for (std::size_t size : {1, 2, 3, 4, 8})
        for (std::size_t nbytes : {0, 1, 3, 4, 5, 7, 8, 9, 63, 64, 65, 1000, 4099}) {
            std::vector<unsigned char> in(nbytes), sh(nbytes), back(nbytes);
            for (auto& b : in) b = (unsigned char)(rng());
            shuffle_bytes(in.data(), sh.data(), nbytes, size);
            CHECK(sh == reference_shuffle(in, size));
            unshuffle_bytes(sh.data(), back.data(), nbytes, size);
            CHECK(back == in);
        }
}

TEST_CASE("shuffled datasets: Appender's bytes back through libhdf5 and through the direct chunk reader") {
    TempDir td;
    const std::string path = (td.path / "s.h5").string();
    std::vector<unsigned char> bytes(3 * 4096 + 4 * 1000 + 3);  // three whole 4 KiB chunks, a partial one
    std::mt19937 rng(6);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = (unsigned char)(i % 4 == 3 ? 0x40 : rng());
    {
        Handle f = create_file(path);
        Appender a(f.get(), "/ours", H5T_STD_U32LE, 4, 4096, 1, true);
        for (std::size_t off = 0; off < bytes.size(); off += 777)
            a.append_bytes(bytes.data() + off, std::min<std::size_t>(777, bytes.size() - off));
        a.finish();
        // the same elements written in one H5Dwrite (4 KiB chunks too)
        const hsize_t n = (bytes.size() + 3) / 4, chunk = 1024, unlimited = H5S_UNLIMITED;
        Handle sp(H5Screate_simple(1, &n, &unlimited), H5Sclose);
        Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
        H5Pset_chunk(dcpl.get(), 1, &chunk);
        H5Pset_shuffle(dcpl.get());
        const unsigned level = 1;
        H5Pset_filter(dcpl.get(), kZstdFilter, H5Z_FLAG_MANDATORY, 1, &level);
        Handle ds(H5Dcreate2(f.get(), "/libhdf5", H5T_STD_U32LE, sp.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), H5Dclose);
        std::vector<unsigned char> padded(n * 4, 0);
        std::copy(bytes.begin(), bytes.end(), padded.begin());
        REQUIRE(H5Dwrite(ds.get(), H5T_STD_U32LE, H5S_ALL, H5S_ALL, H5P_DEFAULT, padded.data()) >= 0);
        const uint64_t count = n;
        set_attr(ds.get(), "count", count);
    }
    Handle f = open_file(path);
    // Appender's, through libhdf5's shuffle filter
    Handle ds(H5Dopen2(f.get(), "/ours", H5P_DEFAULT), H5Dclose);
    std::vector<unsigned char> via_hdf5((bytes.size() + 3) / 4 * 4);
    REQUIRE(H5Dread(ds.get(), H5T_STD_U32LE, H5S_ALL, H5S_ALL, H5P_DEFAULT, via_hdf5.data()) >= 0);
    CHECK(std::vector<unsigned char>(via_hdf5.begin(), via_hdf5.begin() + long(bytes.size())) == bytes);
    CHECK(via_hdf5[bytes.size()] == 0);  // the padding
    // both, through the direct chunk reader (our zstd and unshuffle), at ranges across chunk ends
    for (const char* name : {"/ours", "/libhdf5"}) {
        const DatasetReader r(f.get(), name, H5T_STD_U32LE, 4);
        if (std::string(name) == "/ours") CHECK(r.bytes() == bytes.size());
        for (uint64_t off : {0, 1, 4095, 4096, 8191, 12287}) {
            const uint64_t len = std::min<uint64_t>(5000, bytes.size() - off);
            std::vector<unsigned char> got(len);
            r.read_bytes(off, len, got.data());
            CHECK(std::equal(got.begin(), got.end(), bytes.begin() + long(off)));
        }
    }
}

TEST_CASE("direct chunk writes: the chunks and filter masks libhdf5's pipeline writes, bit for bit") {
    struct Kind { const char* name; hid_t type; std::size_t elem; int level; bool shuffle; ZstdMatch match; };
    const Kind kinds[3] = {{"raw", H5T_STD_U32LE, 4, 1, true, ZstdMatch{8, 7}},  // /raw's
                           {"codes", H5T_NATIVE_UINT8, 1, kZstdStore, false, ZstdMatch{}},  // vlog codes'
                           {"params", H5T_NATIVE_INT16, 2, 3, false, ZstdMatch{}}};
    for (const Kind& k : kinds) {
        CAPTURE(k.name);
        TempDir td;
        const std::string path = (td.path / "d.h5").string();
        // five whole chunks and a partial one; kZstdStore's has over 4 KiB of zero fill, so
        // the pipeline compresses it
        const std::size_t chunk = k.level == kZstdStore ? 16384 : 4096;
        std::vector<unsigned char> bytes(5 * chunk + 1232);
        std::mt19937 rng(8);
        for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = (unsigned char)(i % 4 == 3 ? 0x3f : rng() % 16);
        const char* names[2] = {"/pipeline", "/direct"};
        {
            Handle f = create_file(path);
            struct Off {  // whatever happens, direct writes end off
                ~Off() { set_direct_chunk_writes(false); }
            } off;
            for (int direct = 0; direct < 2; ++direct) {
                set_direct_chunk_writes(direct == 1);
                Appender a(f.get(), names[direct], k.type, k.elem, chunk, k.level, k.shuffle, k.match);
                REQUIRE(a.direct() == (direct == 1));
                for (std::size_t off = 0; off < bytes.size(); off += 1000)
                    a.append_bytes(bytes.data() + off, std::min<std::size_t>(1000, bytes.size() - off));
                a.finish();
            }
        }
        Handle f = open_file(path);
        Handle p(H5Dopen2(f.get(), names[0], H5P_DEFAULT), H5Dclose), d(H5Dopen2(f.get(), names[1], H5P_DEFAULT), H5Dclose);
        const hsize_t per_chunk = chunk / k.elem;
        for (hsize_t c = 0; c < 6; ++c) {
            CAPTURE(c);
            const hsize_t off = c * per_chunk;
            hsize_t np = 0, nd = 0;
            REQUIRE(H5Dget_chunk_storage_size(p.get(), &off, &np) >= 0);
            REQUIRE(H5Dget_chunk_storage_size(d.get(), &off, &nd) >= 0);
            REQUIRE(np == nd);
            REQUIRE(np > 0);
            std::vector<unsigned char> bp(np), bd(nd);
            uint32_t mp = 9, md = 9;
            REQUIRE(H5Dread_chunk(p.get(), H5P_DEFAULT, &off, &mp, bp.data()) >= 0);
            REQUIRE(H5Dread_chunk(d.get(), H5P_DEFAULT, &off, &md, bd.data()) >= 0);
            CHECK(md == mp);
            CHECK(md == (k.level == kZstdStore && c < 5 ? 1u : 0u));  // stored as they are: the zstd bit set
            CHECK(bp == bd);
        }
        const DatasetReader r(f.get(), names[1], k.type, k.elem);  // and the data reads back
        std::vector<unsigned char> got(bytes.size());
        r.read_bytes(0, bytes.size(), got.data());
        CHECK(got == bytes);
        CHECK(r.checksum_ok());
    }
}

TEST_CASE("zstd-only datasets: the direct chunk path reads what libhdf5 reads; another memory type goes through libhdf5") {
    TempDir td;
    const std::string path = (td.path / "z.h5").string();
    std::vector<uint32_t> v(5000);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = uint32_t(i * 2654435761u);  // above INT32_MAX for many
    {
        Handle f = create_file(path);
        Appender a(f.get(), "/z", H5T_NATIVE_UINT32, 4, 4096);  // [zstd], 1024 elements a chunk
        a.append(v.data(), v.size());
        a.finish();
    }
    Handle f = open_file(path);
    const DatasetReader r(f.get(), "/z", H5T_NATIVE_UINT32, 4);
    for (uint64_t off : {0, 1, 1023, 1024, 3000, 4999}) {
        const uint64_t n = std::min<uint64_t>(1500, v.size() - off);
        std::vector<uint32_t> got(n);
        r.read(off, n, got.data());
        CHECK(std::equal(got.begin(), got.end(), v.begin() + long(off)));
    }
    // view: in place inside one chunk (1024 elements), null across a chunk end
    const auto* in = static_cast<const uint32_t*>(r.view(1030, 900));
    REQUIRE(in != nullptr);
    CHECK(std::equal(in, in + 900, v.begin() + 1030));
    CHECK(r.view(1000, 100) == nullptr);
    CHECK(r.view(0, 0) == nullptr);
    CHECK_THROWS_AS(r.view(4990, 11), std::runtime_error);
    CHECK(r.checksum_ok());
    // read as int32: libhdf5 converts (clipping to INT32_MAX), a raw chunk copy would not
    const DatasetReader s(f.get(), "/z", H5T_NATIVE_INT32, 4);
    std::vector<int32_t> got(v.size());
    s.read(0, v.size(), got.data());
    std::vector<int32_t> via_hdf5(v.size());
    Handle ds(H5Dopen2(f.get(), "/z", H5P_DEFAULT), H5Dclose);
    REQUIRE(H5Dread(ds.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, via_hdf5.data()) >= 0);
    CHECK(got == via_hdf5);
    CHECK(got[1] == (v[1] > uint32_t(INT32_MAX) ? INT32_MAX : int32_t(v[1])));
}

TEST_CASE("view_bytes: a shuffled dataset of bytes in place inside one chunk, null across a chunk end, hashed as read") {
    // /raw's layout: 4-byte elements, shuffled, zstd; bytes appended in odd amounts, so the
    // last element is zero-padded and `bytes` is not a multiple of 4
    TempDir td;
    const std::string path = (td.path / "vb.h5").string();
    std::vector<unsigned char> bytes(3 * 4096 + 1234 + 3);
    std::mt19937 rng(11);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = (unsigned char)(i % 4 == 3 ? 0x3f : rng() % 16);
    {
        Handle f = create_file(path);
        struct Off {
            ~Off() { set_direct_chunk_writes(false); }
        } off;
        set_direct_chunk_writes(true);
        Appender a(f.get(), "/raw", H5T_STD_U32LE, 4, 4096, 1, true);  // 1024 elements a chunk
        for (std::size_t o = 0; o < bytes.size(); o += 777) a.append_bytes(bytes.data() + o, std::min<std::size_t>(777, bytes.size() - o));
        a.finish();
    }
    Handle f = open_file(path);
    {  // in order, a piece per call up to each chunk end: every byte, and the checksum holds
        const DatasetReader r(f.get(), "/raw", H5T_STD_U32LE, 4);
        REQUIRE(r.bytes() == bytes.size());
        CHECK(r.bytes_to_chunk_end(0) == 4096);
        CHECK(r.bytes_to_chunk_end(4095) == 1);
        CHECK(r.bytes_to_chunk_end(4097) == 4095);
        std::vector<unsigned char> got;
        for (uint64_t o = 0; o < bytes.size();) {
            const uint64_t n = std::min<uint64_t>({uint64_t(1000), uint64_t(bytes.size() - o), r.bytes_to_chunk_end(o)});
            const auto* p = static_cast<const unsigned char*>(r.view_bytes(o, n));
            REQUIRE(p != nullptr);
            got.insert(got.end(), p, p + n);
            o += n;
        }
        CHECK(got == bytes);
        CHECK(r.checksum_ok());
    }
    const DatasetReader r(f.get(), "/raw", H5T_STD_U32LE, 4);
    CHECK(r.view_bytes(4000, 200) == nullptr);  // across the first chunk end
    CHECK(r.view_bytes(10, 0) == nullptr);
    CHECK_THROWS_AS(r.view_bytes(bytes.size() - 2, 3), std::runtime_error);  // past `bytes`, inside the padding
    const auto* p = static_cast<const unsigned char*>(r.view_bytes(4096 + 5, 3000));
    REQUIRE(p != nullptr);
    CHECK(std::equal(p, p + 3000, bytes.begin() + 4096 + 5));
}

TEST_CASE("kZstdStore datasets: full chunks stored as they are (mask bit set), the zero-filled last one compressed") {
    TempDir td;
    const std::string path = (td.path / "st.h5").string();
    std::vector<unsigned char> v(3 * 65536 + 5000);  // three whole 64 KiB chunks, a partial one
    std::mt19937 rng(7);
    for (auto& b : v) b = (unsigned char)rng();      // incompressible, as entropy-coded codes
    for (std::size_t i = 65536; i < 2 * 65536; ++i) v[i] = 0;  // chunk 1 all zeros: compressed too
    {
        Handle f = create_file(path);
        Appender a(f.get(), "/c", H5T_NATIVE_UINT8, 1, 65536, kZstdStore);
        a.append(v.data(), v.size());
        a.finish();
    }
    Handle f = open_file(path);
    Handle ds(H5Dopen2(f.get(), "/c", H5P_DEFAULT), H5Dclose);
    Handle sp(H5Dget_space(ds.get()), H5Sclose);
    hsize_t nchunks = 0;
    REQUIRE(H5Dget_num_chunks(ds.get(), sp.get(), &nchunks) >= 0);
    REQUIRE(nchunks == 4);
    const unsigned want_mask[4] = {1, 0, 1, 0};  // bit 0: the zstd filter skipped
    const hsize_t most[4] = {65536, 100, 65536, 5000 + 100};  // stored sizes: as is, zstd frames
    for (hsize_t c = 0; c < nchunks; ++c) {
        hsize_t off = 0, size = 0;
        unsigned mask = 9;
        haddr_t addr = 0;
        REQUIRE(H5Dget_chunk_info(ds.get(), sp.get(), c, &off, &mask, &addr, &size) >= 0);
        CHECK(mask == want_mask[c]);
        CHECK(size <= most[c]);
        if (mask) CHECK(size == 65536);
    }
    std::vector<unsigned char> via_hdf5(v.size()), got(v.size());
    REQUIRE(H5Dread(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, via_hdf5.data()) >= 0);
    CHECK(via_hdf5 == v);
    const DatasetReader r(f.get(), "/c", H5T_NATIVE_UINT8, 1);
    r.read(0, v.size(), got.data());
    CHECK(got == v);
    CHECK(r.checksum_ok());
}

TEST_CASE("zstd match parameters: stored after the level, used by the compressor, not needed to read") {
    // float32-like elements (three exponents, random mantissas), shuffled: one 64 KiB
    // chunk, whose stored frame must be exactly ZSTD_compress2's under the same parameters
    TempDir td;
    const std::string path = (td.path / "m.h5").string();
    std::vector<unsigned char> bytes(65536);
    std::mt19937 rng(8);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = (unsigned char)(i % 4 == 3 ? 0x3c + rng() % 3 : rng());
    {
        Handle f = create_file(path);
        for (const auto& [name, match] : {std::pair<const char*, ZstdMatch>{"/plain", {}}, {"/tuned", {8, 7}}}) {
            Appender a(f.get(), name, H5T_STD_U32LE, 4, bytes.size(), 1, true, match);
            a.append_bytes(bytes.data(), bytes.size());
            a.finish();
        }
    }
    std::vector<unsigned char> sh(bytes.size()), frame(ZSTD_compressBound(bytes.size()));
    shuffle_bytes(bytes.data(), sh.data(), bytes.size(), 4);
    Handle f = open_file(path);
    for (const auto& [name, match] : {std::pair<const char*, ZstdMatch>{"/plain", {}}, {"/tuned", {8, 7}}}) {
        CAPTURE(name);
        Handle ds(H5Dopen2(f.get(), name, H5P_DEFAULT), H5Dclose);
        Handle dcpl(H5Dget_create_plist(ds.get()), H5Pclose);
        unsigned flags = 0, cd[4] = {};
        size_t nc = 4;
        REQUIRE(H5Pget_filter2(dcpl.get(), 1, &flags, &nc, cd, 0, nullptr, nullptr) == kZstdFilter);
        if (match.hash_log) CHECK((nc == 3 && cd[0] == 1 && cd[1] == 8 && cd[2] == 7));
        else CHECK((nc == 1 && cd[0] == 1));
        ZSTD_CCtx* c = ZSTD_createCCtx();
        ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 1);
        ZSTD_CCtx_setParameter(c, ZSTD_c_hashLog, match.hash_log);
        ZSTD_CCtx_setParameter(c, ZSTD_c_minMatch, match.min_match);
        const size_t want = ZSTD_compress2(c, frame.data(), frame.size(), sh.data(), sh.size());
        ZSTD_freeCCtx(c);
        REQUIRE(!ZSTD_isError(want));
        const hsize_t off = 0;
        hsize_t stored = 0;
        REQUIRE(H5Dget_chunk_storage_size(ds.get(), &off, &stored) >= 0);
        CHECK(stored == want);
        const DatasetReader r(f.get(), name, H5T_STD_U32LE, 4);
        std::vector<unsigned char> got(bytes.size());
        r.read_bytes(0, got.size(), got.data());
        CHECK(got == bytes);
    }
    // on such data the parameters change the frame, so the exact sizes above tell them
    // apart (here the tuned one is larger: a 3-letter exponent plane is all short matches;
    // real weights' is not, writer.cpp)
    hsize_t sizes[2] = {};
    for (int i = 0; i < 2; ++i) {
        Handle ds(H5Dopen2(f.get(), i ? "/tuned" : "/plain", H5P_DEFAULT), H5Dclose);
        const hsize_t off = 0;
        H5Dget_chunk_storage_size(ds.get(), &off, &sizes[i]);
    }
    CHECK(sizes[1] != sizes[0]);
}

TEST_CASE("byte planes: the leading incompressible planes go into the zstd frame as raw blocks, on both write paths") {
    // 256 KiB chunks of 4-byte elements (64 KiB planes); four datasets: planes 0-2 random
    // and an exponent-like plane 3 (raw, raw, raw, compressed), every plane random (a frame
    // of raw blocks only), a compressible plane 0 (no raw block: zstd's own frame), and
    // /skewed, /mixed with a plane 0 of 7.885 bits a byte (half the byte values 2.3 times
    // as frequent as the other half, as the low bytes of numpy's float32 normals): zstd
    // gains nothing there (checked below), so it is raw too
    struct Case { const char* name; int raw_planes; };
    const Case cases[4] = {{"/mixed", 3}, {"/random", 4}, {"/plain", 0}, {"/skewed", 3}};
    const std::size_t chunk = 1 << 18, plane = chunk / 4;
    TempDir td;
    const std::string path = (td.path / "p.h5").string();
    std::vector<std::vector<unsigned char>> data(4);
    std::mt19937 rng(11);
    for (int c = 0; c < 4; ++c) {
        data[std::size_t(c)].resize(3 * chunk + 5000);
        for (std::size_t i = 0; i < data[std::size_t(c)].size(); ++i) {
            const std::size_t b = i % 4;
            const unsigned r = rng();
            unsigned char x = (unsigned char)(c == 1 || (b < 3 && !(c == 2 && b == 0)) ? r : 0x3c + r % 3);
            if (c == 3 && b == 0) x = (unsigned char)(r % 128 + ((r >> 8) % 1000 < 697 ? 0u : 128u));  // p = 1.394 / 256 or 0.606 / 256
            data[std::size_t(c)][i] = x;
        }
    }
    {
        Handle f = create_file(path);
        struct Off {
            ~Off() { set_direct_chunk_writes(false); }
        } off;
        for (int direct = 0; direct < 2; ++direct) {
            set_direct_chunk_writes(direct == 1);
            for (int c = 0; c < 4; ++c) {
                Appender a(f.get(), std::string(cases[c].name) + (direct ? "_direct" : ""), H5T_STD_U32LE, 4, chunk, 1, true,
                           ZstdMatch{6, 7, 4});
                a.append_bytes(data[std::size_t(c)].data(), data[std::size_t(c)].size());
                a.finish();
            }
        }
    }
    Handle f = open_file(path);
    for (int c = 0; c < 4; ++c) {
        CAPTURE(cases[c].name);
        const auto& bytes = data[std::size_t(c)];
        Handle p(H5Dopen2(f.get(), cases[c].name, H5P_DEFAULT), H5Dclose);
        Handle d(H5Dopen2(f.get(), (std::string(cases[c].name) + "_direct").c_str(), H5P_DEFAULT), H5Dclose);
        const hsize_t off = 0;  // the first, whole chunk
        hsize_t np = 0, nd = 0;
        REQUIRE(H5Dget_chunk_storage_size(p.get(), &off, &np) >= 0);
        REQUIRE(H5Dget_chunk_storage_size(d.get(), &off, &nd) >= 0);
        std::vector<unsigned char> bp(np), bd(nd);
        uint32_t mp = 9, md = 9;
        REQUIRE(H5Dread_chunk(p.get(), H5P_DEFAULT, &off, &mp, bp.data()) >= 0);
        REQUIRE(H5Dread_chunk(d.get(), H5P_DEFAULT, &off, &md, bd.data()) >= 0);
        CHECK(bp == bd);  // the pipeline's filter and the direct writes: the same frame
        // plain libzstd decodes the frame to the shuffled chunk
        std::vector<unsigned char> sh(chunk), out(chunk);
        shuffle_bytes(bytes.data(), sh.data(), chunk, 4);
        REQUIRE(ZSTD_getFrameContentSize(bd.data(), bd.size()) == chunk);
        CHECK(ZSTD_decompress(out.data(), out.size(), bd.data(), bd.size()) == chunk);
        CHECK(out == sh);
        // the frame's leading raw blocks (RFC 8878: 3-byte headers, type in bits 1-2) hold
        // exactly the incompressible planes, byte for byte
        std::size_t at = cases[c].raw_planes ? 9 : 0, raw = 0;
        while (cases[c].raw_planes && at + 3 <= bd.size() && ((bd[at] >> 1) & 3) == 0) {
            const std::size_t len = (bd[at] | bd[at + 1] << 8 | bd[at + 2] << 16) >> 3;
            CHECK(std::memcmp(bd.data() + at + 3, sh.data() + raw, len) == 0);
            raw += len;
            at += 3 + len;
        }
        CHECK(raw == std::size_t(cases[c].raw_planes) * plane);
        if (cases[c].raw_planes == 4) CHECK(bd.size() == 9 + 3 * 2 + chunk);  // two raw blocks of 128 KiB
        auto zstd_own = [](const unsigned char* src, std::size_t n) {  // the filter's settings, no planes
            std::vector<unsigned char> z(ZSTD_compressBound(n));
            ZSTD_CCtx* cc = ZSTD_createCCtx();
            ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, 1);
            ZSTD_CCtx_setParameter(cc, ZSTD_c_hashLog, 6);
            ZSTD_CCtx_setParameter(cc, ZSTD_c_minMatch, 7);
            z.resize(ZSTD_compress2(cc, z.data(), z.size(), src, n));
            ZSTD_freeCCtx(cc);
            return z;
        };
        if (cases[c].raw_planes == 0) CHECK(bd == zstd_own(sh.data(), sh.size()));  // zstd's own frame, as without planes
        if (c == 3) CHECK(zstd_own(sh.data(), plane).size() > plane);  // zstd would have stored the skewed plane raw
        if (cases[c].raw_planes == 3) CHECK(bd.size() < chunk * 7 / 8);  // the exponent plane shrank
        const DatasetReader r(f.get(), (std::string(cases[c].name) + "_direct").c_str(), H5T_STD_U32LE, 4);
        std::vector<unsigned char> got(bytes.size());
        r.read_bytes(0, bytes.size(), got.data());
        CHECK(got == bytes);
        CHECK(r.checksum_ok());
    }
}

TEST_CASE("checksum_ok: reads in order are hashed on the way; the rest, padding included, read once") {
    TempDir td;
    const std::string path = (td.path / "c.h5").string();
    for (std::size_t size : {std::size_t(0), std::size_t(8), std::size_t(4099), std::size_t(9000)}) {
        std::vector<unsigned char> bytes(size);  // 4099, 9000: 3 and 0 bytes of padding, chunks of 4096
        for (std::size_t i = 0; i < size; ++i) bytes[i] = (unsigned char)(i * 7 + 1);
        for (bool shuffled : {true, false}) {  // our direct chunk reader, and libhdf5's pipeline
            {
                Handle f = create_file(path);
                Appender a(f.get(), "/raw", H5T_STD_U32LE, 4, 4096, 1, shuffled);
                a.append_bytes(bytes.data(), bytes.size());
                a.finish();
            }
            std::vector<unsigned char> got(size);
            {
                Handle f = open_file(path);
                // in order, in odd pieces (re-reading some bytes), to the end of the bytes
                const DatasetReader whole(f.get(), "/raw", H5T_STD_U32LE, 4);
                for (std::size_t off = 0; off < size; off += 997)
                    whole.read_bytes(off > 5 ? off - 5 : 0, std::min<std::size_t>(997, size - off) + (off > 5 ? 5 : 0),
                                     got.data() + (off > 5 ? off - 5 : 0));
                CHECK(got == bytes);
                CHECK(whole.checksum_ok());
                // a prefix only, then a gap: both still give the right answer
                const DatasetReader part(f.get(), "/raw", H5T_STD_U32LE, 4), gap(f.get(), "/raw", H5T_STD_U32LE, 4);
                if (size >= 8) {
                    part.read_bytes(0, 3, got.data());
                    gap.read_bytes(4, 4, got.data());
                }
                CHECK(part.checksum_ok());
                CHECK(gap.checksum_ok());
            }
            // a wrong stored checksum is found on every path
            {
                Handle rw(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
                Handle ds(H5Dopen2(rw.get(), "/raw", H5P_DEFAULT), H5Dclose);
                set_attr(ds.get(), "xxh3", get_attr_u64(ds.get(), "xxh3") ^ 1);
            }
            const Handle g = open_file(path);
            const DatasetReader bad(g.get(), "/raw", H5T_STD_U32LE, 4), bad2(g.get(), "/raw", H5T_STD_U32LE, 4);
            if (size) bad.read_bytes(0, size, got.data());
            CHECK_FALSE(bad.checksum_ok());  // hashed as read
            CHECK_FALSE(bad2.checksum_ok());  // read by checksum_ok
        }
    }
}

TEST_CASE("chunk blocks: 2 MiB-aligned, a freed 2 MiB block taken again (newest first), at most kPoolBlocks kept; ChunkBuffer") {
    using ckpt::chunk_block_alloc;
    using ckpt::chunk_block_free;
    using ckpt::kPoolBlocks;
    constexpr std::size_t kMiB = std::size_t(1) << 20;
    std::vector<void*> drained;  // whatever earlier tests left in the pool
    for (std::size_t i = 0; i < kPoolBlocks; ++i) drained.push_back(chunk_block_alloc(kMiB));
    std::vector<void*> blocks;
    for (std::size_t i = 0; i < kPoolBlocks + 3; ++i) {
        blocks.push_back(chunk_block_alloc(i % 2 ? kMiB : 2 * kMiB));  // both round to one 2 MiB block
        CHECK(reinterpret_cast<std::uintptr_t>(blocks.back()) % (2 * kMiB) == 0);
        std::memset(blocks.back(), int(i), 2 * kMiB);  // the whole block is ours
    }
    for (void* b : blocks) chunk_block_free(b, kMiB);  // the first kPoolBlocks are kept, 3 freed
    blocks.resize(kPoolBlocks);
    for (std::size_t i = kPoolBlocks; i-- > 0;) {
        void* b = chunk_block_alloc(kMiB + 1);
        CHECK(b == blocks[i]);
        CHECK(static_cast<unsigned char*>(b)[2 * kMiB - 1] == (unsigned char)(i));  // kept as it was
        chunk_block_free(b, kMiB + 1);
        CHECK(chunk_block_alloc(kMiB) == b);  // and again (held in blocks[i])
    }
    // larger blocks: aligned, never kept
    void* big = chunk_block_alloc(3 * kMiB);
    CHECK(reinterpret_cast<std::uintptr_t>(big) % (2 * kMiB) == 0);
    std::memset(big, 7, 4 * kMiB);
    chunk_block_free(big, 3 * kMiB);
    // ChunkBuffer: below 1 MiB plain memory, from 1 MiB a block; contents kept as it grows
    ckpt::ChunkBuffer v;
    std::vector<unsigned char> want;
    for (int i = 0; i < 3000; ++i) {
        const std::vector<unsigned char> piece(std::size_t(i) % 1500, (unsigned char)(i));
        v.append(piece.data(), piece.size());
        want.insert(want.end(), piece.begin(), piece.end());
    }
    REQUIRE(v.size() == want.size());
    CHECK(v.size() > kMiB);
    CHECK(v.capacity() >= v.size());
    CHECK(std::memcmp(v.data(), want.data(), want.size()) == 0);
    CHECK(reinterpret_cast<std::uintptr_t>(v.data()) % (2 * kMiB) == 0);
    ckpt::ChunkBuffer w(100);
    w.swap(v);
    CHECK(w.size() == want.size());
    CHECK(v.size() == 100);
    v = std::move(w);
    CHECK(v.size() == want.size());
    CHECK(std::memcmp(v.data(), want.data(), want.size()) == 0);
    v.resize(10);
    CHECK(v.data()[9] == want[9]);
    v.clear();
    CHECK(v.empty());
    for (void* b : blocks) chunk_block_free(b, kMiB);
    for (void* b : drained) chunk_block_free(b, kMiB);
}

TEST_CASE("read-ahead: in-order reads decode the next chunks in the worker pool; any order reads the same bytes; a damaged chunk fails only when read") {
    TempDir td;
    const std::string path = (td.path / "ra.h5").string();
    std::vector<unsigned char> bytes(20 * 4096 + 100);  // 20 whole 4 KiB chunks and a partial one
    std::mt19937 rng(7);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = (unsigned char)(i % 4 == 3 ? 0x3f : rng());
    {
        Handle f = create_file(path);
        Appender a(f.get(), "/raw", H5T_STD_U32LE, 4, 4096, 1, true);
        a.append_bytes(bytes.data(), bytes.size());
        a.finish();
    }
    ckpt::codec::set_cpu_threads(4);
    {
        Handle f = open_file(path);
        const DatasetReader r(f.get(), "/raw", H5T_STD_U32LE, 4);
        std::vector<unsigned char> got(bytes.size());
        for (std::size_t off = 0; off < bytes.size(); off += 1000)  // in order, across chunk ends
            r.read_bytes(off, std::min<std::size_t>(1000, bytes.size() - off), got.data() + off);
        CHECK(got == bytes);
        CHECK(r.checksum_ok());  // hashed on the way, in order
    }
    {
        Handle f = open_file(path);
        const DatasetReader r(f.get(), "/raw", H5T_STD_U32LE, 4);
        for (uint64_t c : {15, 3, 4, 5, 6, 20, 0, 1, 12, 13}) {  // jumps, then runs in order
            const uint64_t off = c * 4096, len = std::min<uint64_t>(4096, bytes.size() - off);
            std::vector<unsigned char> got(len);
            r.read_bytes(off, len, got.data());
            CHECK(std::equal(got.begin(), got.end(), bytes.begin() + long(off)));
        }
    }
    {  // chunk 5's stored bytes damaged: chunks 0-4 read in order (5 is decoded ahead), 5 fails
        Handle f(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
        Handle ds(H5Dopen2(f.get(), "/raw", H5P_DEFAULT), H5Dclose);
        const hsize_t off = 5 * 1024;
        hsize_t size = 0;
        REQUIRE(H5Dget_chunk_storage_size(ds.get(), &off, &size) >= 0);
        std::vector<unsigned char> junk(size, 0xAB);
        REQUIRE(H5Dwrite_chunk(ds.get(), H5P_DEFAULT, 0, &off, size, junk.data()) >= 0);
    }
    Handle f = open_file(path);
    const DatasetReader r(f.get(), "/raw", H5T_STD_U32LE, 4);
    std::vector<unsigned char> got(5 * 4096);
    r.read_bytes(0, got.size(), got.data());
    CHECK(std::equal(got.begin(), got.end(), bytes.begin()));
    CHECK_THROWS_WITH(r.read_bytes(5 * 4096, 10, got.data()), doctest::Contains("cannot be read (damaged chunk?)"));
    ckpt::codec::set_cpu_threads(0);
}

TEST_CASE("stage_bytes then settle: the same file, byte for byte, as append_bytes at the same points") {
    // /raw's kind; pieces of 1000 bytes (several per 4 KiB chunk), one of 25 chunks (three
    // batches queued at once), each followed by an append to a second dataset, as compress
    // appends a chunk's codes after its theta bytes
    TempDir td;
    std::vector<unsigned char> bytes(40 * 4096 + 1232), other(3000);
    std::mt19937 rng(9);
    for (auto& b : bytes) b = (unsigned char)(rng() % 16);
    for (auto& b : other) b = (unsigned char)(rng() % 7);
    std::vector<std::size_t> cuts;
    for (std::size_t off = 0; off < bytes.size(); off += off == 8000 ? 25 * 4096 : 1000) cuts.push_back(off);
    cuts.push_back(bytes.size());
    std::string files[2];
    struct Off {
        ~Off() { set_direct_chunk_writes(false); }
    } off;
    set_direct_chunk_writes(true);
    for (int staged = 0; staged < 2; ++staged) {
        files[staged] = (td.path / (staged ? "s.h5" : "a.h5")).string();
        Handle f = create_file(files[staged]);
        Appender a(f.get(), "/raw", H5T_STD_U32LE, 4, 4096, 1, true, ZstdMatch{8, 7});
        Appender b(f.get(), "/codes", H5T_NATIVE_UINT8, 1, 4096, 3);
        REQUIRE(a.direct());
        for (std::size_t i = 0; i + 1 < cuts.size(); ++i) {
            const std::size_t n = std::min(cuts[i + 1], bytes.size()) - cuts[i];
            if (staged) {
                a.stage_bytes(bytes.data() + cuts[i], n);
                a.settle();
            } else {
                a.append_bytes(bytes.data() + cuts[i], n);
            }
            b.append(other.data(), 1 + i * 37 % other.size());
        }
        a.finish();
        b.finish();
    }
    std::vector<unsigned char> x, y;
    for (int k = 0; k < 2; ++k) {
        FILE* fp = std::fopen(files[k].c_str(), "rb");
        REQUIRE(fp);
        std::vector<unsigned char>& v = k ? y : x;
        unsigned char buf[65536];
        for (std::size_t got; (got = std::fread(buf, 1, sizeof buf, fp)) > 0;) v.insert(v.end(), buf, buf + got);
        std::fclose(fp);
    }
    CHECK(x.size() > bytes.size() / 4);
    CHECK(x == y);
    Handle f = open_file(files[1]);
    const DatasetReader r(f.get(), "/raw", H5T_STD_U32LE, 4);
    std::vector<unsigned char> got(bytes.size());
    r.read_bytes(0, bytes.size(), got.data());
    CHECK(got == bytes);
    CHECK(r.checksum_ok());
    set_direct_chunk_writes(false);  // a dataset written through the pipeline refuses to stage
    Handle g = create_file((td.path / "p.h5").string());
    Appender p(g.get(), "/raw", H5T_STD_U32LE, 4, 4096, 1, true, ZstdMatch{8, 7});
    CHECK_THROWS_AS(p.stage_bytes(bytes.data(), 10), std::logic_error);
}
