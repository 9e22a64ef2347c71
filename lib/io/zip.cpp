#include "io/zip.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include "common/error.h"

namespace ckpt::io {
namespace {

constexpr uint32_t kEocdSig = 0x06054b50;
constexpr uint32_t kZ64LocSig = 0x07064b50;
constexpr uint32_t kZ64EocdSig = 0x06064b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kDescriptorSig = 0x08074b50;
constexpr uint64_t kEocdSize = 22, kZ64LocSize = 20, kZ64EocdSize = 56;
constexpr uint64_t kCentralSize = 46, kLocalSize = 30;

uint32_t le32(const uint8_t* p) {
    return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}
uint16_t le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint64_t le64(const uint8_t* p) { return uint64_t(le32(p)) | (uint64_t(le32(p + 4)) << 32); }

/// Offset of the end-of-central-directory record whose comment ends exactly at end of file.
std::optional<uint64_t> find_eocd(const InputFile& f) {
    if (f.size() < kEocdSize) return std::nullopt;
    uint64_t tail = std::min<uint64_t>(f.size(), 0xFFFF + kEocdSize);
    uint64_t base = f.size() - tail;
    std::string buf = f.read_string(base, tail, "zip end record");
    auto* p = reinterpret_cast<const uint8_t*>(buf.data());
    for (uint64_t i = tail - kEocdSize + 1; i-- > 0;) {
        if (le32(p + i) == kEocdSig && i + kEocdSize + le16(p + i + 20) == tail) return base + i;
    }
    return std::nullopt;
}

}  // namespace

const ZipEntry* ZipArchive::find(const std::string& name) const {
    auto it = index.find(name);
    return it == index.end() ? nullptr : &entries[it->second];
}

bool has_zip_eocd(const InputFile& f) { return find_eocd(f).has_value(); }

ZipArchive read_zip(const InputFile& f, const Limits& limits) {
    const std::string& path = f.path();
    auto bad = [&](const std::string& msg) { return BadInput(path, msg); };
    auto eocd_opt = find_eocd(f);
    if (!eocd_opt) throw bad("no zip end-of-central-directory record found (not a zip file or truncated)");
    const uint64_t eocd = *eocd_opt;

    uint8_t e[kEocdSize];
    f.read_at(eocd, e, kEocdSize, "zip end record");
    if (le16(e + 4) != 0 || le16(e + 6) != 0) throw bad("multi-disk zip archives are not supported");
    uint64_t count = le16(e + 10);
    uint64_t cd_size = le32(e + 12);
    uint64_t cd_offset = le32(e + 16);
    uint64_t cd_end_limit = eocd;   // the central directory must end before this absolute offset
    uint64_t start = 0;

    bool z64 = eocd >= kZ64LocSize && f.u32(eocd - kZ64LocSize, "zip64 locator") == kZ64LocSig;
    if (z64) {
        uint64_t loc = eocd - kZ64LocSize;
        uint8_t l[kZ64LocSize];
        f.read_at(loc, l, kZ64LocSize, "zip64 locator");
        uint64_t rel = le64(l + 8);
        uint64_t rec;
        if (loc >= kZ64EocdSize && f.u32(loc - kZ64EocdSize, "zip64 end record") == kZ64EocdSig)
            rec = loc - kZ64EocdSize;   // standard position, directly before the locator
        else if (rel < loc && f.contains(rel, kZ64EocdSize) && f.u32(rel, "zip64 end record") == kZ64EocdSig)
            rec = rel;
        else
            throw bad(fmt::format("zip64 end record offset {} does not point at a zip64 end record", rel));
        if (rec < rel) throw bad(fmt::format("zip64 end record offset {} lies past its position {}", rel, rec));
        start = rec - rel;
        uint8_t r[kZ64EocdSize];
        f.read_at(rec, r, kZ64EocdSize, "zip64 end record");
        if (le32(r + 16) != 0 || le32(r + 20) != 0) throw bad("multi-disk zip archives are not supported");
        count = le64(r + 32);
        cd_size = le64(r + 40);
        cd_offset = le64(r + 48);
        cd_end_limit = rec;
    } else {
        if (cd_size > eocd || cd_offset > eocd - cd_size)
            throw bad(fmt::format("zip central directory (offset {}, {} bytes) runs past its end record at {}",
                                  cd_offset, cd_size, eocd));
        start = eocd - cd_size - cd_offset;
    }
    if (count > limits.max_zip_entries)
        throw bad(fmt::format("zip has {} entries, more than the limit {}", count, limits.max_zip_entries));
    if (cd_offset > cd_end_limit - start || cd_size > cd_end_limit - start - cd_offset)
        throw bad(fmt::format("zip central directory (offset {}, {} bytes) runs past its end record at {}",
                              cd_offset, cd_size, cd_end_limit));
    if (cd_size < count * kCentralSize)
        throw bad(fmt::format("zip central directory of {} bytes cannot hold {} entries", cd_size, count));
    const uint64_t cd_abs = start + cd_offset;

    ZipArchive zip;
    zip.archive_start = start;
    zip.entries.reserve(count);
    // Streamed record by record: memory stays bounded whatever cd_size claims.
    RangeReader cdr(f, cd_abs, cd_abs + cd_size);
    for (uint64_t i = 0; i < count; ++i) {
        const uint64_t rec_abs = cdr.position();
        uint8_t h[kCentralSize];
        if (cdr.remaining() < kCentralSize)
            throw bad(fmt::format("zip central directory record {} at offset {} is malformed", i, rec_abs));
        cdr.read(h, kCentralSize, "zip central directory");
        if (le32(h) != kCentralSig)
            throw bad(fmt::format("zip central directory record {} at offset {} is malformed", i, rec_abs));
        ZipEntry ent;
        ent.flags = le16(h + 8);
        uint16_t method = le16(h + 10);
        ent.crc32 = le32(h + 16);
        uint64_t csize = le32(h + 20), usize = le32(h + 24);
        uint64_t name_len = le16(h + 28), extra_len = le16(h + 30), comment_len = le16(h + 32);
        uint64_t local = le32(h + 42);
        uint32_t disk = le16(h + 34);
        if (cdr.remaining() < name_len + extra_len + comment_len)
            throw bad(fmt::format("zip central directory record {} at offset {} runs past the directory", i, rec_abs));
        ent.name = cdr.string(name_len, "zip central directory");
        const std::string extra = cdr.string(extra_len, "zip central directory");
        cdr.string(comment_len, "zip central directory");
        // ZIP64 extended information: the 0xFFFFFFFF fields follow, in this order.
        const auto* x = reinterpret_cast<const uint8_t*>(extra.data());
        for (uint64_t k = 0; k + 4 <= extra_len;) {
            uint16_t id = le16(x + k), len = le16(x + k + 2);
            if (k + 4 + len > extra_len)
                throw bad(fmt::format("zip entry '{}' has a malformed extra field", ent.name));
            if (id == 0x0001) {
                const uint8_t* d = x + k + 4;
                uint64_t used = 0;
                auto take = [&](uint64_t& v) {
                    if (used + 8 > len) throw bad(fmt::format("zip entry '{}' has a short zip64 extra field", ent.name));
                    v = le64(d + used);
                    used += 8;
                };
                if (usize == 0xFFFFFFFF) take(usize);
                if (csize == 0xFFFFFFFF) take(csize);
                if (local == 0xFFFFFFFF) take(local);
                if (disk == 0xFFFF && used + 4 <= len) disk = le32(d + used);
            }
            k += 4 + len;
        }
        if (disk != 0) throw bad(fmt::format("zip entry '{}' lies on another disk", ent.name));
        if (ent.flags & 1) throw bad(fmt::format("zip entry '{}' is encrypted", ent.name));
        if (method != 0)
            throw bad(fmt::format("zip entry '{}' is compressed (method {}); torch.save writes stored entries only",
                                  ent.name, method));
        if (csize != usize)
            throw bad(fmt::format("zip entry '{}' is stored but its sizes differ ({} vs {})", ent.name, csize, usize));
        if (!zip.index.emplace(ent.name, zip.entries.size()).second) throw bad(fmt::format("zip entry '{}' appears twice", ent.name));
        ent.size = usize;

        // Local header: data starts after its own name and extra field.
        if (local > cd_offset || kLocalSize > cd_offset - local)
            throw bad(fmt::format("zip entry '{}' local header offset {} lies outside the archive", ent.name, local));
        ent.header_offset = start + local;
        uint8_t lh[kLocalSize];
        f.read_at(ent.header_offset, lh, kLocalSize, "zip local header");
        if (le32(lh) != kLocalSig)
            throw bad(fmt::format("zip entry '{}': no local header at offset {}", ent.name, ent.header_offset));
        if (le16(lh + 8) != 0)
            throw bad(fmt::format("zip entry '{}' is compressed in its local header", ent.name));
        uint64_t lname = le16(lh + 26), lextra = le16(lh + 28);
        ent.data_offset = ent.header_offset + kLocalSize + lname + lextra;
        if (ent.data_offset > cd_abs || ent.size > cd_abs - ent.data_offset)
            throw bad(fmt::format("zip entry '{}' data (offset {}, {} bytes) runs into the central directory at {}",
                                  ent.name, ent.data_offset, ent.size, cd_abs));
        if (lname != name_len || f.read_string(ent.header_offset + kLocalSize, lname, "zip local name") != ent.name)
            throw bad(fmt::format("zip entry '{}': local header name differs from the central directory", ent.name));

        if (!(ent.flags & 8)) {
            ent.crc_offsets.push_back(ent.header_offset + 14);
        } else {
            uint64_t d = ent.data_offset + ent.size;
            uint32_t first = f.u32(d, "zip data descriptor");
            bool sig = first == kDescriptorSig &&
                       (ent.crc32 != kDescriptorSig || f.u32(d + 4, "zip data descriptor") == ent.crc32);
            uint64_t at = sig ? d + 4 : d;
            if (!f.contains(at, 4) || at + 4 > cd_abs)
                throw bad(fmt::format("zip entry '{}' data descriptor runs into the central directory", ent.name));
            ent.crc_offsets.push_back(at);
        }
        ent.crc_offsets.push_back(rec_abs + 16);
        zip.entries.push_back(std::move(ent));
    }
    // Entries must not share bytes: each one's data ends before the next local header.
    std::vector<const ZipEntry*> order;
    for (const auto& ent : zip.entries) order.push_back(&ent);
    std::sort(order.begin(), order.end(),
              [](const ZipEntry* a, const ZipEntry* b) { return a->header_offset < b->header_offset; });
    auto end = [](const ZipEntry* e) {   // last byte + 1, including a data descriptor's CRC
        uint64_t data_end = e->data_offset + e->size;
        return (e->flags & 8) ? std::max(data_end, e->crc_offsets.front() + 4) : data_end;
    };
    for (std::size_t i = 1; i < order.size(); ++i)
        if (end(order[i - 1]) > order[i]->header_offset)
            throw bad(fmt::format("zip entries '{}' and '{}' overlap", order[i - 1]->name, order[i]->name));
    return zip;
}

}  // namespace ckpt::io
